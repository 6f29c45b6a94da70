"""App environments: agents write Python against app APIs, run in a sandbox (no JAX here)."""
