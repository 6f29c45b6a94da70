"""Skills on the host: the skill bank (markdown files + mapping), the SKILL0 curriculum, and later
segmentation, evolution and chains. Pure Python (no JAX), so env workers and tools can import it.
"""
