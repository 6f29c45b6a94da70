"""ALFWorld (SKILL0, SkillForge, ReuseRL): household tasks in text, played through alfworld's engine.

Two sources of games, played the same way:
- **real**: the user's ALFWorld data (`$ALFWORLD_DATA/json_2.1.1/{train,valid_seen,valid_unseen}`,
  what `alfworld-download` writes). As alfworld's `AlfredTWEnv`, a game is a trial directory with
  `traj_data.json` and a `game.tw-pddl` marked solvable; movable-receptacle and sliced trials and the
  seventh ALFRED type are skipped.
- **synthesized** (offline, `alfworld_gen.py`): ALFWorld-style games written from the floor plans,
  affordance tables, goal library, domain and grammar the wheel ships, cached under
  `$SKILLJAX_CACHE/alfworld/json_2.1.1/<split>/...` in the same layout as the real data.
`source="auto"` (default) plays the real games when `$ALFWORLD_DATA` has the split, else
synthesized ones. Splits: "train", "valid_seen" (ALFWorld's in-distribution evaluation, which SKILL0
reports), "valid_unseen" (out-of-distribution); "test" means "valid_seen". Task option
`max_receptacles` (synthesized games only): rooms of at most that many receptacles, a shorter
search for small policies (20 keeps all six types: four kitchens).

Play: alfworld's TextWorld PDDL environment with its wrappers (`AlfredDemangler`, `AlfredInfos`),
as `AlfredTWEnv` builds it; the observations are the engine's text unchanged ("-= Welcome to
TextWorld, ALFRED! =- ... Your task is to: put a clean mug in coffeemachine."). The task type comes
from the trial's directory name; 50 steps (SKILL0 §4.2); reward 10 on success. The admissible
actions are the engine's, without "help" (SKILL0 removes it). A command outside them costs a step
and gets the engine's own "Nothing happens." without reaching the game, which keeps the expert's
bookkeeping (it tracks every command it sees) in step with the game.

Expert: the game's walkthrough while the episode follows it (for synthesized games, the handcoded
expert's winning run recorded at generation; for real games, what `alfworld-generate` stored);
off it, alfworld's handcoded expert, which has watched every step (as alfworld's `AlfredExpert`
wrapper runs it); if that gives up, the planner's next command.

Cache: as `textworld_cooking`: a game is built in a private temp directory and renamed into place
(whole or absent), under an exclusive `flock` per game so concurrent builders make it once; a
crashed builder's lock dies with it. `make_tasks` generates nothing (each env worker builds its own
games on `reset`, in parallel across the pool); `prepare(tasks)` builds them up front in separate
processes. A game takes ~2-6 s to build (the expert must win it), ~1-2 s to load. TextWorld's grammar
is sped up (`_memoize_text_grammar`): a random-action step 109 -> 23 ms, text unchanged.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
from typing import Any

from skilljax.envs import alfworld_gen as gen
from skilljax.envs.base import Env, EnvError, StepResult, Task, build_once

TASK_TYPES = gen.TASK_TYPES
SPLITS = gen.SPLITS
SPLIT_ALIASES = {"test": "valid_seen"}
INSTALL_HINT = ("ALFWorld needs the `alfworld` package (it builds the Fast Downward planner from "
                "source: g++ and cmake): pip install -e '.[envs]', or pip install alfworld==0.4.2")
GENERATION_WORKERS = 2    # the reference machine has 2 cores
_GENERATOR_VERSION = 2    # bump when generated games change: new cache names, no stale games
_PREFIXES = sorted(((gen.ALFRED_TYPE[t], t) for t in TASK_TYPES), key=lambda p: -len(p[0]))


def require_alfworld() -> None:
    try:
        import alfworld.agents.environment.alfred_tw_env  # noqa: F401
        import fast_downward  # noqa: F401
    except ImportError as e:
        raise EnvError(f"{INSTALL_HINT} ({e}).") from e


def default_cache_dir() -> str:
    """$SKILLJAX_CACHE/alfworld; SKILLJAX_CACHE defaults to ~/.cache/skilljax."""
    root = os.environ.get("SKILLJAX_CACHE") or os.path.expanduser("~/.cache/skilljax")
    return os.path.join(root, "alfworld")


def _split(split: str) -> str:
    split = SPLIT_ALIASES.get(split, split)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or 'test' (= valid_seen), got {split!r}")
    return split


def task_type_of(path: str) -> str | None:
    """The task type from a trial's path (".../pick_clean_then_place_in_recep-Mug-None-.../trial_...")."""
    for part in reversed(os.path.normpath(path).split(os.sep)):
        for prefix, ttype in _PREFIXES:
            if part.startswith(prefix + "-"):
                return ttype
    return None


