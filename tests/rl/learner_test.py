"""Learner: exact gradient accumulation and a toy task that GRPO must learn."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from skilljax import models
from skilljax.rl import losses
from skilljax.rl.learner import (Batch, Learner, LearnerConfig, accumulate_grads, response_window,
                                 token_logprobs)
from skilljax.sampling import Sampler, SamplingParams


def random_batch(vocab=512, b=8, t=12, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (b, t))
    attn = np.ones((b, t), np.int32)
    attn[:, -2:] = rng.random((b, 2)) < 0.5  # ragged right padding
    attn[:, -1] &= attn[:, -2]
    loss = attn.copy()
    loss[:, :5] = 0  # prompt
    return Batch(jnp.asarray(tokens), jnp.asarray(loss), jnp.asarray(attn),
                 jnp.asarray(rng.normal(-6.3, 0.2, (b, t)), jnp.float32),
                 jnp.asarray(rng.normal(size=b), jnp.float32))


def params(model):
    return {k: np.asarray(v.get_value()) for k, v in nnx.state(model, nnx.Param).flat_state()}


@pytest.mark.parametrize("agg", [a if a == "token-mean" else pytest.param(a, marks=pytest.mark.slow)
                                 for a in losses.AGGREGATIONS])
def test_micro_batches_equal_whole_batch(agg):
    batch = random_batch()
    _, model = models.load("tiny", num_layers=1, seed=0)
    step = nnx.jit(accumulate_grads, static_argnums=2)
    results = []
    for micro in (None, 2):  # 2 → four micro-batches of the batch of 8
        cfg = LearnerConfig(micro_batch_size=micro, loss_agg=agg, entropy_coef=0.01)
        metrics, grads = step(model, batch, cfg)
        results.append((metrics, jax.tree.leaves(grads)))
    (m_full, g_full), (m_micro, g_micro) = results
    assert float(m_micro["loss"]) == pytest.approx(float(m_full["loss"]), rel=1e-5, abs=1e-7)
    scale = max(float(jnp.abs(g).max()) for g in g_full)
    for a, b in zip(g_micro, g_full):
        np.testing.assert_allclose(a, b, atol=1e-5 * scale)
    if agg != "token-mean":
        return
    # And the optimiser step that follows is the same step. Adam's first step is lr·sign(g), so
    # where the gradient is at float-noise level (embedding rows no token used, ...) its sign,
    # hence the step, is arbitrary: compare where |g| stands clearly above the noise.
    grads = {k: np.asarray(v.get_value()) for k, v in
             nnx.State(step(model, batch, LearnerConfig(loss_agg=agg))[1]).flat_state()}
    for micro in (None, 2):  # the batch's old logprobs, so only the accumulation differs
        _, m = models.load("tiny", num_layers=1, seed=0)
        Learner(m, LearnerConfig(learning_rate=1e-3, micro_batch_size=micro, loss_agg=agg,
                                 recompute_old_logp=False)).update(batch)
        results.append(params(m))
    for k in results[2]:
        clear = np.abs(grads[k]) > 1e-4 * scale
        assert clear.mean() > 0.1  # the comparison covers a real share of each tensor
        np.testing.assert_allclose(results[3][k][clear], results[2][k][clear], atol=1e-5)


def test_toy_task_reward_rises():
    """16-token vocabulary, reward = fraction of generated tokens equal to token 5."""
    cfg, model = models.load("tiny", vocab_size=16, num_layers=1, seed=0)
    sampler = Sampler(model)
    learner = Learner(model, LearnerConfig(learning_rate=3e-3, weight_decay=0.0, dual_clip=None))
    prompt, group, new = [1, 2, 3], 32, 8
    key = jax.random.key(0)
    rewards = []
    for step in range(150):
        out = sampler.generate([prompt] * group, SamplingParams(max_new_tokens=new, temperature=1.0),
                               jax.random.fold_in(key, step))
        resp = np.array(out.token_ids)
        reward = (resp == 5).mean(axis=1)
        rewards.append(reward.mean())
        if np.mean(rewards[-5:]) > 0.9:
            break
        adv = losses.group_advantages(reward, np.zeros(group))
        tokens = np.concatenate([np.tile(prompt, (group, 1)), resp], axis=1)
        loss_mask = np.zeros_like(tokens)
        loss_mask[:, len(prompt):] = 1
        old = np.zeros(tokens.shape, np.float32)
        old[:, len(prompt):] = np.stack(out.logprobs)
        learner.update(Batch(jnp.asarray(tokens), jnp.asarray(loss_mask), jnp.ones_like(jnp.asarray(tokens)),
                             jnp.asarray(old), adv))
    assert rewards[0] < 0.15  # about 1/16 before any update
    assert np.mean(rewards[-5:]) > 0.8, rewards[-10:]


def test_sampler_and_learner_logprobs_agree():
    _, model = models.load("tiny", seed=1)
    prompt = [4, 8, 15, 16]
    out = Sampler(model).generate([prompt], SamplingParams(max_new_tokens=6, temperature=1.0),
                                  jax.random.key(0))
    tokens = jnp.asarray([prompt + out.token_ids[0]])
    logp, _ = token_logprobs(model, tokens, jnp.ones_like(tokens))
    np.testing.assert_allclose(np.asarray(logp)[0, len(prompt):], out.logprobs[0], atol=1e-5)


def test_reference_policy_and_kl():
    _, model = models.load("tiny", num_layers=1, seed=0)
    assert Learner(model, LearnerConfig()).reference is None  # not built without a KL term
    learner = Learner(model, LearnerConfig(learning_rate=1e-2, kl_coef=0.1))
    batch = random_batch()
    first = learner.update(batch)[0]
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before any step
    second = learner.update(batch)[0]
    assert second["kl"] > 1e-6  # the policy moved, the frozen reference did not
    ref_logp = np.asarray(learner.reference_logprobs(batch))
    _, init_model = models.load("tiny", num_layers=1, seed=0)
    np.testing.assert_allclose(ref_logp, np.asarray(token_logprobs(
        init_model, batch.tokens_BT, batch.attn_mask_BT)[0]), atol=1e-6)


@pytest.mark.parametrize("windowed", [pytest.param(False, marks=pytest.mark.slow), True])
def test_update_on_a_mesh_matches_one_device(windowed):
    from skilljax import sharding
    batch = prompt_response_batch(b=8) if windowed else random_batch(b=8)
    window = response_window(batch.loss_mask_BT)
    assert (window is not None) == windowed
    cfg = LearnerConfig(learning_rate=1e-3, micro_batch_size=4)
    results = []
    for mesh in (None, sharding.make_mesh("data=2,fsdp=2,tensor=2")):
        _, model = models.load("tiny", mesh, num_layers=1, seed=0)
        b = batch if mesh is None else jax.tree.map(
            lambda x: jax.device_put(x, sharding.Layout(mesh, "fsdp_tp").sharding(
                x.shape, ("batch",) + ("seq",) * (x.ndim - 1))), batch)
        metrics, grads = nnx.jit(accumulate_grads, static_argnums=(2, 3))(model, b, cfg, window)
        results.append((float(metrics["loss"]), jax.tree.leaves(grads)))
        Learner(model, cfg).update(b)  # the full step runs and keeps the layout
        if mesh is not None:
            assert sharding.is_split(nnx.state(model, nnx.Param)["layers"]["mlp"]["up"].get_value())
    (l1, g1), (l8, g8) = results
    assert l8 == pytest.approx(l1, rel=1e-5)
    scale = max(float(jnp.abs(g).max()) for g in g1)
    for a, b in zip(g8, g1):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5 * scale)


def test_update_reports_the_issue_metrics():
    _, model = models.load("tiny", num_layers=1, seed=0)
    batch = random_batch()
    metrics = Learner(model, LearnerConfig(mini_batch_size=4, ppo_epochs=2)).update(
        batch, rng=jax.random.key(0))
    assert len(metrics) == 4  # 2 epochs × 2 mini-batches
    for m in metrics:
        assert {"loss", "clip_frac", "approx_kl", "entropy", "grad_norm", "adv_mean", "adv_std",
                "tokens_per_s", "step_s"} <= set(m)
        assert np.isfinite(m["loss"]) and m["grad_norm"] > 0


def test_out_of_memory_names_the_fix(monkeypatch):
    """An OOM in the update (raised when its metrics are read) says which config key helps."""
    from skilljax.rl import learner as learner_mod

    def oom(*args):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 123 bytes.")

    _, model = models.load("tiny", num_layers=1, seed=0)
    monkeypatch.setattr(learner_mod, "_mini_batch_step", oom)
    with pytest.raises(MemoryError, match=r"micro_batch_size=2\b.*history_length"):
        Learner(model, LearnerConfig(micro_batch_size=8)).update(random_batch())

    def other(*args):
        raise jax.errors.JaxRuntimeError("INTERNAL: something else")

    monkeypatch.setattr(learner_mod, "_mini_batch_step", other)
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        Learner(model, LearnerConfig()).update(random_batch())


def prompt_response_batch(b=6, t=64, seed=0):
    """Step samples as the rollout makes them: prompts of different lengths, then a response of
    1–12 tokens, then right padding."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 512, (b, t))
    attn, loss = np.zeros((b, t), np.int32), np.zeros((b, t), np.int32)
    for i in range(b):
        p, r = rng.integers(8, 40), rng.integers(1, 13)
        attn[i, :p + r] = 1
        loss[i, p:p + r] = 1
    loss[-1] = 0  # a padding row (the learner pads mini-batches with such rows)
    attn[-1, :5] = 1
    return Batch(jnp.asarray(tokens), jnp.asarray(loss), jnp.asarray(attn),
                 jnp.asarray(rng.normal(-6.3, 0.2, (b, t)), jnp.float32),
                 jnp.asarray(rng.normal(size=b), jnp.float32))


