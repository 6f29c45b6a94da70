"""ALFWorld: synthesized games of all six types, splits, the cache, real-data loading, the rules.

Builds six valid_unseen games (one per type, ~2-3 s each, two processes) into a temporary cache and
lays copies of them out as a real ALFWorld data directory. Run with `-s` for the measured times.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

pytest.importorskip("alfworld")

from skilljax.envs import alfworld as alf
from skilljax.envs import alfworld_gen as gen
from skilljax.envs import base

_TEMPLATE_START = {  # goal_library's templates, lower-cased targets
    "pick_and_place": ("put a ", "put some "),
    "pick_two_obj_and_place": ("put two ", "find two "),
    "look_at_obj_in_light": ("look at ", "examine the "),
    "pick_heat_then_place_in_recep": ("put a hot ", "heat some "),
    "pick_cool_then_place_in_recep": ("put a cool ", "cool some "),
    "pick_clean_then_place_in_recep": ("put a clean ", "clean some "),
}


@pytest.fixture(scope="module")
def games(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("alfworld_cache"))
    # Tasks 6-11 of seed 0: one per type.
    tasks = alf.AlfWorld.make_tasks("valid_unseen", 12, seed=0, cache_dir=cache)[6:]
    start = time.perf_counter()
    assert alf.prepare(tasks) == len(tasks)
    took = time.perf_counter() - start
    print(f"\n[measure] {len(tasks)} games built by {alf.GENERATION_WORKERS} processes in "
          f"{took:.1f} s ({took / len(tasks):.2f} s/game wall, start-up included)")
    return cache, tasks


def _play_expert(env, task):
    obs, info = env.reset(task)
    steps, step_time = [], 0.0
    for _ in range(env.max_steps):
        action = env.expert_action()
        assert action in env.admissible_actions()
        start = time.perf_counter()
        result = env.step(action)
        step_time += time.perf_counter() - start
        steps.append(action)
        json.dumps(result.to_json())  # crosses the worker boundary
        if result.done:
            break
    return obs, info, result, steps, step_time


def test_task_lists_are_deterministic_balanced_and_serialisable(tmp_path):
    tasks = alf.synth_tasks("train", 24, seed=3, cache_dir=str(tmp_path))
    assert tasks == alf.synth_tasks("train", 24, seed=3, cache_dir=str(tmp_path))
    assert tasks[:7] == alf.synth_tasks("train", 7, seed=3, cache_dir=str(tmp_path))
    assert [t.type for t in tasks] == list(alf.TASK_TYPES) * 4  # every type, in turn
    assert len({t.id for t in tasks}) == 24
    other = alf.synth_tasks("train", 24, seed=4, cache_dir=str(tmp_path))
    assert not {t.payload["game_file"] for t in tasks} & {t.payload["game_file"] for t in other}
    assert [base.Task.from_json(json.loads(json.dumps(t.to_json()))) for t in tasks] == tasks
    assert alf.synth_tasks("test", 6, cache_dir=str(tmp_path)) == alf.synth_tasks(
        "valid_seen", 6, cache_dir=str(tmp_path))  # "test" is ALFWorld's in-distribution split
    assert not os.listdir(tmp_path)  # task lists generate nothing
    with pytest.raises(ValueError):
        alf.synth_tasks("dev", 1)
    # Every type maps to a skill file of the bank.
    with open(os.path.join(os.path.dirname(base.__file__), "..", "data", "skills", "alfworld",
                           "skill_mapping.json")) as f:
        assert set(alf.TASK_TYPES) <= set(json.load(f)["task_to_skill"])


def test_max_receptacles_keeps_small_rooms_and_every_type(tmp_path):
    capped = alf.synth_tasks("train", 60, seed=0, cache_dir=str(tmp_path), max_receptacles=20)
    assert [t.type for t in capped] == list(alf.TASK_TYPES) * 10  # 20 keeps all six types
    for t in capped:
        assert gen.room_size(t.payload["spec"]["floor_plan"]) <= 20
        assert t.payload["spec"]["max_receptacles"] == 20
        for k in (1, 2):  # a stand-in keeps the cap
            assert gen.room_size(gen.substitute(t.payload["spec"], k)["floor_plan"]) <= 20
    plain = alf.synth_tasks("train", 60, seed=0, cache_dir=str(tmp_path))
    assert max(gen.room_size(t.payload["spec"]["floor_plan"]) for t in plain) > 20
    assert "max_receptacles" not in plain[0].payload["spec"]  # uncapped specs (and games) as before
    assert not {t.payload["game_file"] for t in plain} & {t.payload["game_file"] for t in capped}
    with pytest.raises(ValueError, match="pick_heat_then_place_in_recep .* smallest room has 16"):
        alf.synth_tasks("train", 6, max_receptacles=12)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            alf.synth_tasks("train", 6, max_receptacles=bad)
    (tmp_path / "data" / "json_2.1.1" / "train").mkdir(parents=True)
    with pytest.raises(ValueError, match="real games"):
        alf.AlfWorld.make_tasks("train", 6, data_dir=str(tmp_path / "data"), max_receptacles=20)
    assert not os.listdir(tmp_path / "data" / "json_2.1.1" / "train")


def test_unseen_split_holds_out_floor_plans_and_object_types():
    train, unseen = set(gen.floor_plans("train")), set(gen.floor_plans("valid_unseen"))
    assert train and unseen and not train & unseen
    assert set(gen.floor_plans("valid_seen")) == train
    for ttype in alf.TASK_TYPES:
        seen_combos = set(gen.combos(ttype, "valid_seen"))
        train_combos = set(gen.combos(ttype, "train"))
        unseen_combos = gen.combos(ttype, "valid_unseen")
        assert seen_combos and train_combos and unseen_combos
        assert not seen_combos & train_combos  # seen: new combinations of the same rooms/objects
        assert {c[1] for c in seen_combos} <= {c[1] for c in train_combos}
        assert {c[0] for c in unseen_combos} <= unseen
        assert {c[1] for c in unseen_combos} <= gen.HELD_OUT_OBJECTS
        assert not {c[1] for c in train_combos} & gen.HELD_OUT_OBJECTS
    # Held-out object types never appear in a training room, even as clutter.
    for task in alf.synth_tasks("train", 12, seed=0, cache_dir="/nonexistent"):
        assert not set(gen.counts(task.payload["spec"])) & gen.HELD_OUT_OBJECTS


def test_every_combination_places_its_target():
    # Floor plan 424 (a bathroom) has a plunger whose only possible holder is the cabinet: "put a
    # plunger in a cabinet" there got no plunger at all, and TextWorld failed to load the game
    # (KeyError 'val1', a goal the planner proved unreachable). Such combinations are not offered.
    bad = {"task_type": "pick_and_place", "split": "train", "floor_plan": 424, "object": "Plunger",
           "receptacle": "Cabinet", "toggle": "", "game_seed": 52641282}
    assert (424, "Plunger", "Cabinet") not in gen.combos("pick_and_place", "train")
    with pytest.raises(ValueError, match="Plunger outside its destination"):
        gen.problem(bad)
    for ttype in alf.TASK_TYPES:
        for split in gen.SPLITS:
            for fp, obj, dest in gen.combos(ttype, split)[::7]:
                look = ttype == "look_at_obj_in_light"
                s = {"task_type": ttype, "split": split, "floor_plan": fp, "object": obj,
                     "receptacle": "" if look else dest, "toggle": dest if look else "",
                     "game_seed": fp}
                assert gen.counts(s)[obj] >= (2 if ttype == "pick_two_obj_and_place" else 1)


def test_game_files_are_written_like_real_ones(games):
    _, tasks = games
    for task in tasks:
        trial = os.path.dirname(task.payload["game_file"])
        assert sorted(os.listdir(trial)) == ["game.tw-pddl", "traj_data.json"]
        assert task_dir_type(trial) == task.type
        with open(task.payload["game_file"]) as f:
            data = json.load(f)
        assert {"pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"} <= set(data)
        assert data["solvable"] and 0 < len(data["walkthrough"]) <= gen.MAX_EXPERT_STEPS
        assert "UNKNOWN GOAL" not in data["grammar"]
        assert "(canContain " in data["pddl_problem"]  # without them no goal is reachable
        with open(os.path.join(trial, "traj_data.json")) as f:
            traj = json.load(f)
        assert traj["task_type"] == gen.ALFRED_TYPE[task.type]
        assert traj["pddl_params"]["object_target"] == task.payload["spec"]["object"]


def test_a_spec_the_expert_cannot_win_gets_a_stand_in(tmp_path, monkeypatch):
    # Two soap bottles into the garbage can of floor plan 16 (a kitchen with a dozen drawers): the
    # handcoded expert needs 53-120 steps whatever the placement (measured over 20 placements), so
    # no placement is kept; a combination of the same type takes the slot. One placement each here.
    unwinnable = {"task_type": "pick_two_obj_and_place", "split": "valid_seen", "floor_plan": 16,
                  "object": "SoapBottle", "receptacle": "GarbageCan", "toggle": "",
                  "game_seed": 1160334818}
    monkeypatch.setattr(gen, "ATTEMPTS", 1)
    game_file = str(tmp_path / "trial" / "game.tw-pddl")
    assert alf.generate({"spec": unwinnable, "game_file": game_file})
    with open(os.path.join(os.path.dirname(game_file), "traj_data.json")) as f:
        traj = json.load(f)
    used = traj["skilljax_spec"]
    assert traj["skilljax_requested"] == unwinnable and used != unwinnable
    assert used in [gen.substitute(unwinnable, k) for k in range(1, gen.SUBSTITUTES + 1)]
    assert used["task_type"] == "pick_two_obj_and_place" and used["split"] == "valid_seen"
    assert (used["floor_plan"], used["object"], used["receptacle"]) in gen.combos(
        "pick_two_obj_and_place", "valid_seen")
    with open(game_file) as f:
        data = json.load(f)
    assert data["solvable"] and len(data["walkthrough"]) <= gen.MAX_EXPERT_STEPS
    assert f"two {used['object'].lower()}" in data["grammar"].lower()
    monkeypatch.setattr(gen, "MAX_EXPERT_STEPS", 1)  # now nothing can be won: a clear error
    with pytest.raises(base.EnvError, match="won none of 1 placements .* nor of its 5 stand-ins"):
        alf.generate({"spec": unwinnable, "game_file": str(tmp_path / "other" / "game.tw-pddl")})
    assert not os.path.exists(tmp_path / "other")  # nothing half-built is left


def task_dir_type(trial):
    return alf.task_type_of(trial)


def test_expert_wins_every_type(games):
    _, tasks = games
    env = alf.AlfWorld()
    steps = step_time = 0
    for task in tasks:
        obs, info, result, actions, t = _play_expert(env, task)
        steps, step_time = steps + len(actions), step_time + t
        assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a "
                              "room. Looking quickly around you, you see a ")
        assert obs.endswith(f"Your task is to: {info['goal']}")
        assert info["goal"].startswith(_TEMPLATE_START[task.type]), info["goal"]
        assert "help" not in info["admissible_actions"] and "look" in info["admissible_actions"]
        assert result.won and result.reward == base.SUCCESS_REWARD and not result.truncated
        assert result.info["valid"]
    print(f"\n[measure] env step: {step_time / steps * 1e3:.0f} ms mean over {steps} expert steps")
    env.close()


def test_expert_recovers_off_the_walkthrough(games):
    _, tasks = games
    env = alf.AlfWorld()
    for task in tasks[:3]:
        env.reset(task)
        for action in ["inventory", "look", env.admissible_actions()[0]]:  # off the walkthrough
            env.step(action)
        for _ in range(env.max_steps - 3):  # the handcoded expert, from this state
            result = env.step(env.expert_action())
            if result.done:
                break
        assert result.won, task.id
    env.close()


def test_invalid_actions_cost_a_step_and_the_limit_truncates(games):
    _, tasks = games
    env = alf.AlfWorld()
    _, info = env.reset(tasks[0])
    result = env.step("dance with the fridge")
    assert (result.observation, result.info["valid"], result.info["step"]) == (
        base.Env.invalid_observation, False, 1)
    result = env.step("help")  # the engine knows it, but SKILL0 removes it from the actions
    assert result.observation == "Nothing happens." and not result.info["valid"]
    result = env.step("  'Go  To " + info["admissible_actions"][0].split("go to ")[-1] + "'")
    assert result.info["valid"] and result.observation.startswith("You arrive at ")
    for i in range(4, env.max_steps + 1):
        result = env.step("inventory")
        assert result.done == (i == env.max_steps)
    assert result.truncated and not result.won and result.reward == 0.0
    assert env.max_steps == 50
    with pytest.raises(base.EnvError):
        env.step("look")
    env.close()


_TRANSCRIPT = """
import json, random, sys
from skilljax.envs import alfworld as alf
if sys.argv[1] == "plain":
    alf._memoize_text_grammar = lambda: None