# --- task lists ---------------------------------------------------------------------------------

def real_tasks(split: str, num: int | None, seed: int = 0,
               data_dir: str | None = None) -> list[Task]:
    """Solvable games of the user's data, in a seeded order (the first `num`; all when None)."""
    split = _split(split)
    data_dir = data_dir or os.environ.get("ALFWORLD_DATA", "")
    root = os.path.join(data_dir, "json_2.1.1", split)
    if not os.path.isdir(root):
        raise EnvError(f"No ALFWorld data at {root} (set ALFWORLD_DATA to the directory "
                       "`alfworld-download` filled, or use source='synth').")
    trials = []
    for path, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if "traj_data.json" not in files or "game.tw-pddl" not in files:
            continue
        rel = os.path.relpath(path, root)
        if "movable" in rel or "Sliced" in rel:  # as AlfredTWEnv: not supported in text
            continue
        if task_type_of(path) is not None:
            trials.append(path)
    trials.sort()
    random.Random(f"alfworld/real/{split}/{seed}").shuffle(trials)
    out = []
    for path in trials:
        if num is not None and len(out) >= num:
            break
        game_file = os.path.join(path, "game.tw-pddl")
        with open(game_file) as f:
            if not json.load(f).get("solvable"):
                continue
        out.append(Task(id=os.path.relpath(path, os.path.dirname(root)), type=task_type_of(path),
                        split=split, payload={"source": "real", "game_file": game_file}))
    return out


def synth_tasks(split: str, num: int, seed: int = 0, cache_dir: str | None = None,
                max_receptacles: int | None = None) -> list[Task]:
    """The deterministic synthesized task list (types in turn), generating nothing; with
    `max_receptacles`, only rooms of at most that many receptacles (`alfworld_gen.choices`)."""
    split = _split(split)
    if max_receptacles is not None and (isinstance(max_receptacles, bool)
                                        or not isinstance(max_receptacles, int)
                                        or max_receptacles < 1):
        raise ValueError(f"max_receptacles must be a positive integer or None, got "
                         f"{max_receptacles!r}")
    cache_dir = os.path.abspath(cache_dir or default_cache_dir())
    out = []
    for i in range(num):
        s = gen.spec(TASK_TYPES[i % len(TASK_TYPES)], split, seed, i, max_receptacles)
        digest = hashlib.sha256(json.dumps([s, _GENERATOR_VERSION], sort_keys=True).encode())
        trial = os.path.join(cache_dir, "json_2.1.1", split, gen.dir_name(s),
                             f"trial_{digest.hexdigest()[:12]}")
        out.append(Task(id=f"{s['task_type']}-{split}-{seed}-{i}", type=s["task_type"],
                        split=split, payload={"source": "synth", "spec": s,
                                              "game_file": os.path.join(trial, "game.tw-pddl"),
                                              "cache_path": os.path.relpath(trial, cache_dir)}))
    return out


# --- playing one game ---------------------------------------------------------------------------

def _memoize_translation() -> None:
    """Every PDDL state translates domain + problem twice (fast_downward.pddl2sas, ~0.4 s each), on
    load and again on every reset; a GRPO group resets the same game G times. Remember the results."""
    import fast_downward
    if getattr(fast_downward.pddl2sas, "_skilljax_memo", False):
        return
    translate = fast_downward.pddl2sas
    memo: collections.OrderedDict = collections.OrderedDict()

    def pddl2sas(domain, problem, verbose=False, optimize=False):
        key = (domain, problem, optimize)
        if key not in memo:
            memo[key] = translate(domain, problem, verbose=verbose, optimize=optimize)
            if len(memo) > 8:
                memo.popitem(last=False)
        memo.move_to_end(key)
        return memo[key]

    pddl2sas._skilljax_memo = True
    fast_downward.pddl2sas = pddl2sas


