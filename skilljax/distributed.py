"""Multi-process runs: one process per host (TPU pod slices, multi-node GPU), started alike.

Every process runs the same host loop with the same seeds: it builds the same tokenizer, plays the
same environment episodes in its own env pool and feeds identical host arrays to the jitted
sampler and learner, which place them on the global mesh (each process supplies its devices'
shards). So no host data is exchanged; only parameters and activations are sharded across hosts.
Files (metrics, summary, plots, tokenizer, warm-start cache) are written by process 0; orbax
checkpoints are written by all processes together, as orbax requires.

Started by `launch/tpu.sh` / `launch/gpu.sh` through environment variables:

- `SKILLJAX_DISTRIBUTED=auto`: `jax.distributed.initialize()` discovers the cluster itself
  (Cloud TPU pod slices, SLURM);
- or `SKILLJAX_COORDINATOR=host:port`, `SKILLJAX_NUM_PROCESSES=N`, `SKILLJAX_PROCESS_ID=i`
  (any cluster, and CPU processes on one machine for tests, which then use gloo collectives).
"""

from __future__ import annotations

import os

import jax
import numpy as np

_active = False


def initialize_from_env() -> bool:
    """Join the process group the environment describes; False (and nothing done) for one process."""
    global _active
    if _active:
        return True
    coordinator = os.environ.get("SKILLJAX_COORDINATOR")
    mode = os.environ.get("SKILLJAX_DISTRIBUTED", "")
    if not coordinator and mode.lower() not in ("auto", "1", "true"):
        return False
    if coordinator:
        missing = [k for k in ("SKILLJAX_NUM_PROCESSES", "SKILLJAX_PROCESS_ID") if k not in os.environ]
        if missing:
            raise ValueError(f"SKILLJAX_COORDINATOR is set but {', '.join(missing)} is not: set "
                             "all three, or SKILLJAX_DISTRIBUTED=auto on a managed cluster.")
        if os.environ.get("JAX_PLATFORMS", "").startswith("cpu"):
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=coordinator,
                                   num_processes=int(os.environ["SKILLJAX_NUM_PROCESSES"]),
                                   process_id=int(os.environ["SKILLJAX_PROCESS_ID"]))
    else:
        jax.distributed.initialize()
    _active = True
    return True


def active() -> bool:
    return _active


def is_main() -> bool:
    """Whether this process writes the run's files (always true for a single process)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches this point (a no-op for one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def to_host(x) -> np.ndarray:
    """The full value of an array on every host, also when its shards live on other processes."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
