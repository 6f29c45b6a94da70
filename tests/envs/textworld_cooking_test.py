"""TextWorld-Cooking: task lists, the game cache, the rules of play, the expert.

Generates ten small games (~2 s each, two background processes) into a temporary cache.
Run with `-s` to see the measured generation and step times.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("textworld")

from skilljax.envs import base
from skilljax.envs import textworld_cooking as twc


@pytest.fixture(scope="module")
def games(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("twc_cache"))
    start = time.perf_counter()
    made = {
        "train": twc.TextWorldCooking.make_tasks("train", 4, seed=0, cache_dir=cache),
        "test": twc.TextWorldCooking.make_tasks("test", 2, seed=0, cache_dir=cache),
        "hard": twc.TextWorldCooking.make_tasks("train", 2, seed=0, difficulty="hard",
                                                cache_dir=cache),
    }
    queued = time.perf_counter() - start
    all_tasks = [t for ts in made.values() for t in ts]
    twc.prepare(all_tasks)
    total = time.perf_counter() - start
    print(f"\n[measure] make_tasks returned in {queued * 1e3:.0f} ms; {len(all_tasks)} games built "
          f"by {twc.GENERATION_WORKERS} background processes in {total:.1f} s "
          f"({total / len(all_tasks):.2f} s/game wall, start-up included)")
    assert queued < 1.0  # the games are built in the background
    return cache, made


def _game(task):
    import textworld
    return textworld.Game.load(task.payload["game_file"].replace(".z8", ".json"))


def test_task_lists_are_deterministic_disjoint_and_serialisable(tmp_path):
    train = twc.tasks("train", 50, seed=3, cache_dir=str(tmp_path))
    assert train == twc.tasks("train", 50, seed=3, cache_dir=str(tmp_path))
    assert train[:10] == twc.tasks("train", 10, seed=3, cache_dir=str(tmp_path))
    test = twc.tasks("test", 50, seed=3, cache_dir=str(tmp_path))
    other_seed = twc.tasks("train", 50, seed=4, cache_dir=str(tmp_path))
    for a, b in [(train, test), (train, other_seed)]:
        assert not {t.payload["game_seed"] for t in a} & {t.payload["game_seed"] for t in b}
        assert not {t.payload["game_file"] for t in a} & {t.payload["game_file"] for t in b}
    assert len({t.id for t in train}) == 50
    assert {t.payload["settings"]["split"] for t in test} == {"test"}  # TextWorld's food split
    assert [base.Task.from_json(json.loads(json.dumps(t.to_json()))) for t in train] == train
    assert not os.listdir(tmp_path)  # `tasks` generates nothing
    # Simple games cycle through the four cook/cut gates; mixed is 4:1 simple:hard (app. E) and
    # reuses the simple and hard games.
    gates = [(t.payload["settings"]["cook"], t.payload["settings"]["cut"]) for t in train[:8]]
    assert len(set(gates[:4])) == 4 and gates[:4] == gates[4:]
    mixed = twc.tasks("train", 10, seed=3, difficulty="mixed", cache_dir=str(tmp_path))
    assert [t.type for t in mixed] == ["simple"] * 4 + ["hard"] + ["simple"] * 4 + ["hard"]
    hard = twc.tasks("train", 2, seed=3, difficulty="hard", cache_dir=str(tmp_path))
    assert [t for t in mixed if t.type == "simple"] == train[:8]
    assert [t for t in mixed if t.type == "hard"] == hard
    with pytest.raises(ValueError):
        twc.tasks("dev", 1)


@pytest.mark.slow  # in `bash run.sh test-slow`: generates games
def test_simple_and_hard_settings_match_the_paper(games):
    _, made = games
    for task in made["train"] + made["test"]:
        game = _game(task)
        assert sum(info.type == "r" for info in game.infos.values()) == 1  # app. E: room=1
        assert len(game.metadata["ingredients"]) == 1                     # ingredients=1
    for task in made["hard"]:
        game = _game(task)
        assert sum(info.type == "r" for info in game.infos.values()) == 6  # app. E: room=6
        assert len(game.metadata["ingredients"]) == 2                     # ingredients=2
        assert task.payload["settings"]["cook"] and task.payload["settings"]["cut"]
        assert task.type == "hard"


def test_train_and_test_recipes_come_from_textworlds_disjoint_splits(games):
    from textworld.challenges.tw_cooking import cooking

    _, made = games
    train_preps = cooking.FOOD_PREPARATIONS_SPLITS["train"]
    for task in made["train"] + made["hard"]:
        for food, cook, cut in _game(task).metadata["ingredients"]:
            assert (cook, cut) in train_preps[food]
    for task in made["test"]:
        for food, cook, cut in _game(task).metadata["ingredients"]:
            assert (cook, cut) not in train_preps.get(food, [])


def test_cache_holds_only_whole_games_and_is_reused(games):
    cache, made = games
    assert not glob.glob(os.path.join(cache, ".tmp-*"))
    for task in [t for ts in made.values() for t in ts]:
        game_dir = os.path.dirname(task.payload["game_file"])
        assert sorted(os.listdir(game_dir)) == ["game.json", "game.z8"]
    mtimes = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(cache, "*", "game.z8"))}
    start = time.perf_counter()
    again = twc.TextWorldCooking.make_tasks("train", 4, seed=0, cache_dir=cache, background=False)
    assert time.perf_counter() - start < 0.5
    assert again == made["train"]
    assert not twc.generate(again[0].payload)
    assert mtimes == {p: os.path.getmtime(p) for p in mtimes}


def _spawn_generate(task):
    code = ("import json, sys; from skilljax.envs import textworld_cooking as t; "
            "print(t.generate(json.loads(sys.argv[1])))")
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(task.payload)],
                            stdout=subprocess.PIPE, text=True)


def test_crashed_generator_leaves_no_game_and_reset_builds_it(games):
    cache, _ = games
    task = twc.tasks("train", 1, seed=99, cache_dir=cache)[0]
    game_dir = os.path.dirname(task.payload["game_file"])
    proc = _spawn_generate(task)
    deadline = time.time() + 30
    while not glob.glob(game_dir.replace(task.payload["name"], f".tmp-{task.payload['name']}-*")):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # dies holding the lock, mid-generation
    proc.wait()
    assert not os.path.exists(game_dir)
    env = twc.TextWorldCooking()
    start = time.perf_counter()
    obs, _ = env.reset(task)  # the lock died with its holder: reset builds the game itself
    print(f"\n[measure] reset that builds its own game: {time.perf_counter() - start:.2f} s")
    assert "You are hungry!" in obs
    assert not glob.glob(os.path.join(cache, ".tmp-*"))  # the crash's leftovers are cleaned up
    assert sorted(os.listdir(game_dir)) == ["game.json", "game.z8"]
    env.close()


def test_concurrent_generators_build_a_game_once(games):
    cache, _ = games
    task = twc.tasks("test", 1, seed=77, difficulty="hard", cache_dir=cache)[0]
    procs = [_spawn_generate(task) for _ in range(2)]
    outputs = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert [p.returncode for p in procs] == [0, 0]
    assert outputs == ["False", "True"]  # one built it, the other waited on its lock
    game_dir = os.path.dirname(task.payload["game_file"])
    assert sorted(os.listdir(game_dir)) == ["game.json", "game.z8"]
    assert not glob.glob(os.path.join(cache, ".tmp-*"))


def test_expert_wins_every_game(games):
    _, made = games
    env = twc.TextWorldCooking()
    steps, step_time = 0, 0.0
    for task in [t for ts in made.values() for t in ts]:
        obs, info = env.reset(task)
        assert "You are hungry!" in obs and "$$" not in obs and not obs.rstrip().endswith(">")
        assert info["admissible_actions"] == sorted(info["admissible_actions"])
        for _ in range(env.max_steps):
            action = env.expert_action()
            assert action in env.admissible_actions()
            start = time.perf_counter()
            result = env.step(action)
            step_time += time.perf_counter() - start
            steps += 1
            assert result.info["valid"] and result.info["command"] == action
            json.dumps(result.to_json())  # crosses the worker boundary
            if result.done:
                break
        assert result.won and result.reward == base.SUCCESS_REWARD and not result.truncated
        assert "*** The End ***" in result.observation and "RESTART" not in result.observation
    print(f"\n[measure] env step: {step_time / steps * 1e3:.1f} ms mean over {steps} expert steps")
    env.close()


def test_expert_reads_the_cookbook_and_recovers_off_track(games):
    _, made = games
    env = twc.TextWorldCooking()
    env.reset(made["hard"][0])
    assert env.expert_action() == "inventory"  # the walkthrough: inventory, then the cookbook
    for action in ["look", "inventory", "look"]:  # off the walkthrough
        env.step(action)
    for _ in range(env.max_steps - 3):
        result = env.step(env.expert_action())  # the shortest plan from this state
        if result.done:
            break
    assert result.won
    env.close()


def test_invalid_actions_cost_a_step_and_the_limit_truncates(games):
    _, made = games
    env = twc.TextWorldCooking()
    env.reset(made["train"][0])
    result = env.step("dance")  # not a verb the game knows: never sent to it
    assert (result.observation, result.info["valid"], result.info["step"]) == (
        base.Env.invalid_observation, False, 1)
    result = env.step("go south")  # one room: the game answers, but the action is not admissible
    assert result.observation == "You can't go that way." and not result.info["valid"]
    assert result.info["verb"] == "go" and result.info["object"] == "south"
    for i in range(3, env.max_steps + 1):
        result = env.step("look")
        assert result.info["valid"] and result.done == (i == env.max_steps)
    assert result.truncated and not result.won and result.reward == 0.0
    with pytest.raises(base.EnvError):
        env.step("look")
    env.close()


def test_control_characters_are_not_interpreter_hot_keys(games, tmp_path, monkeypatch):
    # A tiny policy sampled "dice orange bell\x0einventory": Ctrl-N is the interpreter's
    # "recording on" hot key, which wrote a file named by the rest of the line into the cwd.
    _, made = games
    monkeypatch.chdir(tmp_path)
    env = twc.TextWorldCooking()
    env.reset(made["train"][0])
    result = env.step("look\x0einventory\x01")
    assert result.info["command"] == "look inventory"
    assert "Recording" not in result.observation and "Hot key" not in result.observation
    assert os.listdir(tmp_path) == []
    env.close()


def test_burning_an_ingredient_loses(games):
    _, made = games
    env = twc.TextWorldCooking()
    task = next(t for t in made["train"] if t.payload["settings"]["cook"])
    env.reset(task)
    while not (action := env.expert_action()).startswith("cook "):
        env.step(action)
    assert not env.step(action).done
    result = env.step(action)  # ReuseRL §7.2: cooking twice burns the food
    assert "burned" in result.observation and result.info["lost"]
    assert result.done and not result.won and not result.truncated and result.reward == 0.0
    assert result.info["verb"] == "cook" and result.info["target"] in ("stove", "oven", "bbq")
    env.close()


def test_parse_command():
    assert twc.parse_command("take red potato from counter") == ("take", "red potato", "counter")
    assert twc.parse_command("dice carrot with knife") == ("dice", "carrot", "knife")
    assert twc.parse_command("prepare meal") == ("prepare", "meal", None)
    assert twc.parse_command("inventory") == ("inventory", None, None)
    assert twc.parse_command("") == ("", None, None)


def test_default_cache_dir(monkeypatch):
    monkeypatch.setenv("SKILLJAX_CACHE", "/data/cache")
    assert twc.default_cache_dir() == "/data/cache/textworld_cooking"
    assert twc.tasks("train", 1)[0].payload["game_file"].startswith("/data/cache/textworld_cooking/")
    monkeypatch.delenv("SKILLJAX_CACHE")
    assert twc.default_cache_dir() == os.path.expanduser("~/.cache/skilljax/textworld_cooking")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_switching_games_does_not_leak(games):
    _, made = games
    all_tasks = [t for ts in made.values() for t in ts]
    env = twc.TextWorldCooking()

    def rss_mb():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    for task in all_tasks * 2:  # warm up
        env.reset(task)
    before = rss_mb()
    for task in all_tasks * 10:
        env.reset(task)
    # jericho's in-place load grew ~0.5 MB per switch (~40 MB here); a fresh interpreter does not.
    assert rss_mb() - before < 12
    env.close()