def _memoize_text_grammar() -> None:
    """The PDDL env words every observation and admissible command through TextWorld's grammar,
    which re-parses the same few hundred template strings (tatsu) thousands of times an episode:
    ~60% of a step's time. Parse each once; hand out copies (derivation mutates the symbols).
    With the deep copies below gone too, a random-action step takes 23 ms instead of 109."""
    import copy

    from textworld.envs.pddl import textgen
    from textworld.logic import Rule
    if getattr(textgen._parse_and_convert, "_skilljax_memo", False):
        return
    parse, query = textgen._parse_and_convert, Rule.parse_conjunctive_query
    parsed: dict = {}
    queries: dict = {}

    def parse_and_convert(text, rule_name, **kwargs):
        if kwargs.get("trace"):  # TW_CSG_TRACE: let the parser print its trace
            return parse(text, rule_name=rule_name, **kwargs)
        if (text, rule_name) not in parsed:
            parsed[text, rule_name] = parse(text, rule_name=rule_name)
        return copy.deepcopy(parsed[text, rule_name])

    def parse_conjunctive_query(expr):
        if expr not in queries:
            queries[expr] = query(expr)
        return copy.deepcopy(queries[expr])

    def copy_context(context):
        # The grammar adds bindings to a context's two dicts but never changes the entities and
        # variables they hold: copying the dicts is enough (TextWorld deep-copies them, ~40% of
        # a step once the parses are memoized).
        return dict(context, variables=dict(context["variables"]),
                    mapping=dict(context["mapping"]))

    parse_and_convert._skilljax_memo = True
    textgen._parse_and_convert = parse_and_convert
    textgen.copy_context = copy_context
    Rule.parse_conjunctive_query = staticmethod(parse_conjunctive_query)


class _Player:
    """alfworld's PDDL env and wrappers, one game at a time, with the handcoded expert watching."""

    def __init__(self):
        require_alfworld()
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from textworld.envs import PddlEnv

        _memoize_translation()
        _memoize_text_grammar()
        infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=True,
                                   extras=["gamefile"])
        self._pddl = PddlEnv(infos)  # one planner library copy per player, reused across games
        self._env = AlfredInfos(AlfredDemangler(self._pddl, shuffle=False))
        self.game_file = None
        self.state = None

    def load(self, game_file: str) -> None:
        if game_file != self.game_file:
            self.game_file = None
            self._env.load(game_file)
            with open(game_file) as f:
                self.walkthrough = json.load(f).get("walkthrough") or []
            self.game_file = game_file

    def reset(self, seed: int) -> str:
        from alfworld.agents.expert import HandCodedTWAgent

        self.state = self._env.reset()
        self._agent = HandCodedTWAgent(max_steps=200)  # alfworld's AlfredExpert setting
        self._agent.reset(self.game_file)
        self._agent.observe(self.state.feedback)
        self._rng = random.Random(seed)   # the expert's own coin (it breaks ties at random)
        self.plan, self.expert_failed = "look", False  # AlfredExpert's first command
        return self.state.feedback

    def step(self, command: str) -> str:
        self.state, _, _ = self._env.step(command)
        if not self.expert_failed:
            import alfworld.agents.expert.handcoded_expert as handcoded
            coin, handcoded.random = handcoded.random, self._rng
            # alfworld 0.4.2's grammar puts things down with "move X to Y", but its handcoded
            # expert's bookkeeping still looks for the older verb "put" (and, missing it, believes
            # it still holds the first object of a two-object task). Tell it in its own words.
            said = "put " + command[len("move "):] if command.startswith("move ") else command
            try:
                plan = self._agent.act(self.state, 0, self.state["won"], said)
                self.plan = plan if plan in self.state["admissible_commands"] else "look"
            except Exception:  # noqa: BLE001 -- HandCodedAgentFailed/Timeout and its own bugs
                self.expert_failed = True
            finally:
                handcoded.random = coin
        return self.state.feedback

    def planner_command(self) -> str | None:
        plan = self._pddl._pddl_state.replan(self._pddl._entity_infos)  # Fast Downward, ~0.5 s
        return plan[0] if plan else None

    def close(self) -> None:
        self._env.close()


# --- synthesized games: build, verify, cache ----------------------------------------------------