def test_response_window():
    batch = prompt_response_batch()
    assert response_window(batch.loss_mask_BT) == 16  # longest response 12 → 16
    gap = np.asarray(batch.loss_mask_BT).copy()
    gap[0, :3] = 1  # a second run in one row: no window
    assert response_window(gap) is None
    assert response_window(np.zeros((2, 8))) is None
    assert response_window(np.ones((2, 16))) is None  # no shorter than the sequence


@pytest.mark.parametrize("agg", ["token-mean",
                                 pytest.param("seq-mean-token-sum", marks=pytest.mark.slow)])
def test_response_window_equals_full_computation(agg):
    """Logits only over the responses: the same logprobs, entropies, loss and gradients."""
    batch = prompt_response_batch()
    window = response_window(batch.loss_mask_BT)
    _, model = models.load("tiny", num_layers=1, seed=0)
    full = token_logprobs(model, batch.tokens_BT, batch.attn_mask_BT, 0.7)
    win = token_logprobs(model, batch.tokens_BT, batch.attn_mask_BT, 0.7, batch.loss_mask_BT, window)
    mask = np.asarray(batch.loss_mask_BT) > 0
    for a, b in zip(full, win):
        np.testing.assert_allclose(np.asarray(b)[mask], np.asarray(a)[mask], atol=1e-5)
    step = nnx.jit(accumulate_grads, static_argnums=(2, 3))
    cfg = LearnerConfig(loss_agg=agg, entropy_coef=0.01, temperature=0.7)
    (m_full, g_full), (m_win, g_win) = (step(model, batch, cfg, w) for w in (None, window))
    assert float(m_win["loss"]) == pytest.approx(float(m_full["loss"]), rel=1e-5)
    assert float(m_win["entropy"]) == pytest.approx(float(m_full["entropy"]), rel=1e-5)
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g_full))
    for a, b in zip(jax.tree.leaves(g_win), jax.tree.leaves(g_full)):
        np.testing.assert_allclose(a, b, atol=1e-5 * scale)


