"""The RL task stream: which task groups each process plays at each step, through grain.

One global stream over the training tasks: epochs of a seeded shuffle (reshuffled each epoch),
each element a (task index, env seed) pair whose seed grain derives from the element's position
(`random_map`). Step s takes the stream's elements [s·n, (s+1)·n) for n = `rl.tasks_per_step`;
element j of a step is task group j. Process p of P reads the groups p, p + P, p + 2P, ... of every
step (`ds[p::P]` batched by n / P), so the shares partition each step's groups whatever P is and
the same seed gives the same tasks, env seeds and group ids on 1 or N processes. (A step that
straddles two epochs may play a task twice, as two groups with their own env seeds.)

The iterator's state (grain's `get_state()`, the next step to read) is saved in every checkpoint
(`RunState.task_stream`) and restored on resume, so a resumed run reads the tasks an uninterrupted
one would.
"""

from __future__ import annotations

import dataclasses

import grain
import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class StepTasks:
    """This process's share of one step's task groups."""
    tasks: list[int]    # indices into the training tasks
    seeds: list[int]    # env seed per task
    groups: list[int]   # global group id (position in the step's global batch) per task


class TaskStream:
    def __init__(self, num_tasks: int, tasks_per_step: int, seed: int, *,
                 process_index: int | None = None, process_count: int | None = None):
        p = jax.process_index() if process_index is None else process_index
        k = jax.process_count() if process_count is None else process_count
        if num_tasks < tasks_per_step:
            raise ValueError(f"rl.tasks_per_step={tasks_per_step} exceeds the {num_tasks} "
                             "training tasks (env.train_tasks); a step plays distinct tasks.")
        if tasks_per_step % k:
            raise ValueError(
                f"rl.tasks_per_step={tasks_per_step} task groups cannot be split evenly over {k} "
                f"processes (a group never spans processes); use a multiple of {k}.")
        self.process_index, self.process_count = p, k
        self.per_process = tasks_per_step // k
        # grain reshuffles epoch e with seed + e: hashed seeds keep run seeds s and s + 1 from
        # sharing task orders one epoch apart.
        shuffle_seed, env_seed = (int(x) for x in np.random.SeedSequence(
            [seed, 0x7A5C]).generate_state(2) >> 1)
        stream = (grain.MapDataset.range(num_tasks).shuffle(seed=shuffle_seed).repeat()
                  .random_map(_with_env_seed, seed=env_seed))
        self._iter = iter(stream[p::k].batch(self.per_process).to_iter_dataset())

    def __next__(self) -> StepTasks:
        tasks, seeds = next(self._iter)
        # Local element j of a step is the global stream's element p + P·j of that step.
        return StepTasks([int(t) for t in tasks], [int(s) for s in seeds],
                         [self.process_index + self.process_count * j for j in range(len(tasks))])

    def __iter__(self):
        return self

    def get_state(self) -> dict:
        return dict(self._iter.get_state())

    def set_state(self, state: dict) -> None:
        self._iter.set_state(dict(state))


def _with_env_seed(index, rng: np.random.Generator):
    return index, rng.integers(0, 2**31)
