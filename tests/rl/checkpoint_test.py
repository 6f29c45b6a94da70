"""Checkpoints: exact resume, host state round trip, damaged checkpoints skipped with a message."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from skilljax import models
from skilljax.rl.checkpoint import Checkpointer, CheckpointError
from skilljax.rl.learner import Learner, LearnerConfig
from tests.rl.learner_test import random_batch

CFG = LearnerConfig(learning_rate=1e-3)


def fresh():
    _, model = models.load("tiny", num_layers=1, seed=0)
    return model, Learner(model, CFG)


def batches(n):
    return [random_batch(seed=i) for i in range(n)]


def test_resume_continues_exactly(tmp_path):
    data = batches(4)
    model, learner = fresh()
    uninterrupted = [learner.update(b)[0]["loss"] for b in data]

    model, learner = fresh()
    ckpt = Checkpointer(tmp_path / "ckpt", max_to_keep=2)
    rng = jax.random.key(7)
    for step in range(2):  # "killed" after step 2
        learner.update(data[step])
        rng, _ = jax.random.split(rng)
        ckpt.save(step + 1, model, learner.optimizer, rng=rng,
                  host_state={"curriculum": {"stage": step + 1}, "data_position": 17})
    ckpt.close()

    model, learner = fresh()  # a new process would start from scratch like this
    ckpt = Checkpointer(tmp_path / "ckpt")
    step, restored_rng, host = ckpt.restore(model, learner.optimizer)
    assert step == 2 and host == {"curriculum": {"stage": 2}, "data_position": 17}
    assert jnp.array_equal(jax.random.key_data(restored_rng), jax.random.key_data(rng))
    resumed = [learner.update(b)[0]["loss"] for b in data[2:]]
    np.testing.assert_allclose(resumed, uninterrupted[2:], rtol=1e-6)


def test_keep_last_n_and_damaged_checkpoint_falls_back(tmp_path, caplog):
    model, learner = fresh()
    ckpt = Checkpointer(tmp_path, max_to_keep=2, async_save=False)
    for step, b in enumerate(batches(3), 1):
        learner.update(b)
        ckpt.save(step, model, learner.optimizer, host_state={"step": step})
    ckpt.wait()
    assert ckpt.steps() == [2, 3]
    # Damage every data file of step 3 (a torn write that still got renamed into place).
    for f in (tmp_path / "3").rglob("*"):
        if f.is_file() and f.stat().st_size > 0 and "host" not in str(f):
            f.write_bytes(b"\0" * 7)
    model2, learner2 = fresh()
    with caplog.at_level(logging.WARNING):
        step, _, host = Checkpointer(tmp_path).restore(model2, learner2.optimizer)
    assert step == 2 and host == {"step": 2}
    assert "step 3" in caplog.text and "unreadable" in caplog.text


def test_no_checkpoint_is_a_clear_error(tmp_path):
    model, learner = fresh()
    with pytest.raises(CheckpointError, match="No checkpoints in"):
        Checkpointer(tmp_path).restore(model, learner.optimizer)


def test_half_written_step_is_invisible(tmp_path):
    model, learner = fresh()
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(1, model, learner.optimizer, host_state={"step": 1})
    ckpt.close()
    # What a process killed mid-save leaves behind: the temporary directory, never renamed.
    torn = tmp_path / "2.orbax-checkpoint-tmp-1234567890"
    torn.mkdir()
    (torn / "arrays").mkdir()
    (torn / "arrays" / "partial").write_bytes(b"\0" * 3)
    again = Checkpointer(tmp_path)
    assert again.steps() == [1]
    step, _, host = again.restore(model, learner.optimizer)
    assert (step, host) == (1, {"step": 1})


def test_params_only_restore(tmp_path):
    model, learner = fresh()
    learner.update(batches(1)[0])
    ckpt = Checkpointer(tmp_path / "ckpt", async_save=False)
    ckpt.save(3, model, learner.optimizer)
    ckpt.close()
    other, _ = fresh()  # evaluation: no optimizer to restore into
    step, _, _ = Checkpointer(tmp_path / "ckpt").restore(other, None)
    assert step == 3
    for a, b in zip(jax.tree.leaves(nnx_params(model)), jax.tree.leaves(nnx_params(other))):
        np.testing.assert_array_equal(a, b)


def nnx_params(model):
    from flax import nnx
    return nnx.state(model, nnx.Param)


def test_parameters_the_checkpoint_lacks_are_an_error_not_a_silent_init(tmp_path):
    """Reading parameters only (evaluation, export) restores partially; a parameter the
    checkpoint does not hold must not keep its initial value silently. Here: a checkpoint in the
    layout before layers were stacked (layers/0/..., layers/1/...)."""
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx

    from skilljax import models
    from skilljax.rl.checkpoint import CheckpointError, Checkpointer
    _, model = models.load("tiny")
    pure = nnx.state(model, nnx.Param).to_pure_dict()
    stacked = pure.pop("layers")
    pure["layers"] = {str(i): jax.tree.map(lambda a: a[i], stacked) for i in range(2)}
    ckpt = Checkpointer(tmp_path / "c", async_save=False)
    ckpt.manager.save(1, args=ocp.args.Composite(
        arrays=ocp.args.StandardSave({"params": pure}),
        host=ocp.args.JsonSave({"host_state": {}, "has_rng": False, "rng_impl": None})))
    ckpt.close()
    with pytest.raises(CheckpointError, match="lacks parameters of this model.*export them"):
        Checkpointer(tmp_path / "c").restore(model)  # as evaluate / export_hf read it