_PLAYER: _Player | None = None


def _build(s: dict[str, Any], out_dir: str) -> None:
    """Writes the game and its traj_data into out_dir once the handcoded expert has won it: the
    first won placement of the spec, or else of its stand-ins (`alfworld_gen.substitute`)."""
    for k in range(gen.SUBSTITUTES + 1):
        used = gen.substitute(s, k) if k else s
        traj = gen.traj_data(used)
        if k:
            traj["skilljax_requested"] = s
        with open(os.path.join(out_dir, "traj_data.json"), "w") as f:
            json.dump(traj, f)
        if _place_until_won(used, os.path.join(out_dir, "game.tw-pddl")):
            return
    raise EnvError(f"the handcoded expert won none of {gen.ATTEMPTS} placements of {s} nor of "
                   f"its {gen.SUBSTITUTES} stand-ins within {gen.MAX_EXPERT_STEPS} steps")


def _place_until_won(s: dict[str, Any], game_file: str) -> bool:
    """Writes placements of `s` to game_file until the expert wins one (then stores its walkthrough);
    False when it wins none of them."""
    global _PLAYER
    _PLAYER = _PLAYER or _Player()
    for attempt in range(gen.ATTEMPTS):
        data = gen.game_data(s, attempt)
        with open(game_file, "w") as f:
            json.dump(data, f)
        _PLAYER.game_file = None
        _PLAYER.load(game_file)
        _PLAYER.reset(seed=s["game_seed"])
        walkthrough = []
        while len(walkthrough) < gen.MAX_EXPERT_STEPS and not _PLAYER.expert_failed:
            walkthrough.append(_PLAYER.plan)
            _PLAYER.step(walkthrough[-1])
            if _PLAYER.state["won"]:
                data.update(solvable=True, walkthrough=walkthrough, attempt=attempt)
                with open(game_file, "w") as f:
                    json.dump(data, f)
                return True
    return False


def generate(payload: dict[str, Any]) -> bool:
    """Makes sure a synthesized task's game exists; True when this call built it."""
    return build_once(payload["game_file"], lambda tmp: _build(payload["spec"], tmp))


def prepare(task_list: list[Task], workers: int = GENERATION_WORKERS) -> int:
    """Builds the missing synthesized games in `workers` fresh processes; returns how many."""
    missing = [t.payload for t in task_list
               if t.payload["source"] == "synth" and not os.path.exists(t.payload["game_file"])]
    if not missing:
        return 0
    require_alfworld()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for w in range(min(workers, len(missing))):
            path = os.path.join(tmp, f"payloads-{w}.json")
            with open(path, "w") as f:
                json.dump(missing[w::workers], f)
            cmd = [sys.executable, "-m", "skilljax.envs.alfworld", "--worker", path]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
        errors = []
        for proc in procs:
            out, _ = proc.communicate()
            errors += [json.loads(line)["error"] for line in out.splitlines()
                       if line.startswith("{") and "error" in json.loads(line)]
            if proc.returncode:
                errors.append(f"generator exited with status {proc.returncode}")
    if errors:
        raise EnvError(f"Generating ALFWorld games: {errors[0]} ({len(errors)} failed)")
    return len(missing)


# --- the environment ----------------------------------------------------------------------------

