"""A scriptable env for pool tests: its actions make the worker crash, hang, raise or sleep."""

import os
import time

from skilljax.envs.base import Env, StepResult, Task


class Probe(Env):
    name = "probe"
    max_steps = 5

    def __init__(self, sleep_s: float = 0.0):
        self.sleep_s = sleep_s

    @classmethod
    def make_tasks(cls, split, num, seed=0, **options):
        return [Task(f"{split}-{seed}-{i}", "probe", split, {"goal": i % 3}) for i in range(num)]

    def reset(self, task, seed=0):
        if task.payload.get("crash_on_reset"):
            os._exit(3)
        self.task, self.seed, self.t = task, seed, 0
        return f"start {task.id} seed {seed} pid {os.getpid()}", {"admissible_actions": ["ok"]}

    def step(self, action):
        time.sleep(self.sleep_s)
        if action == "crash":
            os._exit(7)
        if action == "hang":
            time.sleep(3600)
        if action == "raise":
            raise ValueError("probe asked to raise")
        if action == "print":
            print("noise on stdout must not break the protocol", flush=True)
            os.write(1, b"and neither must C-level writes\n")
        self.t += 1
        won = action == f"win{self.task.payload['goal']}"
        done = won or self.t >= self.max_steps
        return StepResult(f"{action} at {self.t}", 10.0 if won else 0.0, done, won=won,
                          truncated=done and not won, info={"pid": os.getpid(), "seed": self.seed})

    def expert_action(self):
        return f"win{self.task.payload['goal']}"
