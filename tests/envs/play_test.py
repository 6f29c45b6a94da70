"""envs.play: the expert wins every seeded test task through the EnvPool; random play rarely."""

import json
import os

import pytest

from tests.conftest import run_module


def play(*args, env=None):
    proc = run_module("skilljax.envs.play", *args, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name,random_at_most", [("chores", 0.1), ("countdown", 0.5)])
def test_expert_wins_all_50_and_random_far_less(name, random_at_most):
    expert = play("--env", name, "--policy", "expert", "--episodes", 50, "--workers", 2)
    assert expert["success_rate"] == 1.0 and expert["episodes"] == 50
    assert expert["failures"] == 0 and expert["env_steps_per_s"] > 0
    rand = play("--env", name, "--policy", "random", "--episodes", 50, "--workers", 2)
    assert rand["success_rate"] <= random_at_most  # measured: chores 0.04, countdown 0.22


@pytest.mark.slow  # in `bash run.sh test-slow`: generates games
def test_textworld_through_play(tmp_path):
    env = dict(os.environ, SKILLJAX_CACHE=str(tmp_path))
    out = play("--env", "textworld_cooking", "--policy", "expert", "--episodes", 4, "--workers", 2,
               "--tasks", "difficulty=simple", env=env)
    assert out["success_rate"] == 1.0 and out["per_type"] == {"simple": 1.0}


def test_bad_policy_is_rejected():
    proc = run_module("skilljax.envs.play", "--env", "chores", "--policy", "smart", check=False)
    assert proc.returncode != 0 and "invalid choice: 'smart'" in proc.stderr
