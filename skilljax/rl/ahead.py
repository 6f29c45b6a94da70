"""Asynchronous rollouts (`rl.max_staleness`): the rollouts of the next RL steps run in a worker
thread while the learner updates on the current one.

At step k, once k's rollout is in hand, the trainer starts the rollouts of steps k+1 ...
k+max_staleness that are not started yet (`RolloutsAhead.plan`), each on a snapshot of the weights
taken then, before k's update (`Sampler.snapshot`). Rollout j is therefore trained on at step j by
weights at most max_staleness updates newer than those it was sampled from (its `staleness`). Its
samples keep the sampler's logprobs as the behaviour policy; the learner recomputes the old policy's
and weights each token by min(π_old / π_behaviour, cap) (`rl.behaviour_is_cap`, required here).

A rollout never starts across a *sync point*: a step after which the host changes what the next
rollout sees or what a checkpoint holds (a curriculum validation, an evolution step, a checkpoint,
the last step). The trainer takes every started rollout before such a step ends, so validation and
evaluation (which use the same sampler and env workers) never run beside a rollout, the task
stream in a checkpoint is where the next rollout starts, and a resumed run draws what an
uninterrupted one would. The worker runs one rollout at a time, in step order.

What overlaps: the learner's device work with the rollout's env steps, prompt building and
sampler dispatch on the host, and, where the device can run two programs at once (the CPU's
cores; separate devices), with sampling itself. The price is device memory for one more copy of
the weights per started rollout (the snapshot, in the compute dtype) and a KV cache beside the
learner's activations. One process only: a multi-process run gathers rollouts and samples with
collectives, whose order the two threads could not keep the same on every process.
"""

from __future__ import annotations

import time
from concurrent import futures
from typing import Any, Callable

from skilljax.sampling import PinnedSampler, Sampler


class RolloutsAhead:
    """Rollouts started ahead of their step (module doc). `submit(j, fn)` runs `fn(sampler)` in
    the worker, with the sampler pinned to the weights of now; `take(j)` waits for it."""

    def __init__(self, sampler: Sampler, max_staleness: int):
        if max_staleness < 1:
            raise ValueError(f"max_staleness must be >= 1 to run rollouts ahead, got "
                             f"{max_staleness} (0 is the synchronous loop).")
        self.sampler, self.max_staleness = sampler, max_staleness
        self._worker = futures.ThreadPoolExecutor(1, thread_name_prefix="skilljax-rollout")
        self._pending: dict[int, tuple[futures.Future, int]] = {}
        self._last = 0  # the last step started

    def plan(self, step: int, last_step: int, sync: Callable[[int], bool]) -> list[int]:
        """Steps to start after `step`'s rollout: j in step+1 ... step+max_staleness (at most
        `last_step`) not started yet, with no sync point among steps step ... j-1."""
        out = []
        for j in range(step + 1, min(step + self.max_staleness, last_step) + 1):
            if sync(j - 1):
                break
            if j > self._last:
                out.append(j)
        return out

    def submit(self, step: int, fn: Callable[[PinnedSampler], Any], now: int) -> None:
        """Start step `step`'s rollout `fn(sampler)` during step `now` (before its update)."""
        if step in self._pending or step <= self._last:
            raise ValueError(f"The rollout of step {step} was started already.")
        pinned = self.sampler.snapshot()  # dispatched before this step's update donates weights
        self._pending[step] = (self._worker.submit(_timed, fn, pinned), now)
        self._last = step

    @property
    def busy(self) -> bool:
        """Whether a started rollout has not been taken yet."""
        return bool(self._pending)

    def __contains__(self, step: int) -> bool:
        return step in self._pending

    def take(self, step: int) -> tuple[Any, dict[str, float]]:
        """Step `step`'s rollout (its exception, if it raised) and its timing: `rollout_s` (its
        own time in the worker), `rollout_wait_s` (how long this call waited for it: the part of
        it nothing overlapped) and `staleness` (updates between its weights and step `step`'s)."""
        future, started = self._pending.pop(step)
        t0 = time.time()
        result, seconds = future.result()
        return result, {"rollout_s": seconds, "rollout_wait_s": time.time() - t0,
                        "staleness": float(step - started)}

    def close(self) -> None:
        """Drop rollouts not begun; wait for the one running (a thread cannot be stopped)."""
        self._worker.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()


def _timed(fn, sampler):
    t0 = time.time()
    return fn(sampler), time.time() - t0