env, out = alf.AlfWorld(), []
for task in json.loads(sys.argv[2]):
    rng = random.Random(0)
    out.append(list(env.reset(alf.Task.from_json(task))))
    for _ in range(12):
        result = env.step(rng.choice(env.admissible_actions()))
        out.append([result.observation, result.info["admissible_actions"], env.expert_action()])
        if result.done:
            break
print("TRANSCRIPT" + json.dumps(out))
"""


def test_memoized_grammar_words_the_game_identically(games):
    # The grammar speed-up (a step 109 -> 23 ms) must not change a single observation, admissible action
    # or expert choice: play the same random actions with and without it.
    _, tasks = games
    arg = json.dumps([t.to_json() for t in tasks[:2]])
    out = {}
    for mode in ("plain", "memo"):
        proc = subprocess.run([sys.executable, "-c", _TRANSCRIPT, mode, arg], capture_output=True,
                              text=True, timeout=300, check=True)
        out[mode] = proc.stdout.split("TRANSCRIPT", 1)[1]
    assert out["plain"] == out["memo"]
    assert len(json.loads(out["memo"])) > 10


def test_cache_is_reused(games):
    cache, tasks = games
    assert not glob.glob(os.path.join(cache, "**", ".tmp-*"), recursive=True)
    mtimes = {t.payload["game_file"]: os.path.getmtime(t.payload["game_file"]) for t in tasks}
    start = time.perf_counter()
    again = alf.AlfWorld.make_tasks("valid_unseen", 12, seed=0, cache_dir=cache)[6:]
    assert again == tasks and alf.prepare(again) == 0 and not alf.generate(again[0].payload)
    assert time.perf_counter() - start < 1.0
    assert mtimes == {p: os.path.getmtime(p) for p in mtimes}
    # A moved cache is found through the constructor's cache_dir.
    moved = cache + "-moved"
    shutil.copytree(cache, moved)
    env = alf.AlfWorld(cache_dir=moved)
    _, info = env.reset(tasks[0])
    assert info["gamefile"].startswith(moved)
    env.close()


def test_real_data_layout_is_loaded(games, tmp_path, monkeypatch):
    _, tasks = games
    data = tmp_path / "alfworld_data"
    split_dir = data / "json_2.1.1" / "valid_seen"
    for task in tasks:  # the synthesized trials, laid out as alfworld-download does
        trial = os.path.dirname(task.payload["game_file"])
        shutil.copytree(trial, split_dir / os.path.basename(os.path.dirname(trial)) / "trial_T1")
    # What AlfredTWEnv skips: unsolvable games, movable-receptacle and sliced trials.
    skipped = [split_dir / "pick_and_place_simple-Apple-None-Fridge-1" / "trial_T2",
               split_dir / "pick_and_place_with_movable_recep-Pen-Mug-Desk-309" / "trial_T3",
               split_dir / "pick_heat_then_place_in_recep-AppleSliced-None-Fridge-1" / "trial_T4"]
    source = os.path.dirname(tasks[0].payload["game_file"])
    for i, path in enumerate(skipped):
        shutil.copytree(source, path)
        if i == 0:
            game = json.loads((path / "game.tw-pddl").read_text())
            (path / "game.tw-pddl").write_text(json.dumps(dict(game, solvable=False)))
    monkeypatch.setenv("ALFWORLD_DATA", str(data))
    real = alf.AlfWorld.make_tasks("test", 20, seed=0)  # auto: the user's data wins
    assert len(real) == len(tasks) and {t.payload["source"] for t in real} == {"real"}
    assert sorted(t.type for t in real) == sorted(alf.TASK_TYPES)
    assert all(t.id.startswith("valid_seen/") and t.split == "valid_seen" for t in real)
    assert real == alf.AlfWorld.make_tasks("valid_seen", 20, seed=0)
    assert alf.AlfWorld.make_tasks("valid_seen", 3, seed=0) == real[:3]
    assert [t.id for t in alf.AlfWorld.make_tasks("valid_seen", 20, seed=1)] != [t.id for t in real]
    env = alf.AlfWorld()
    for task in real[:2]:
        _, info, result, _, _ = _play_expert(env, task)
        assert result.won and info["gamefile"].startswith(str(data))
    env.close()
    # No valid_unseen in the user's data: auto falls back to synthesized games; "real" says why.
    assert alf.AlfWorld.make_tasks("valid_unseen", 2, cache_dir=str(tmp_path / "c"))[0].payload[
        "source"] == "synth"
    with pytest.raises(base.EnvError, match="ALFWORLD_DATA"):
        alf.AlfWorld.make_tasks("valid_unseen", 2, source="real")


def test_task_type_of_paths():
    root = "/data/json_2.1.1/train"
    assert alf.task_type_of(f"{root}/pick_and_place_simple-Mug-None-Desk-1/trial_T1") == (
        "pick_and_place")
    assert alf.task_type_of(f"{root}/pick_two_obj_and_place-Pen-None-Desk-1/trial_T1") == (
        "pick_two_obj_and_place")
    assert alf.task_type_of(f"{root}/pick_clean_then_place_in_recep-Mug-None-Shelf-1/t") == (
        "pick_clean_then_place_in_recep")
    assert alf.task_type_of(f"{root}/pick_and_place_with_movable_recep-Pen-Mug-Desk-3/t") is None


def test_missing_alfworld_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "alfworld.agents.environment.alfred_tw_env", None)
    with pytest.raises(base.EnvError, match=r"pip install alfworld==0\.4\.2"):
        alf.require_alfworld()
    task = alf.synth_tasks("train", 1, cache_dir=str(tmp_path))[0]
    with pytest.raises(base.EnvError, match=r"pip install -e '\.\[envs\]'"):
        alf.AlfWorld().reset(task)
    assert base.env_class("alfworld") is alf.AlfWorld


def test_pool_plays_the_games(games):
    from skilljax.envs.pool import EnvPool
    cache, tasks = games
    with EnvPool("alfworld", num_workers=2) as pool:
        resets = pool.reset(tasks, [0] * len(tasks))
        assert all(r.failure is None for r in resets)
        live, won = set(range(len(tasks))), set()
        while live:
            out = pool.step(pool.expert_actions(sorted(live)))
            for i, r in out.items():
                if r.done:
                    live.discard(i)
                    won |= {i} if r.won else set()
        assert won == set(range(len(tasks)))
