"""Rollouts run ahead of the learner (`rl.max_staleness`): the plan around sync points, weight
snapshots that outlive donating updates, a rollout running beside an update."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from skilljax import models
from skilljax.rl.ahead import RolloutsAhead
from skilljax.rl.learner import Batch, Learner, LearnerConfig
from skilljax.sampling import Sampler, SamplingParams

PROMPTS = [[4, 8, 15, 16], [23, 42], [1, 2, 3, 4, 5, 6]]
PARAMS = SamplingParams(max_new_tokens=6, temperature=1.0)


def update_batch(out, prompt_len=4, vocab=64):
    """A learner batch from one prompt's sampled rows (advantages of both signs)."""
    b = len(out.token_ids)
    t = prompt_len + max(out.lengths)
    tokens = np.zeros((b, t), np.int32)
    loss, old = np.zeros((b, t), np.int32), np.zeros((b, t), np.float32)
    for i, row in enumerate(out.token_ids):
        tokens[i, :prompt_len] = np.arange(1, prompt_len + 1) % vocab
        tokens[i, prompt_len:prompt_len + len(row)] = row
        loss[i, prompt_len:prompt_len + len(row)] = 1
        old[i, prompt_len:prompt_len + len(row)] = out.logprobs[i]
    attn = (tokens > 0) | (np.arange(t) < prompt_len)
    adv = np.linspace(-1, 1, b, dtype=np.float32)
    return Batch(jnp.asarray(tokens), jnp.asarray(loss), jnp.asarray(attn.astype(np.int32)),
                 jnp.asarray(old), jnp.asarray(adv))


def test_plan_stops_at_sync_points():
    ahead = RolloutsAhead.__new__(RolloutsAhead)  # the plan alone: no sampler, no worker
    ahead.max_staleness, ahead._last = 2, 0
    sync = lambda s: s % 5 == 0 or s == 12  # e.g. checkpoints every 5, the last step 12
    assert ahead.plan(1, 12, sync) == [2, 3]
    ahead._last = 3
    assert ahead.plan(2, 12, sync) == [4]      # 3 is started already
    ahead._last = 4
    assert ahead.plan(3, 12, sync) == [5]      # step 5's own rollout may start before step 5
    ahead._last = 5
    assert ahead.plan(4, 12, sync) == []       # but nothing after the sync point at step 5
    assert ahead.plan(5, 12, sync) == []       # a sync step starts nothing
    ahead._last = 5
    assert ahead.plan(6, 12, sync) == [7, 8]
    ahead._last = 10
    assert ahead.plan(11, 12, sync) == [12]    # never past the last step
    ahead._last = 12
    assert ahead.plan(12, 12, sync) == []


def test_snapshot_samples_the_weights_of_its_time_after_a_donating_update():
    """The learner donates the weights it updates; a snapshot taken before the update samples
    exactly what the sampler sampled then, also while the update runs in another thread."""
    _, model = models.load("tiny", vocab_size=64, num_layers=1, seed=0)
    sampler = Sampler(model, compact=False)
    key = jax.random.key(3)
    before = sampler.generate(PROMPTS, PARAMS, key)
    pinned = sampler.snapshot()
    learner = Learner(model, LearnerConfig(learning_rate=0.05, weight_decay=0.0))
    batch = update_batch(sampler.generate([[1, 2, 3, 4]] * 8, PARAMS, jax.random.key(1)))
    got = {}
    worker = threading.Thread(target=lambda: got.update(out=pinned.generate(PROMPTS, PARAMS, key)))
    worker.start()
    learner.update(batch)  # donates the model's weights
    worker.join()
    after_update = pinned.generate(PROMPTS, PARAMS, key)
    current = sampler.generate(PROMPTS, PARAMS, key)
    for out in (got["out"], after_update):
        assert out.token_ids == before.token_ids
        for a, b in zip(out.logprobs, before.logprobs):
            np.testing.assert_array_equal(a, b)
    diff = max(float(np.max(np.abs(a[:min(len(a), len(b))] - b[:min(len(a), len(b))])))
               for a, b in zip(current.logprobs, before.logprobs))
    assert diff > 1e-4  # the model itself moved on


def test_take_returns_result_timing_and_raises_the_rollouts_error():
    _, model = models.load("tiny", vocab_size=64, num_layers=1, seed=0)
    ahead = RolloutsAhead(Sampler(model), max_staleness=2)
    try:
        ahead.submit(3, lambda s: s.generate(PROMPTS, PARAMS, jax.random.key(0)).lengths.tolist(),
                     now=1)
        with pytest.raises(ValueError, match="started already"):
            ahead.submit(3, lambda s: None, now=1)
        ahead.submit(4, lambda s: 1 / 0, now=2)
        assert 3 in ahead and 4 in ahead and 5 not in ahead
        lengths, timing = ahead.take(3)
        assert lengths == [6, 6, 6] and timing["staleness"] == 2.0
        assert 0 <= timing["rollout_wait_s"] and 0 < timing["rollout_s"]
        with pytest.raises(ZeroDivisionError):
            ahead.take(4)
    finally:
        ahead.close()
    with pytest.raises(ValueError, match="0 is the synchronous loop"):
        RolloutsAhead(None, 0)