def test_mini_batches_of_the_step_samples():
    """ceil(n / mini_batch_size) optimiser steps of nearly equal size; padding rows never train."""
    batch = prompt_response_batch(b=10)  # its last row is padding: 9 step samples
    _, model = models.load("tiny", num_layers=1, seed=0)
    metrics = Learner(model, LearnerConfig(mini_batch_size=4, row_multiple=2)).update(batch)
    assert [m["samples"] for m in metrics] == [3, 3, 3]  # 9 samples → 3 steps, not 4 + 4 + 1
    one = Learner(models.load("tiny", num_layers=1, seed=0)[1], LearnerConfig()).update(batch)
    assert [m["samples"] for m in one] == [9]


def test_mini_batch_steps_match_separate_updates():
    """Two mini-batches are two optimiser steps on their own rows: the same as two updates."""
    batch = jax.tree.map(lambda x: x[:8], prompt_response_batch(b=9, seed=1))  # 8 samples
    _, a = models.load("tiny", num_layers=1, seed=0)
    Learner(a, LearnerConfig(learning_rate=1e-3, mini_batch_size=4)).update(batch)
    _, b = models.load("tiny", num_layers=1, seed=0)
    learner = Learner(b, LearnerConfig(learning_rate=1e-3, recompute_old_logp=False))
    old = learner._logprobs(b, {k: np.asarray(v) for k, v in batch._asdict().items()
                                if v is not None}, None)  # the policy before either step
    halves = [jax.tree.map(lambda x: x[i:i + 4], batch._replace(old_logp_BT=jnp.asarray(old)))
              for i in (0, 4)]
    for half in halves:
        learner.update(half)
    for k, v in params(a).items():
        np.testing.assert_allclose(v, params(b)[k], atol=1e-6)


