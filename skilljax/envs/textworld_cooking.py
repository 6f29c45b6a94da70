"""TextWorld-Cooking (ReuseRL app. E): read the cookbook, fetch, cut and cook the ingredients, eat.

Games are TextWorld `tw-cooking` games generated locally. Two settings (ReuseRL app. E): "simple" =
1 room, 1 ingredient, cooking and cutting each on or off; "hard" = 6 rooms, 2 ingredients, cook and
cut. The paper does not state `take` or `open`; its worked example (app. F.2: "open fridge; take
carrot from fridge") shows ingredients fetched from closed containers, so every ingredient must be
found (`take = recipe`) and containers start closed (`open`). "mixed" interleaves them 4:1
(ReuseRL app. E) and reuses the simple and hard games. Train and test games use TextWorld's own
food/preparation splits (`split="train"/"test"`), so their ingredient preparations never overlap.

Cache: one directory per game (`game.z8` + `game.json`) under `cache_dir`, named by the task's
settings and seed. A generator builds it in a private temp directory and renames it into place, so
a game is either complete or absent; an exclusive `flock` per game makes concurrent generators
(threads, pools, other processes) build each game once, and dies with its holder, so a crash never
blocks anyone. `make_tasks` returns at once and queues the missing games for two background
generator processes (the work is CPU-bound); `reset` waits only for its own game, building it itself
when nobody holds its lock. `prepare(tasks)` (or `background=False`) waits for all of them.

Play: the game's own replies, without the ASCII banner, prompt and status line. `info["valid"]`
says whether the command was admissible; a non-admissible command still costs a step and reaches
the game when its verb is one the game knows (so the reply explains), never otherwise (restart,
undo, ... would desync TextWorld's state tracking). Control characters in a command become spaces
(the interpreter takes some as hot keys). `info` also carries the command's verb, object and
target and whether it scored ("progress"), for rule-based skill projections (ReuseRL app. F.2).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import queue
import re
import subprocess
import sys
import threading
import warnings
from concurrent import futures
from typing import Any

from skilljax.envs.base import Env, EnvError, StepResult, Task, build_once

DIFFICULTIES = ("simple", "hard")
_BASE = {"open": True, "drop": False, "recipe_seed": 0}
_SETTINGS = {  # ReuseRL app. E: rooms / ingredients / is_cook / is_cut
    "simple": {"go": 1, "recipe": 1, "take": 1},
    "hard": {"go": 6, "recipe": 2, "take": 2, "cook": True, "cut": True},
}
# Simple games cycle through the four (cook, cut) gates, so even a short list covers them evenly.
_SIMPLE_GATES = ((True, True), (True, False), (False, True), (False, False))
_MIXED_HARD_EVERY = 5     # ReuseRL app. E: 4:1 simple:hard
_GAME_SPLITS = ("train", "valid", "test")   # TextWorld's food splits, one per task split
GENERATION_WORKERS = 2    # generation is CPU-bound; the reference machine has 2 cores
_PROMPT = re.compile(r"\n>[^\n]*\Z")        # trailing prompt and status line ("> -= Kitchen =-0/3")


def default_cache_dir() -> str:
    """$SKILLJAX_CACHE/textworld_cooking; SKILLJAX_CACHE defaults to ~/.cache/skilljax."""
    root = os.environ.get("SKILLJAX_CACHE") or os.path.expanduser("~/.cache/skilljax")
    return os.path.join(root, "textworld_cooking")


def _settings(difficulty: str, split: str, index: int) -> dict[str, Any]:
    s = dict(_BASE, split=split, **_SETTINGS[difficulty])
    if difficulty == "simple":
        s["cook"], s["cut"] = _SIMPLE_GATES[index % len(_SIMPLE_GATES)]
    return s


def _game_task(difficulty: str, split: str, seed: int, index: int, cache_dir: str) -> Task:
    key = f"tw_cooking/{difficulty}/{split}/{seed}/{index}"
    game_seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") >> 1
    settings = _settings(difficulty, split, index)
    # The settings hash in the name keeps a changed generator from reusing stale games.
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    name = f"{split}-{difficulty}-{seed}-{index}-{digest}"
    return Task(id=f"{difficulty}-{seed}-{index}", type=difficulty, split=split, payload={
        "name": name, "game_file": os.path.join(os.path.abspath(cache_dir), name, "game.z8"),
        "game_seed": game_seed, "settings": settings})


def tasks(split: str, num: int, seed: int = 0, difficulty: str = "simple",
          cache_dir: str | None = None) -> list[Task]:
    """The deterministic task list, generating nothing."""
    if split not in _GAME_SPLITS:
        raise ValueError(f"split must be one of {_GAME_SPLITS}, got {split!r}")
    if difficulty not in DIFFICULTIES + ("mixed",):
        raise ValueError(f"difficulty must be 'simple', 'hard' or 'mixed', got {difficulty!r}")
    cache_dir = cache_dir or default_cache_dir()
    out, counts = [], {"simple": 0, "hard": 0}
    for i in range(num):
        d = difficulty
        if d == "mixed":
            d = "hard" if i % _MIXED_HARD_EVERY == _MIXED_HARD_EVERY - 1 else "simple"
        out.append(_game_task(d, split, seed, counts[d], cache_dir))
        counts[d] += 1
    return out


def _compile(settings: dict[str, Any], game_seed: int, out_dir: str) -> None:
    import textworld
    from textworld.challenges.tw_cooking import cooking

    warnings.filterwarnings("ignore", message=".*is not fully supported")  # jericho, on TW games
    options = textworld.GameOptions()
    options.seeds = game_seed
    options.path = os.path.join(out_dir, "game.z8")
    options.force_recompile = True
    game = cooking.make(dict(settings), options)
    textworld.generator.compile_game(game, options)
    os.remove(os.path.join(out_dir, "game.ni"))  # the Inform 7 source: not needed to play


def generate(payload: dict[str, Any]) -> bool:
    """Makes sure the task's game exists; True when this call built it. Safe to run concurrently."""
    return build_once(payload["game_file"], lambda tmp: _compile(payload["settings"], payload["game_seed"], tmp))


