"""The trainer end to end on the runlocal config: outputs, resume, evaluate, sweep listing."""

import json
import math
import subprocess
import sys

import ml_collections
import pytest

from skilljax import config as config_lib
from skilljax import experiment
from skilljax.rl import warm_start
from skilljax.tokenizer import Tokenizer
from tests.conftest import ROOT, run_module

CONFIG = str(ROOT / "configs" / "default.py")


def test_overrides_and_errors():
    c = config_lib.load_config(CONFIG + ":runlocal", ["--config.rl.steps=3",
                                                     "--config.rl.learning_rate=1e-3",
                                                     "--config.skills.filter=false"])
    assert c.rl.steps == 3 and c.rl.learning_rate == 1e-3 and c.skills.filter is False
    with pytest.raises(KeyError, match="no 'nope'"):
        config_lib.load_config(CONFIG, ["--config.rl.nope=1"])
    with pytest.raises(KeyError, match="did you mean 'learning_rate'"):
        config_lib.load_config(CONFIG, ["--config.rl.learning_rat=1e-3"])
    with pytest.raises(ValueError, match="expected true or false"):
        config_lib.load_config(CONFIG, ["--config.skills.filter=maybe"])
    # Nested keys of the schema, typed placeholders included: a QwenConfig field of the policy.
    c = config_lib.load_config(CONFIG + ":runlocal", ["--config.model.remat=dots",
                                                      "--config.model.lora.rank=4",
                                                      "--config.model.overrides.rope_theta=1e4"])
    assert c.model.remat == "dots" and c.model.overrides.rope_theta == 1e4
    model = experiment.build_model(c, Tokenizer.train(["a b c"], vocab_size=300))
    assert model.cfg.remat == "dots" and model.cfg.rope_theta == 1e4 and model.cfg.num_layers == 1
    assert model.cfg.lora_rank == 4 and model.cfg.param_dtype == "float32"
    with pytest.raises(ValueError, match="remat='some'"):
        experiment.build_model(config_lib.load_config(CONFIG + ":runlocal", [
            "--config.model.remat=some"]), Tokenizer.train(["a b c"], vocab_size=300))
    with pytest.raises(ValueError, match="Unknown variant"):
        config_lib.load_config(CONFIG + ":variant=magic")
    c = config_lib.load_config(CONFIG)
    assert warm_start.bare_task_options(c) == [{"source": "convention"}, {"source": "random"}]
    one = ml_collections.ConfigDict({"sft": {"bare_task_options": {"source": "convention"}}})
    assert warm_start.bare_task_options(one) == [{"source": "convention"}]  # a single generator


# ReuseRL's segmentation cost on too (it composes with the curriculum), and several optimiser
# steps per RL step.
REUSE = ("--config.reuse.mode=segcost", "--config.rl.mini_batch_size=8")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    wd = tmp_path_factory.mktemp("run")
    # With ReuseRL's segmentation cost on too: it composes with the curriculum.
    run_module("skilljax.train", "--config", CONFIG + ":runlocal", "--workdir", wd, *REUSE)
    return wd


