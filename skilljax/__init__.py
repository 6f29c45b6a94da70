"""skilljax: JAX/Flax reinforcement learning for LLM agents with skills."""

__version__ = "0.1.0"