def test_first_mini_batch_is_on_policy_at_any_temperature():
    """Sampled at temperature 0.7, the sampler's logprobs are those of the raw logits; the learner
    recomputes them under its own policy (logits / 0.7), so its first step has ratio 1."""
    from skilljax.rl.batch import collate
    from skilljax.rl.rollout import StepSample
    _, model = models.load("tiny", num_layers=1, seed=0)
    prompts = [[4, 8, 15, 16], [23, 42, 7], [5, 9, 11, 13, 2]]
    out = Sampler(model).generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.7),
                                  jax.random.key(1))
    samples = [StepSample(p, list(out.token_ids[i]), out.logprobs[i], episode=i, group=0, step=0,
                          action="", valid=True, invalid_reason="", reward=0.0,
                          truncated_response=False, counts={}) for i, p in enumerate(prompts)]
    batch = collate(samples, [1.0, -0.5, 0.3], pad_id=0)
    at_one = Learner(model, LearnerConfig(recompute_old_logp=False, learning_rate=0.0))
    assert abs(at_one.update(batch)[0]["approx_kl"]) < 1e-5  # T = 1: the sampler's are π's
    first = Learner(model, LearnerConfig(temperature=0.7, mini_batch_size=2)).update(batch)
    assert abs(first[0]["approx_kl"]) < 1e-6 and first[0]["clip_frac"] == 0
    with pytest.raises(ValueError, match="temperature 0.7"):
        LearnerConfig(temperature=0.7, recompute_old_logp=False)


@pytest.mark.slow  # in `bash run.sh test-slow`: ~40 s
def test_float32_master_weights_keep_small_updates():
    """bfloat16 compute at lr 1e-6: with float32 parameters nearly every weight moves; stored in
    bfloat16, the same updates round away (the issue's reason for master weights)."""
    batch = random_batch()
    changed = {}
    for storage in ("float32", "bfloat16"):
        _, m = models.load("tiny", dtype="bfloat16", param_dtype=storage, seed=0)
        before = params(m)
        Learner(m, LearnerConfig(learning_rate=1e-6, recompute_old_logp=False)).update(batch)
        after = params(m)
        moved = sum(int((before[k] != after[k]).sum()) for k in before)
        changed[storage] = moved / sum(a.size for a in before.values())
    print(f"share of weights changed by one step at lr 1e-6: {changed}")
    assert changed["float32"] >= 0.99
    assert changed["bfloat16"] < 0.1


