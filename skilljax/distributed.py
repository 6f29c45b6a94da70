"""Multi-process runs: one process per host (TPU pod slices, multi-node GPU), started alike.

Every process runs the same host loop. Rollouts are split: each process plays its share of the
task groups in its own env pool (a group never spans processes): in training, groups p, p + P, ...
of every step (`skilljax.rl.task_stream`); in validation and evaluation, a contiguous block of the
tasks (`shard`). Generation is one collective call per turn: the processes' prompts are gathered
and sampled as one global batch on the global mesh, each process keeps its own rows. Results that the host
logic needs whole (trajectories for metrics and curriculum, step samples for the learner batch) are
all-gathered as Python objects (`allgather_objects`), so advantages, the curriculum, ReuseRL's
dictionary and the learner's mini-batches are identical on every process and identical to a
one-process run with the same seed. A learner mini-batch is placed from each process's own rows
(`put_rows`, `jax.make_array_from_process_local_data`). Files (metrics, summary, plots, tokenizer,
warm-start cache) are written by process 0; orbax checkpoints are written by all processes
together, as orbax requires. `check_same` compares a value (the step, batch shapes) across
processes and raises when they differ, instead of letting mismatched collectives hang.

Started by `launch/tpu.sh` / `launch/gpu.sh` through environment variables:

- `SKILLJAX_DISTRIBUTED=auto`: `jax.distributed.initialize()` discovers the cluster itself
  (Cloud TPU pod slices, SLURM);
- or `SKILLJAX_COORDINATOR=host:port`, `SKILLJAX_NUM_PROCESSES=N`, `SKILLJAX_PROCESS_ID=i`
  (any cluster, and CPU processes on one machine for tests, which then use gloo collectives).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence

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


def count() -> int:
    return jax.process_count()


def index() -> int:
    return jax.process_index()


def shard(n: int) -> range:
    """This process's contiguous share of `n` items (task groups): process p of P gets
    range(n * p // P, n * (p + 1) // P), so the shares cover 0..n-1 in process order."""
    p, k = index(), count()
    return range(n * p // k, n * (p + 1) // k)


def allgather_objects(obj) -> list:
    """[obj of process 0, obj of process 1, ...] on every process (pickled, padded to the longest,
    gathered as bytes); [obj] for one process."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils
    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int64)))
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[:data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(buf[None], tiled=True))
    return [pickle.loads(gathered[i, :int(sizes.reshape(-1)[i])].tobytes())
            for i in range(len(gathered))]


def check_same(name: str, value) -> None:
    """Raise on every process when `value` (a step number, batch shapes) differs between processes:
    the processes have drifted apart, and the next collective would hang or mix data."""
    if jax.process_count() == 1:
        return
    values = allgather_objects(value)
    if any(v != values[0] for v in values):
        raise RuntimeError(
            f"Processes disagree on {name}: " + ", ".join(f"process {i}: {v!r}"
                                                          for i, v in enumerate(values))
            + ". The run's processes are out of step (an env worker that timed out or crashed on "
            "one host, or different configs); restart all processes from the last checkpoint.")


def put_rows(host: np.ndarray, sharding) -> jax.Array:
    """A global host array (the same on every process) onto `sharding`, each process supplying
    only the rows (axis 0) its own devices hold (`jax.make_array_from_process_local_data`)."""
    if jax.process_count() == 1:
        return jax.device_put(host, sharding)
    spans = sorted({(idx[0].start or 0, host.shape[0] if idx[0].stop is None else idx[0].stop)
                    for idx in sharding.addressable_devices_indices_map(host.shape).values()})
    local = np.concatenate([host[a:b] for a, b in spans]) if len(spans) > 1 else host[
        spans[0][0]:spans[0][1]]
    return jax.make_array_from_process_local_data(sharding, local, host.shape)


def any_process(flag: bool) -> bool:
    """True when `flag` holds on at least one process."""
    return any(allgather_objects(bool(flag)))


def concat(parts: Sequence[list]) -> list:
    return [x for part in parts for x in part]