def test_runlocal_writes_everything(workdir):
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["wall_s"] > 0
    timing = summary["timing_s"]  # seconds per phase, within the run's wall time
    assert {"build", "warm_start", "eval", "rollout", "learner", "validation"} <= set(timing)
    assert 0 < sum(timing.values()) <= summary["wall_s"] + 1
    for phase in ("initial", "final"):
        for mode in ("with_skills", "without_skills"):
            block = summary["eval"][phase][mode]
            assert 0 <= block["success_rate"] <= 1 and block["tokens_per_step"] > 0
            assert set(block["per_task"]) == {"clean", "heat", "cool", "light", "place", "prepare"}
    w, wo = summary["eval"]["initial"]["with_skills"], summary["eval"]["initial"]["without_skills"]
    assert w["tokens_per_step"] > wo["tokens_per_step"]  # skill text costs tokens
    rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert "deltas" in rows[1] and "val_with_skills" in rows[1]
    for r in (rows[1], rows[3]):  # the full bank is tracked at every update
        assert {"val_without_skills", "val_full_skills", "active_after"} <= set(r)
    for r in rows:
        assert r["optimizer_steps"] == -(-r["trained_samples"] // 8)  # rl.mini_batch_size
        assert r["episodes"] == r["episodes_local"] == 4
    assert json.loads((workdir / "config.json").read_text()) == summary["config"]
    assert all("reuse_dict_size" in r and "shaped_reward_mean" in r for r in rows)
    assert summary["config"]["reuse"]["mode"] == "segcost"
    assert [u["step"] for u in summary["curriculum"]] == [2, 4]
    assert summary["warm_start"]["samples"] > 0
    for png in ("success.png", "deltas.png", "skills.png", "tokens.png", "eval.png"):
        assert (workdir / "plots" / png).stat().st_size > 1000
    assert (workdir / "tokenizer" / "tokenizer.json").exists()


def test_rollouts_ahead_resume_a_synchronous_run(workdir, tmp_path):
    """`rl.max_staleness=1` from the fixture's step-2 checkpoint: step 3 follows a sync point (the
    checkpoint, the curriculum update) and rolls out in line; step 4's rollout runs during step 3,
    on the weights before step 3's update, and is trained with truncated importance weights."""
    import shutil
    wd = tmp_path / "ahead"
    shutil.copytree(workdir, wd)
    shutil.rmtree(wd / "checkpoints" / "4")
    (wd / "summary.json").unlink()
    args = ("--config", CONFIG + ":runlocal", "--workdir", wd, *REUSE,
            "--config.rl.max_staleness=1")
    refused = run_module("skilljax.train", *args, check=False)
    assert refused.returncode and "rl.behaviour_is_cap > 0 (e.g." in refused.stderr
    proc = run_module("skilljax.train", *args, "--config.rl.behaviour_is_cap=2")
    assert "resumed from step 2" in proc.stdout
    rows = [json.loads(l) for l in (wd / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    sync, ahead = rows[2], rows[3]
    assert sync["staleness"] == 0 and sync["rollout_wait_s"] == sync["rollout_s"]
    assert ahead["staleness"] == 1 and ahead["rollout_wait_s"] <= ahead["rollout_s"]
    # Sampled by the weights one update older than the learner's: they differ (the synchronous
    # step's behaviour and old policy are the same weights, up to rounding).
    assert abs(ahead["behaviour_kl"]) > 1e-6 > abs(sync["behaviour_kl"])
    assert ahead["is_weight_mean"] != 1.0 and 0 <= ahead["is_truncated_frac"] <= 1
    summary = json.loads((wd / "summary.json").read_text())
    assert summary["eval"]["final"] and summary["timing_s"]["rollout"] > 0


@pytest.mark.slow  # in `bash run.sh test-slow`: an end-to-end run of minutes
def test_released_step_zero_update_from_the_config(tmp_path):
    """`skills.validate_at_start` + `clamp_start=false`: the released code's update before step 1
    uses the last budget, 0, so it skips the with-skills pass and withdraws every file."""
    run_module("skilljax.train", "--config", CONFIG + ":runlocal", "--workdir", tmp_path,
               "--config.rl.steps=2", "--config.skills.validate_at_start=true",
               "--config.skills.clamp_start=false")
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["active_after"] == [] and "val_with_skills" not in rows[0]
    assert "val_full_skills" in rows[0] and rows[1]["active_skills"] == 0
    assert all({"optimizer_steps", "episodes", "episodes_local"} <= set(r) for r in rows)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["curriculum"][0]["step"] == 0 and summary["curriculum"][0]["deltas"] == {}
    assert summary["curriculum"][0]["budget"] == 0


def test_notebook_executes_on_the_workdir(workdir):
    """notebooks/curriculum_analysis.ipynb, run by a Jupyter kernel on the runlocal workdir: the
    committed sweep's figure and table, the run's curriculum table, and its figures inline."""
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(ROOT / "notebooks" / "curriculum_analysis.ipynb", as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code")  # stored clean
    env = __import__("os").environ
    old, env["WORKDIR"] = env.get("WORKDIR"), str(workdir)
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3").execute()
    finally:
        env.pop("WORKDIR") if old is None else env.__setitem__("WORKDIR", old)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    figures = sorted(p.name for p in (workdir / "plots").glob("*.png"))
    assert len(images) == 1 + len(figures) and "success.png" in figures  # the sweep + the run's
    markdown = "\n".join(o["data"]["text/markdown"] for o in outputs
                         if "text/markdown" in o.get("data", {}))
    summary = json.loads((workdir / "summary.json").read_text())
    assert f"**{workdir.name}**" in markdown and "| curriculum | 3 |" in markdown
    assert markdown.count("\n| ") >= len(summary["curriculum"]) + 7  # every update, every arm


def test_rerun_resumes_and_finishes(workdir):
    before = (workdir / "summary.json").read_text()
    proc = run_module("skilljax.train", "--config", CONFIG + ":runlocal", "--workdir", workdir,
                      *REUSE)
    assert "resumed from step 4" in proc.stdout and "warm start" not in proc.stdout
    assert json.loads((workdir / "summary.json").read_text())["eval"] == json.loads(before)["eval"]


def _comparable(row: dict) -> dict:
    """A metrics line without its wall-clock measurements."""
    return {k: v for k, v in row.items() if not (k.endswith("_s") or k.endswith("per_s"))}


@pytest.mark.slow  # in `bash run.sh test-slow`: an end-to-end run of minutes
def test_kill_9_during_rl_then_resume_equals_an_uninterrupted_run(workdir, tmp_path):
    """SIGKILL at a random moment of RL (after RL step k's line, plus up to 0.5 s: mid-rollout,
    mid-update or mid-checkpoint), then a re-run: every metrics line (losses, success, the
    curriculum's deltas and active files, ReuseRL's dictionary) and the curriculum history equal
    the uninterrupted run's (`workdir`, same config). Equal, not close: both are the same XLA
    programs on the same machine, fed the same keys (named streams by step), tasks (by seed and
    step), optimizer state and host state from the checkpoint."""
    import random
    import signal
    import time as time_lib

    chooser = random.Random()
    kill_after, delay = chooser.randint(1, 3), chooser.uniform(0.0, 0.5)
    print(f"kill after the line of RL step {kill_after} + {delay:.2f} s")
    wd = tmp_path / "killed"
    args = [sys.executable, "-m", "skilljax.train", "--config", CONFIG + ":runlocal",
            "--workdir", str(wd), *REUSE]
    env = {k: v for k, v in __import__("os").environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, env=env)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if f"] step {kill_after}/" in line:  # "I1207 15:42:03.512 p0 step 3] step 3/6: ..."
            time_lib.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "".join(seen)[-3000:]
    assert not (wd / "summary.json").exists()
    resumed = run_module("skilljax.train", "--config", CONFIG + ":runlocal", "--workdir", wd,
                         *REUSE)
    assert "resumed from step" in resumed.stdout and "warm start 10/" not in resumed.stdout
    ours = [_comparable(json.loads(l)) for l in (wd / "metrics.jsonl").read_text().splitlines()]
    theirs = [_comparable(json.loads(l))
              for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert ours == theirs
    a, b = (json.loads((w / "summary.json").read_text()) for w in (wd, workdir))
    assert a["curriculum"] == b["curriculum"] and a["eval"] == b["eval"]


@pytest.mark.slow  # in `bash run.sh test-slow`: an end-to-end run of minutes
def test_sweep_arms_share_a_cached_warm_start(tmp_path):
    cache = tmp_path / "cache"
    first, second = tmp_path / "a", tmp_path / "b"
    run_module("skilljax.train", "--config", CONFIG + ":runlocal", "--workdir", first,
               f"--config.sft.cache_dir={cache}", "--config.rl.steps=0")
    proc = run_module("skilljax.train", "--config", CONFIG + ":runlocal,variant=no_skills",
                      "--workdir", second, f"--config.sft.cache_dir={cache}",
                      "--config.rl.steps=0")
    assert "warm start 10/10" not in proc.stdout  # not trained again
    a, b = (json.loads((w / "summary.json").read_text()) for w in (first, second))
    assert b["warm_start"]["cached_from"].startswith(str(cache))
    assert "cached_from" not in a["warm_start"]
    assert a["eval"]["initial"] == b["eval"]["initial"]  # the same policy and tokenizer
    assert len(list(cache.iterdir())) == 1
    # A change to a warm-start input misses the cache.
    third = tmp_path / "c"
    run_module("skilljax.train", "--config", CONFIG + ":runlocal", "--workdir", third,
               f"--config.sft.cache_dir={cache}", "--config.rl.steps=0", "--config.sft.steps=12")
    assert len(list(cache.iterdir())) == 2


@pytest.mark.slow  # in `bash run.sh test-slow`: an end-to-end run of minutes
def test_evaluate_cli(workdir):
    """From --workdir alone (its config.json); an override changes the evaluation only."""
    proc = run_module("skilljax.evaluate", "--workdir", workdir)
    block = json.loads(proc.stdout.strip().splitlines()[-1])
    assert block["step"] == 4 and "with_skills" in block and "without_skills" in block
    assert (workdir / "eval_4.json").exists()
    summary = json.loads((workdir / "summary.json").read_text())
    assert block["with_skills"]["episodes"] == summary["eval"]["final"]["with_skills"]["episodes"]
    proc = run_module("skilljax.evaluate", "--workdir", workdir, "--config.eval.seeds=2")
    block2 = json.loads(proc.stdout.strip().splitlines()[-1])
    assert block2["with_skills"]["episodes"] == 2 * block["with_skills"]["episodes"]


@pytest.mark.parametrize("tool", ["skilljax.train", "skilljax.evaluate",
                                  "skilljax.tools.export_hf"])
def test_help_lists_configs_their_arguments_and_overrides(tool):
    out = run_module(tool, "--help").stdout
    for name in config_lib.config_files():
        assert name in out
    for text in ("--config.section.key=value", "config.json", "runlocal", "variant='curriculum'",
                 "index=''", "variant: grpo | sequential | sage"):
        assert text in out, text
    assert config_lib.config_arguments(ROOT / "configs" / "default.py") == \
        {"seed": 0, "runlocal": False, "variant": "curriculum", "visual": False}


def test_evaluate_step_flag_and_the_old_name():
    proc = subprocess.run([sys.executable, "-m", "skilljax.evaluate", "--workdir", "/nonexistent",
                           "--checkpoint", "3"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "--checkpoint STEP is now --step STEP" in proc.stderr


def test_export_a_trained_workdir(workdir, tmp_path):
    """The trained policy leaves as an HF directory transformers runs, with the run's tokenizer."""
    import numpy as np
    import transformers
    from skilljax.rl.checkpoint import Checkpointer
    from tests.conftest import torch_logits
    out = tmp_path / "hf"
    run_module("skilljax.tools.export_hf", "--workdir", workdir, "--out", out)  # its config.json
    c = config_lib.load_config(CONFIG + ":runlocal")
    model = experiment.build_model(c, Tokenizer.load(workdir / "tokenizer"))
    ckpt = Checkpointer(workdir / "checkpoints")
    ckpt.restore(model, None)
    ckpt.close()
    from skilljax.models import qwen
    ids = [[3, 40, 7, 99, 12]]
    mask = np.ones((1, 5), bool)
    ours = np.asarray(model(np.asarray(ids), np.asarray([list(range(5))]),
                            qwen.causal_mask(mask))[0])
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_allclose(torch_logits(hf, ids), ours, atol=1e-4)
    assert (out / "tokenizer.json").read_bytes() == (workdir / "tokenizer" / "tokenizer.json").read_bytes()


@pytest.mark.slow  # in `bash run.sh test-slow`: an end-to-end run of minutes
def test_search_skill0_runlocal(tmp_path):
    """The Search-QA paper config's runlocal variant: <search>/<answer> format, curriculum over
    the four question-type files, retrieval as at paper scale: an index built on disk, one
    retrieval service started by the trainer, the env workers its clients."""
    from skilljax.envs import search_index
    index = search_index.build("generated", "bm25", tmp_path / "index", progress=False)
    cfg = str(ROOT / "configs" / "search_skill0.py")
    run_module("skilljax.train", "--config", f"{cfg}:runlocal,index={index}", "--workdir",
               tmp_path / "run")
    tmp_path = tmp_path / "run"
    assert json.loads((tmp_path / "config.json").read_text())["env"]["kwargs"] == \
        {"retriever": "service", "service_index": str(index), "top_k": 3}
    assert (tmp_path / "retrieval_service.log").exists()
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r.get("failures", 0) == 0 for r in rows)
    assert [r["sidecar_restarts"] for r in rows if "sidecar_restarts" in r] == [0, 0]
    summary = json.loads((tmp_path / "summary.json").read_text())
    block = summary["eval"]["final"]["with_skills"]
    assert set(block["per_task"]) <= {"direct", "attribute", "comparison", "multihop"}
    assert block["tokens_per_step"] > summary["eval"]["final"]["without_skills"]["tokens_per_step"]
    assert summary["config"]["skills"]["budgets"] == [5, 3, 0]
    with pytest.raises(ValueError, match="checkpoint="):
        config_lib.load_config(cfg)
    full = config_lib.load_config(cfg + ":checkpoint=/models/qwen")
    assert (full.rl.learning_rate, full.rl.group_size, full.rl.tasks_per_step) == (1e-6, 8, 128)
    assert (full.rl.invalid_penalty, full.eval.temperature, full.rl.steps) == (0.01, 0.4, 180)
    # Released: AdamW decay 0.01, one optimiser step per 512 step samples, validation questions
    # from the test split; exact match pays 1 (the env's reward).
    assert (full.rl.weight_decay, full.rl.mini_batch_size, full.skills.val_split) == \
        (0.01, 512, "test")
    from skilljax.envs.search_qa import SearchQA
    assert SearchQA.success_reward == 1.0
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["optimizer_steps"] == -(-r["trained_samples"] // 4) for r in rows)


@pytest.mark.slow  # in `bash run.sh test-slow`: an end-to-end run of minutes
def test_alfworld_skill0_runlocal(tmp_path):
    """The ALFWorld paper config's runlocal variant on synthesized games (needs `alfworld`)."""
    pytest.importorskip("alfworld")
    cfg = str(ROOT / "configs" / "alfworld_skill0.py")
    run_module("skilljax.train", "--config", cfg + ":runlocal", "--workdir", tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["skills"]["budgets"] == [6, 3, 0]
    assert summary["eval"]["final"]["with_skills"]["tokens_per_step"] > 0
    full = config_lib.load_config(cfg + ":checkpoint=/models/qwen")
    assert (full.rl.learning_rate, full.rl.tasks_per_step, full.rl.invalid_penalty) == (1e-6, 16, 0.1)
    assert (full.env.kwargs.max_steps, full.prompt.require_think, full.env.test_split) == \
        (50, True, "valid_seen")
    assert (full.rl.weight_decay, full.rl.mini_batch_size, full.skills.val_split) == \
        (0.01, 256, "valid_seen")
    assert experiment.rollout_config(full, evaluation=False).max_turns == 50  # the env's kwarg


def test_sweep_lists_the_ablations():
    out = subprocess.run([sys.executable, str(ROOT / "launch" / "sweep.py"), CONFIG, "--workdir",
                          "/tmp/x", "--print"], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout.splitlines()
    assert len(out) == 21 and all("skilljax.train" in line for line in out)  # 7 arms × 3 seeds
    assert any("variant=no_skills,seed=1" in line for line in out)
    assert all("--config.sft.cache_dir=/tmp/x/warm_start_cache" in line for line in out)
    only = lambda *a: subprocess.run([sys.executable, str(ROOT / "launch" / "sweep.py"), CONFIG,
                                      "--workdir", "/tmp/x", "--print", "--only", *a],
                                     capture_output=True, text=True, cwd=ROOT)
    kept = only("seed=1").stdout.splitlines()
    assert len(kept) == 7 and all("seed=1" in line for line in kept)
    missing = only("seed=9")
    assert missing.returncode != 0 and "matches none" in missing.stderr


def test_reuse_step_on_expert_episodes():
    """ReuseRL wiring on real trajectories: chores experts → φ → dictionary → SegCost scores."""
    import jax
    import numpy as np

    from skilljax import rewards
    from skilljax.envs.chores import Chores
    from skilljax.envs.pool import EnvPool
    from skilljax.rl.rollout import RolloutConfig, rollout
    from skilljax.skills.segmentation import SegmentationConfig, SegmentationCost
    from skilljax.tokenizer import Tokenizer

    tok = Tokenizer.train(["take use put go to"], vocab_size=300)
    with EnvPool("chores", num_workers=1) as pool:
        res = rollout(None, tok, pool, Chores.make_tasks("train", 8, seed=4),
                      RolloutConfig(group_size=2, max_turns=10), jax.random.key(0), expert=True)
    assert all(t.won for t in res.trajectories)
    cost = SegmentationCost(SegmentationConfig(mode="segcost", horizon=10, max_phrase_len=3,
                                               alphabet=("explore", "open", "take", "process",
                                                         "put")))
    terms, m = rewards.reuse_step(cost, "chores", res)
    assert m["reuse_corpus"] == m["reuse_buffer"] == 16 and m["reuse_dict_size"] > 0
    assert 0 < m["reuse_seg_ratio"] < 1 and m["reuse_top_phrases"]
    plain = rewards.trajectory_rewards(res)
    shaped = rewards.trajectory_rewards(res, terms)
    assert np.all(shaped < plain) and np.all(shaped > plain - 10)
    # The pure round-length arm charges every step: never less than the segmentation cost.
    length = SegmentationCost(SegmentationConfig(mode="length", horizon=10))
    assert np.all(rewards.trajectory_rewards(res, rewards.reuse_step(length, "chores", res)[0])
                  <= shaped)
    assert rewards.reuse_step(SegmentationCost(SegmentationConfig(mode="none")), "chores",
                                res)[0] == []


def test_evaluation_plays_once_when_no_task_has_skill_text(monkeypatch):
    import jax

    from skilljax import evaluate
    from skilljax.envs.chores import Chores
    from skilljax.envs.pool import EnvPool
    from skilljax.rl.rollout import RolloutConfig, ThinkAction
    from skilljax.tokenizer import Tokenizer

    played, real = [], evaluate.rollout

    def expert_rollout(sampler, tok, pool, tasks, cfg, key, **kw):  # the real loop, expert-driven
        played.append(kw["skill_context"])
        return real(None, tok, pool, tasks, cfg, key, expert=True, **kw)

    monkeypatch.setattr(evaluate, "rollout", expert_rollout)
    tok = Tokenizer.train(["take use put go to"], vocab_size=300)
    tasks = Chores.make_tasks("test", 4, seed=1)
    with EnvPool("chores", num_workers=1) as pool:
        for contexts, plays in (({}, 1), (None, 1), ({tasks[0].type: "use the sink"}, 2)):
            played.clear()
            out = evaluate.evaluate_policy(None, tok, pool, tasks, RolloutConfig(max_turns=8),
                                           jax.random.key(0), contexts=contexts,
                                           fmt=ThinkAction(require_think=False))
            assert len(played) == plays and set(out) == {"with_skills", "without_skills"}
            assert out["with_skills"]["success_rate"] == out["without_skills"]["success_rate"] == 1


@pytest.mark.parametrize("name", [pytest.param("countdown", marks=pytest.mark.slow),
                                  # ~70 s each (game generation, alfworld's engine): slow suite.
                                  pytest.param("textworld_cooking", marks=pytest.mark.slow),
                                  pytest.param("alfworld", marks=pytest.mark.slow)])
def test_reuserl_configs_runlocal(name, tmp_path):
    """Each ReuseRL config's runlocal variant end to end; the paper settings load."""
    if name == "alfworld":
        pytest.importorskip("alfworld")
    if name == "textworld_cooking":
        pytest.importorskip("textworld")
    cfg = str(ROOT / f"configs/reuserl_{name}.py")
    run_module("skilljax.train", "--config", cfg + ":runlocal", "--workdir", tmp_path)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all("reuse_dict_size" in r and "repeat_rate" in r for r in rows)
    full = config_lib.load_config(cfg + ":checkpoint=/models/x")
    assert (full.rl.steps, full.reuse.coef, full.reuse.buffer_size, full.rl.invalid_penalty) == \
        (300, 10.0, 256, 0.01)
    assert experiment.reuse_config(full).horizon == {"countdown": 30, "textworld_cooking": 40,
                                                    "alfworld": 50}[name]
    runs = []
    module = __import__("importlib").util
    spec = module.spec_from_file_location("cfg", cfg)
    mod = module.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.sweep(lambda **kw: runs.append(kw["arg"]))
    assert {r.split(",")[0] for r in runs} == {"variant=grpo", "variant=length", "variant=segcost",
                                               "variant=segcost_no_buffer"} and len(runs) == 8
    with pytest.raises(ValueError, match="checkpoint="):
        config_lib.load_config(cfg)


def test_sweep_results_folder_collects_finished_runs(tmp_path):
    """`--results`: finished runs' evaluations land in one folder, are skipped on re-runs and feed
    the table even when their workdirs are gone."""
    sys.path.insert(0, str(ROOT / "launch"))
    try:
        import sweep
    finally:
        sys.path.pop(0)
    names = [sweep.run_name(r) for r in sweep.runs_of(CONFIG, "runlocal")]
    block = lambda s: {"success_rate": s, "per_task": {}}
    summary = {"config": {"big": "x" * 1000}, "steps": 4, "wall_s": 9.0, "curriculum": [],
               "eval": {p: {"with_skills": block(0.5), "without_skills": block(s)}
                        for p, s in (("initial", 0.25), ("final", 0.75))}}
    (tmp_path / "runs" / names[0]).mkdir(parents=True)
    (tmp_path / "runs" / names[0] / "summary.json").write_text(json.dumps(summary))
    sweep.save_result(tmp_path / "runs", tmp_path / "results", names[0])
    record = json.loads((tmp_path / "results" / f"{names[0]}.json").read_text())
    assert "config" not in record and record["eval"] == summary["eval"]
    import shutil
    shutil.rmtree(tmp_path / "runs")
    table = sweep.summary_table(tmp_path / "runs", names, tmp_path / "results")
    assert f"| {names[0]} | 0.250 → 0.750 | 0.500 → 0.500 |" in table
    assert table.count("(not finished)") == len(names) - 1
    # By arm: each seed's success and the means over the arm's finished seeds; a run that won
    # nothing has no successful-episode length (logged as 0), so it shows "–" and is not averaged.
    arm = sweep._seed_of(names[0])[0]
    twin = next(n for n in names if sweep._seed_of(n)[0] == arm and n != names[0])
    lost = {**block(0.0), "success_steps": 0.0, "rejected_rate": 0.5, "repeat_rate": 0.25,
            "episodes": 60}
    won = {**block(0.75), "success_steps": 6.0, "rejected_rate": 0.25, "repeat_rate": 0.25,
           "episodes": 60}
    for name, final in ((names[0], won), (twin, lost)):
        record = {"eval": {"initial": {"without_skills": block(0.25), "with_skills": block(0.5)},
                           "final": {"without_skills": final, "with_skills": block(0.5)}}}
        (tmp_path / "results" / f"{name}.json").write_text(json.dumps(record))
    row = next(line for line in sweep.seed_table(tmp_path / "runs", names,
                                                 tmp_path / "results").splitlines()
               if line.startswith(f"| {arm} |"))
    # The mean ± one 60-episode evaluation's binomial standard error, √(.375 · .625 / 60).
    assert row.endswith("| 0.375 ± 0.062 | 6.000 | 0.375 | 0.250 |") and "0.250 → 0.000" in row
    assert "| – |" in sweep.summary_table(tmp_path / "runs", [twin], tmp_path / "results")
    # --summary's figure: every arm's finished seeds, next to the results
    out = sweep.sweep_plot(CONFIG, "runlocal", tmp_path / "runs", names, tmp_path / "results")
    assert out == tmp_path / "results" / "sweep.png" and out.stat().st_size > 5000


SKILLFORGE = str(ROOT / "configs" / "skillforge_chores.py")


def test_skillforge_runlocal_writes_its_bank_and_replays_exactly(tmp_path):
    """SkillForge end to end (hand-written bank to start, so catalogs are in the prompts), then
    the same run replayed from the first run's teacher cache: the same bank, byte for byte."""
    first, second = tmp_path / "first", tmp_path / "replay"
    bank = "--config.evolution.initial_bank=skills/chores/skillforge_bank.json"
    run_module("skilljax.train", "--config", SKILLFORGE + ":runlocal", "--workdir", first, bank)
    records = json.loads((first / "skills" / "bank.json").read_text())["skills"]
    assert len(records) >= 6   # the hand-written six, and what the rule teacher induced
    assert all({"id", "title", "principle", "when_to_apply", "stats"} <= set(r) for r in records)
    config = json.loads((first / "config.json").read_text())
    assert config["evolution"]["embedder"] == "tfidf" and config["evolution"]["enabled"]
    rows = [json.loads(x) for x in (first / "metrics.jsonl").read_text().splitlines()]
    assert all("bank_size" in r and "skill_calls" in r for r in rows if r["step"] > 0)
    assert all(r["tokens_skill"] > 0 for r in rows if r["step"] > 0)   # the catalog is shown
    summary = json.loads((first / "summary.json").read_text())
    assert summary["evolution"]["bank_size"] == len(records)
    cache = first / "skills" / "teacher_cache.jsonl"
    assert cache.read_text().count("\n") >= summary["evolution"]["abstracted"] > 0
    run_module("skilljax.train", "--config", SKILLFORGE + ":runlocal", "--workdir", second, bank,
               "--config.evolution.teacher.kind=replay",
               f"--config.evolution.teacher.replay_from={cache}")
    assert (second / "skills" / "bank.json").read_bytes() == \
        (first / "skills" / "bank.json").read_bytes()


@pytest.mark.slow
def test_skillforge_alfworld_runlocal(tmp_path):
    run_module("skilljax.train", "--config", str(ROOT / "configs" / "skillforge_alfworld.py")
               + ":runlocal", "--workdir", tmp_path)
    records = json.loads((tmp_path / "skills" / "bank.json").read_text())["skills"]
    assert len(records) >= 8 and {r["category"] for r in records} >= {"general"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["eval"]["final"]) == {"with_skills", "without_skills"}


@pytest.mark.parametrize("name", ["sage_appworld",
                                  pytest.param("sage_apps", marks=pytest.mark.slow)])
def test_sage_runlocal_plays_chains_and_evaluates_scenarios(name, tmp_path):
    """SAGE end to end (configs/sage_appworld.py's runlocal runs the offline apps env): expert-chain
    warm start, chain rollouts with the chain reward, evaluation over whole scenarios."""
    run_module("skilljax.train", "--config", str(ROOT / "configs" / f"{name}.py") + ":runlocal",
               "--workdir", tmp_path)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    keys = {"sgc", "tgc", "library_size", "skill_use_rate", "steps_per_scenario",
            "tokens_per_scenario"}
    assert all(keys <= set(r) for r in rows if r["step"] > 0)
    # Chains of two tasks, two chains per scenario, two scenarios per step.
    assert all(r["episodes"] == 8 for r in rows if r["step"] > 0)
    final = json.loads((tmp_path / "summary.json").read_text())["eval"]["final"]
    for mode in ("with_skills", "without_skills"):
        assert {"scenario_success_rate", "tokens_per_scenario", "steps_per_scenario"} <= \
            set(final[mode])
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["sage"]["enabled"] and config["prompt"]["format"] == "code"


def test_visual_runlocal(tmp_path):
    """SKILL0's visual context end to end (configs/default.py:runlocal,visual): a tiny random
    Qwen2.5-VL policy, the history as an image, the agent's compression factor and its reward,
    warm start, RL updates through the vision tower, evaluation and a resume."""
    args = ("--config", CONFIG + ":runlocal,visual", "--workdir", tmp_path,
            "--config.visual.compression_every=2", "--config.rl.steps=2")
    run_module("skilljax.train", *args)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["visual"]["enabled"] and config["model"]["checkpoint"] == "tiny_vl"
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert all(r["tokens_image"] > 2 and r["tokens_history"] == 0 for r in steps)
    assert all(1.0 <= r["compression_mean"] <= 5.0 for r in steps)
    assert [("compression_bonus" in r) for r in steps] == [False, True]  # every 2nd step
    assert all(r["optimizer_steps"] >= 1 and math.isfinite(r["loss"]) for r in steps)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["eval"]["final"]["with_skills"]["tokens_per_step"] > 0
    tok = Tokenizer.load(tmp_path / "tokenizer")
    from skilljax.rl.visual import vision_ids
    assert len(set(vision_ids(tok))) == 3
    # Resumed with two more steps: it goes on from the last checkpoint.
    run_module("skilljax.train", *args[:-1], "--config.rl.steps=3")
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] > 0] == [1, 2, 3]


def test_visual_paper_configs():
    """The released visual settings of both SKILL0 configs (`:visual`)."""
    for name, width, size, markers, max_prompt in (
            ("alfworld_skill0.py", 392, 10, ("[Observation]", "[Action]"), 3072),
            ("search_skill0.py", 560, 12, ("<search>", "</search>", "<information>",
                                           "</information>"), 4096)):
        c = config_lib.load_config(str(ROOT / "configs" / name) + ":checkpoint=/models/vl,visual")
        v = experiment.rollout_config(c, evaluation=False).visual
        assert (v.width, v.font_size, tuple(m for m, _ in v.highlights)) == (width, size, markers)
        assert (v.padding, v.agent_compression, c.prompt.max_prompt_tokens) == (5, True, max_prompt)
        assert (c.visual.compression_coef, c.visual.compression_every) == (0.01, 8)
        text = config_lib.load_config(str(ROOT / "configs" / name) + ":checkpoint=/models/vl")
        assert experiment.rollout_config(text, evaluation=False).visual is None


@pytest.mark.slow  # in `bash run.sh test-slow`: an end-to-end run of minutes
def test_alfworld_skill0_visual_runlocal(tmp_path):
    """The ALFWorld config's visual runlocal (needs `alfworld`): a tiny Qwen2.5-VL policy reads
    the history of synthesized games as 392 px images."""
    pytest.importorskip("alfworld")
    cfg = str(ROOT / "configs" / "alfworld_skill0.py")
    run_module("skilljax.train", "--config", cfg + ":runlocal,visual", "--workdir", tmp_path)
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["tokens_image"] > 2 and r["tokens_history"] == 0 for r in rows if r["step"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["eval"]["final"]["without_skills"]["tokens_per_step"] > 0
