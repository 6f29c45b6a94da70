"""Text environments (run in env worker processes; no JAX imports here)."""