_QUEUE: queue.Queue = queue.Queue()
_PENDING: dict[str, futures.Future] = {}   # game_file -> its queued job, in this process
_THREADS: list[threading.Thread] = []
_PROCS: list[subprocess.Popen] = []
_LOCK = threading.Lock()


def _generator_loop() -> None:
    # Each thread feeds one `python -m` generator process (not multiprocessing, whose spawn re-runs
    # the caller's main module in every child) and keeps it across games, so textworld's one-off
    # start-up (~3 s) is paid once per process.
    proc = None
    while True:
        payload, future = _QUEUE.get()
        try:
            if proc is None or proc.poll() is not None:
                root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                    filter(None, [root, os.environ.get("PYTHONPATH")])))
                proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env)
                _PROCS.append(proc)
            proc.stdin.write(json.dumps(payload) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                raise OSError(f"exited with status {proc.wait()}")
            reply = json.loads(line)
            error = reply.get("error")  # the game failed; the process is fine
        except (OSError, ValueError) as e:
            error = f"generator process failed ({e})"
            if proc is not None:
                proc.kill()
            proc = None
        with _LOCK:
            _PENDING.pop(payload["game_file"], None)
        if error:
            future.set_exception(EnvError(f"Generating TextWorld game {payload['name']}: {error}"))
        else:
            future.set_result(reply["built"])


@atexit.register
def _stop_generators() -> None:
    for proc in _PROCS:  # queued games are dropped; a killed one leaves only a temp dir behind
        if proc.poll() is None:
            proc.kill()


def prepare(task_list: list[Task], wait: bool = True) -> None:
    """Queues the tasks' missing games on the background generators; `wait` blocks until built."""
    jobs = []
    with _LOCK:
        for task in task_list:
            payload = task.payload
            if os.path.exists(payload["game_file"]):
                continue
            if payload["game_file"] not in _PENDING:
                _PENDING[payload["game_file"]] = futures.Future()
                _QUEUE.put((payload, _PENDING[payload["game_file"]]))
            jobs.append(_PENDING[payload["game_file"]])
        while jobs and len(_THREADS) < GENERATION_WORKERS:
            # Daemon threads: an exiting run does not wait for the queue.
            _THREADS.append(threading.Thread(target=_generator_loop, daemon=True))
            _THREADS[-1].start()
    if wait:
        for job in jobs:
            job.result()


def _serve() -> None:
    """A generator process: one task payload per stdin line, one JSON reply per game."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything textworld prints goes to stderr, not into the replies
    for line in sys.stdin:
        try:
            reply = {"built": generate(json.loads(line))}
        except Exception as e:  # noqa: BLE001 -- this game failed; report it, keep serving
            reply = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def _clean(text: str) -> str:
    text = text.split("Would you like to RESTART")[0]  # the interpreter's end-of-game menu
    text = _PROMPT.sub("", text)
    # Centred banners ("*** The End ***") lose their indent; the recipe's 2-space indents stay.
    text = re.sub(r"^[ \t]{4,}|[ \t]+$", "", text, flags=re.MULTILINE)
    return re.sub(r"\n\s*\n(\s*\n)+", "\n\n", text).strip()


def parse_command(command: str) -> tuple[str, str | None, str | None]:
    """(verb, object, target): "cook carrot with stove" -> ("cook", "carrot", "stove")."""
    words = command.split()
    if not words:
        return "", None, None
    rest = " ".join(words[1:])
    for prep in (" with ", " from ", " into ", " on "):
        if prep in f" {rest} ":
            obj, target = f" {rest} ".split(prep, 1)
            return words[0], obj.strip() or None, target.strip() or None
    return words[0], rest or None, None


class TextWorldCooking(Env):
    """One TextWorld game at a time; `reset` loads the task's game (building it if needed)."""

    name = "textworld_cooking"

    def __init__(self, max_steps: int = 40, cache_dir: str | None = None):
        self.max_steps = max_steps  # ReuseRL app. E: T = 40
        self.cache_dir = cache_dir  # when set, overrides the task's directory (games moved)
        self._env = self._loaded = self._state = None

    @classmethod
    def task_types(cls) -> tuple[str, ...]:
        return DIFFICULTIES

    @classmethod
    def make_tasks(cls, split: str, num: int, seed: int = 0, difficulty: str = "simple",
                   cache_dir: str | None = None, background: bool = True) -> list[Task]:
        """Tasks at once; their games are built in the background, or before returning."""
        task_list = tasks(split, num, seed, difficulty, cache_dir)
        prepare(task_list, wait=not background)
        return task_list

    def reset(self, task: Task, seed: int = 0) -> tuple[str, dict[str, Any]]:
        del seed  # games are deterministic: the task fixes everything
        import textworld

        payload = dict(task.payload)
        if self.cache_dir:
            payload["game_file"] = os.path.join(self.cache_dir, payload["name"], "game.z8")
        try:
            generate(payload)
        except Exception as e:
            raise EnvError(f"Could not build TextWorld game {payload['name']}: {e}") from e
        warnings.filterwarnings("ignore", message=".*is not fully supported")
        if self._loaded != payload["game_file"]:
            # A fresh interpreter per game: jericho's in-place `load` leaks ~0.5 MB a game.
            self.close()
            infos = textworld.EnvInfos(admissible_commands=True, policy_commands=True, won=True,
                                       lost=True, objective=True, verbs=True, score=True,
                                       extras=["walkthrough", "ingredients"])
            self._env = textworld.start(payload["game_file"], request_infos=infos)
            self._loaded = payload["game_file"]
        self._state = self._env.reset()
        self._steps, self._done = 0, False
        self._walk, self._on_walk = 0, True  # position in the walkthrough; still following it?
        obs = self._state.feedback
        start = obs.find(self._state["objective"])  # drop the ASCII-art banner above it
        obs = _clean(obs[start:] if start >= 0 else obs)
        # "ingredients" is the recipe's answer, for analysis (e.g. ReuseRL §7.2's already-cooked
        # ingredients); never show it to the policy.
        return obs, {"admissible_actions": self.admissible_actions(), "valid": True,
                     "goal": " ".join(self._state["objective"].split()),
                     "ingredients": [list(i) for i in self._state["extra.ingredients"]]}

    def step(self, action: str) -> StepResult:
        if self._state is None or self._done:
            raise EnvError("TextWorldCooking.step called before reset or after the episode ended.")
        # Control characters become spaces: the interpreter reads some as hot keys (Ctrl-N turns
        # on command recording to a file named by the rest of the line, in the working directory).
        action = "".join(ch if ch.isprintable() else " " for ch in action)
        command = " ".join(action.strip().strip("`'\".").lower().split())
        admissible = self.admissible_actions()
        verb, obj, target = parse_command(command)
        score = self._state["score"]
        self._steps += 1
        if verb in self._state["verbs"]:  # see the module docstring
            if self._on_walk and command == self._walkthrough_next():
                self._walk += 1
            else:
                self._on_walk = False
            self._state, _, _ = self._env.step(command)
            obs = _clean(self._state.feedback) or self.invalid_observation
        else:
            obs = self.invalid_observation
        won, lost = bool(self._state["won"]), bool(self._state["lost"])
        truncated = not (won or lost) and self._steps >= self.max_steps
        self._done = won or lost or truncated
        info = {"admissible_actions": self.admissible_actions(), "valid": command in admissible,
                "command": command, "verb": verb, "object": obj, "target": target,
                "progress": self._state["score"] > score, "lost": lost, "step": self._steps}
        return StepResult(observation=obs, reward=self.success_reward if won else 0.0,
                          done=self._done, won=won, truncated=truncated, info=info)

    def admissible_actions(self) -> list[str] | None:
        return None if self._state is None else list(self._state["admissible_commands"])

    def _walkthrough_next(self) -> str | None:
        # The walkthrough can repeat a step that is already done (a second "open fridge" when both
        # ingredients are in it); skip those rather than waste a step.
        walkthrough = self._state["extra.walkthrough"]
        while self._walk < len(walkthrough) and (
                walkthrough[self._walk] not in self._state["admissible_commands"]):
            self._walk += 1
        return walkthrough[self._walk] if self._walk < len(walkthrough) else None

    def expert_action(self) -> str:
        """The walkthrough while on it (it reads the cookbook), else the shortest winning plan."""
        if self._on_walk and (action := self._walkthrough_next()) is not None:
            return action
        if self._state["policy_commands"]:
            return self._state["policy_commands"][0]
        return "look"  # nothing left to win (the game is over or lost)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
        self._env = self._loaded = self._state = None


if __name__ == "__main__":
    _serve()