class AlfWorld(Env):
    """One ALFWorld game at a time; `reset` loads the task's game (building it if needed)."""

    name = "alfworld"

    def __init__(self, max_steps: int = 50, cache_dir: str | None = None):
        self.max_steps = max_steps  # SKILL0 §4.2: 50
        self.cache_dir = cache_dir  # when set, overrides a synthesized task's directory
        self._player: _Player | None = None
        self._done = True

    @classmethod
    def task_types(cls) -> tuple[str, ...]:
        return TASK_TYPES

    @classmethod
    def make_tasks(cls, split: str, num: int, seed: int = 0, source: str = "auto",
                   data_dir: str | None = None, cache_dir: str | None = None,
                   pregenerate: bool = False, max_receptacles: int | None = None) -> list[Task]:
        """`num` tasks (fewer if the real data has fewer solvable games); see the module docstring."""
        if source not in ("auto", "real", "synth"):
            raise ValueError(f"source must be 'auto', 'real' or 'synth', got {source!r}")
        data_dir = data_dir or os.environ.get("ALFWORLD_DATA", "")
        if source == "real" or (source == "auto" and data_dir and os.path.isdir(
                os.path.join(data_dir, "json_2.1.1", _split(split)))):
            if max_receptacles is not None:
                raise ValueError("max_receptacles picks rooms for synthesized games; the real "
                                 "games of ALFWORLD_DATA are used as they are (drop the option, "
                                 "or pass source='synth').")
            return real_tasks(split, num, seed, data_dir)
        task_list = synth_tasks(split, num, seed, cache_dir, max_receptacles)
        if pregenerate:
            prepare(task_list)
        return task_list

    def _game_file(self, task: Task) -> str:
        if self.cache_dir and task.payload["source"] == "synth":
            return os.path.join(self.cache_dir, task.payload["cache_path"], "game.tw-pddl")
        return task.payload["game_file"]

    def reset(self, task: Task, seed: int = 0) -> tuple[str, dict[str, Any]]:
        require_alfworld()
        payload = dict(task.payload, game_file=self._game_file(task))
        if payload["source"] == "synth":
            try:
                generate(payload)
            except Exception as e:
                raise EnvError(f"Could not build ALFWorld game {task.id}: {e}") from e
        self._player = self._player or _Player()
        self._player.load(payload["game_file"])
        obs = self._player.reset(seed)
        self._steps, self._done, self._on_walk = 0, False, True
        self._task = task
        goal = obs.split("Your task is to: ", 1)[-1].strip()  # as SKILL0's env manager
        return obs, {"goal": goal, "admissible_actions": self.admissible_actions(), "valid": True,
                     "gamefile": payload["game_file"], "task_type": task.type}

    def step(self, action: str) -> StepResult:
        if self._player is None or self._done:
            raise EnvError("AlfWorld.step called before reset or after the episode ended.")
        command = " ".join(action.strip().strip("`'\"").lower().split())  # SKILL0 lower-cases
        valid = command in self.admissible_actions()
        self._steps += 1
        if valid:
            walk = self._player.walkthrough
            self._on_walk = (self._on_walk and self._steps <= len(walk)
                             and walk[self._steps - 1] == command)
            obs = self._player.step(command)
        else:
            self._on_walk = False
            obs = self.invalid_observation  # the engine's reply to a command it does not know
        won = bool(self._player.state["won"])
        truncated = not won and self._steps >= self.max_steps
        self._done = won or truncated
        info = {"admissible_actions": self.admissible_actions(), "valid": valid,
                "command": command, "step": self._steps, "won": won}
        return StepResult(observation=obs, reward=self.success_reward if won else 0.0,
                          done=self._done, won=won, truncated=truncated, info=info)

    def admissible_actions(self) -> list[str] | None:
        if self._player is None or self._player.state is None:
            return None
        return [c for c in self._player.state["admissible_commands"] if c != "help"]

    def expert_action(self) -> str:
        """The walkthrough while on it, else alfworld's handcoded expert, else the planner."""
        p = self._player
        if self._on_walk and self._steps < len(p.walkthrough):
            return p.walkthrough[self._steps]
        if not p.expert_failed:
            return p.plan
        return p.planner_command() or "look"

    def close(self) -> None:
        if self._player is not None:
            self._player.close()
        self._player = None


def _worker(path: str) -> None:
    """A generator process: builds the payloads in `path`, one JSON reply line per game."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything the engine prints goes to stderr, not into the replies
    with open(path) as f:
        payloads = json.load(f)
    for payload in payloads:
        try:
            reply = {"built": generate(payload)}
        except Exception as e:  # noqa: BLE001 -- this game failed; report it, keep going
            reply = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Pre-generate synthesized ALFWorld games.")
    p.add_argument("--split", default="valid_seen")
    p.add_argument("--num", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=GENERATION_WORKERS)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--max-receptacles", type=int, default=None,
                   help="only rooms of at most this many receptacles (a task option)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return _worker(a.worker)
    task_list = synth_tasks(a.split, a.num, a.seed, a.cache_dir, a.max_receptacles)
    print(json.dumps({"built": prepare(task_list, a.workers), "tasks": len(task_list)}))


if __name__ == "__main__":
    main()
