"""Keeps a long CPU run under the kernel's limit on memory mappings.

XLA:CPU maps each compiled program's machine code into many small memory mappings (the tiny
preset's prefill and decode for one batch shape: ~500). A long run that compiles many shapes
(sampler batch, prompt and cache buckets, compacted batches, shared-prefix plans, learner
lengths) reaches the kernel's `vm.max_map_count` (65,530 by default), and the next compile fails
("LLVM compilation error: Cannot allocate memory", then a segmentation fault): the default
experiment did at RL step 85. `trim` drops JAX's compiled programs once the process holds a share
of that limit; the programs still in use compile again at their next call (seconds to a minute on
this CPU; from the disk cache, `use_disk_cache`, a fraction of that). Accelerator backends keep
their programs in device memory and are not affected.
"""

from __future__ import annotations

import gc
import hashlib
import os
import platform

import jax

from skilljax import console

MAPS, LIMIT = "/proc/self/maps", "/proc/sys/vm/max_map_count"


def use_disk_cache(directory: str, min_compile_s: float = 0.5) -> None:
    """Keep compiled programs in `directory` (JAX's persistent compilation cache; "" = off): a
    later run, or this one after `trim`, loads the programs it compiled instead of compiling
    them again (the tiny preset's sampler: 3.9 s to compile, 0.6 s to load)."""
    if not directory:
        return
    # One folder per JAX version and host CPU: a home directory shared by machines of other CPUs
    # (a cluster's) must not hand one machine another's machine code.
    path = os.path.join(os.path.expanduser(directory), f"jax{jax.__version__}-{_host_id()}")
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_s)


def _host_id() -> str:
    """A short hash of the CPU's model and instruction-set flags."""
    text = platform.machine() + platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            text += "".join(sorted({line for line in f if line.startswith(("flags", "model name"))}))
    except OSError:
        pass
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def map_count(path: str = MAPS) -> int | None:
    """This process's memory mappings (None where /proc is not there)."""
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def map_limit(path: str = LIMIT) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def trim(share: float = 0.6, *, count: int | None = None, limit: int | None = None) -> bool:
    """Drop every compiled program when this process's mappings exceed `share` of the kernel's
    limit (CPU backend only); whether it did. Call it where no other thread is compiling or
    dispatching (between RL steps with no rollout running ahead)."""
    if jax.default_backend() != "cpu":
        return False
    count = map_count() if count is None else count
    limit = map_limit() if limit is None else limit
    if count is None or limit is None or count < share * limit:
        return False
    jax.clear_caches()
    gc.collect()
    console.info(f"dropped the compiled programs: the process held {count:,} memory mappings of "
                 f"the {limit:,} the kernel allows (vm.max_map_count); the ones in use compile "
                 "again at their next call")
    return True