def test_blocked_vocabulary_projection_equals_one_pass():
    """`logits_block`: the logits of a few positions at a time (full sequences and response
    windows alike) give the same logprobs, entropies, loss and gradients as one [B, T, V] pass."""
    batch = prompt_response_batch()
    window = response_window(batch.loss_mask_BT)
    _, whole = models.load("tiny", num_layers=1, seed=0, logits_block=0)
    _, blocked = models.load("tiny", num_layers=1, seed=0, logits_block=3)  # 3 ∤ T: padded
    nnx.update(blocked, nnx.state(whole))
    for w in (None, window):
        ref = token_logprobs(whole, batch.tokens_BT, batch.attn_mask_BT, 0.7, batch.loss_mask_BT, w)
        out = token_logprobs(blocked, batch.tokens_BT, batch.attn_mask_BT, 0.7, batch.loss_mask_BT, w)
        for a, b in zip(ref, out):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6)
        step = nnx.jit(accumulate_grads, static_argnums=(2, 3))
        cfg = LearnerConfig(entropy_coef=0.01, temperature=0.7)
        (m_ref, g_ref), (m_out, g_out) = (step(m, batch, cfg, w) for m in (whole, blocked))
        assert float(m_out["loss"]) == pytest.approx(float(m_ref["loss"]), rel=1e-6)
        scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g_ref))
        for a, b in zip(jax.tree.leaves(g_out), jax.tree.leaves(g_ref)):
            np.testing.assert_allclose(a, b, atol=1e-6 * scale)


def test_behaviour_importance_weights_by_hand():
    from skilljax.rl.learner import behaviour_weights
    old = np.array([[-1.0, -2.0, -0.5]])
    behaviour = np.array([[-1.5, -1.0, -0.5]])
    w, stats = behaviour_weights(old, behaviour, np.array([[1, 1, 0]]), cap=1.5)
    # log ratios 0.5 and -1: e^0.5 = 1.649 is cut to 1.5, e^-1 = 0.368 kept; off-mask weight 1.
    np.testing.assert_allclose(w, [[1.5, np.exp(-1.0), 1.0]], rtol=1e-6)
    assert stats["is_truncated_frac"] == 0.5
    assert stats["is_weight_mean"] == pytest.approx((1.5 + np.exp(-1.0)) / 2)
    assert stats["behaviour_kl"] == pytest.approx(0.25)  # mean of behaviour − old: (−0.5 + 1) / 2
    # The weights scale each token's surrogate and carry no gradient.
    logp = jnp.asarray([[-1.2, -1.9, -0.4]])
    adv = jnp.asarray([1.0])
    mask = jnp.asarray([[1.0, 1.0, 0.0]])
    plain = jax.grad(lambda l: losses.policy_loss_terms(l, old, adv, mask)[0])(logp)
    weighted = jax.grad(lambda l: losses.policy_loss_terms(l, old, adv, mask, weight=w)[0])(logp)
    np.testing.assert_allclose(weighted, plain * w, rtol=1e-6)


def test_behaviour_correction_in_the_update():
    """With the sampler's own logprobs the weights are 1 and the update is the plain one; with a
    stale behaviour policy the loss changes and the statistics are reported."""
    batch = prompt_response_batch()
    _, model = models.load("tiny", num_layers=1, seed=0)
    old = np.asarray(token_logprobs(model, batch.tokens_BT, batch.attn_mask_BT)[0])
    mask = np.asarray(batch.loss_mask_BT) > 0
    own = batch._replace(old_logp_BT=jnp.asarray(np.where(mask, old, 0.0), jnp.float32))
    stale = own._replace(old_logp_BT=own.old_logp_BT + 0.3 * jnp.asarray(
        np.random.default_rng(0).normal(size=old.shape), jnp.float32) * mask)
    out = {}
    for name, cap, b in (("plain", 0.0, own), ("own", 2.0, own), ("stale", 2.0, stale)):
        m = models.load("tiny", num_layers=1, seed=0)[1]
        out[name] = Learner(m, LearnerConfig(learning_rate=1e-3, behaviour_is_cap=cap)).update(b)[0]
    assert out["own"]["loss"] == pytest.approx(out["plain"]["loss"], rel=1e-5)
    assert out["own"]["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert out["own"]["is_truncated_frac"] == 0.0 and "is_weight_mean" not in out["plain"]
    assert out["stale"]["behaviour_kl"] != pytest.approx(0.0, abs=1e-3)
    assert out["stale"]["loss"] != pytest.approx(out["plain"]["loss"], rel=1e-3)
    with pytest.raises(ValueError, match="behaviour_is_cap"):
        LearnerConfig(behaviour_is_cap=0.5)
    with pytest.raises(ValueError, match="recompute_old_logp"):
        LearnerConfig(behaviour_is_cap=2.0, recompute_old_logp=False)
    with pytest.raises(ValueError, match="temperature 1"):
        LearnerConfig(behaviour_is_cap=2.0, temperature=0.7)
