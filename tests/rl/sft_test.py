"""Warm-start training: held-back samples join once their condition holds."""

import numpy as np
import pytest

from skilljax import models
from skilljax.rl import sft
from skilljax.rl.rollout import StepSample


def _sample(first_token: int) -> StepSample:
    return StepSample([first_token, 5, 6], [7, 8], np.zeros(2), 0, 0, 0, "a", True, "", 0.0,
                      False, {})


def test_later_samples_join_only_after_admission(monkeypatch):
    _, model = models.load("tiny", vocab_size=64, num_layers=1, seed=0)
    seen = []
    batch = sft._batch

    def spy(samples, pad_id):
        seen.append({s.prompt_ids[0] for s in samples})
        return batch(samples, pad_id)

    monkeypatch.setattr(sft, "_batch", spy)
    early, later = [_sample(1) for _ in range(8)], [_sample(2) for _ in range(8)]
    cfg = sft.SFTConfig(steps=12, batch_size=4, warmup_steps=1)
    history = sft.train(model, early, cfg, pad_id=0, later=later, admit_later=lambda s: s >= 4)
    assert all(s == {1} for s in seen[:4])               # steps 1–4: only the early samples
    assert set().union(*seen[4:]) == {1, 2}              # then both, from a fresh epoch
    assert history[3]["admitted_later"] == 8 and len(history) == 12
    with pytest.raises(ValueError, match="admit_later"):
        sft.train(model, early, cfg, pad_id=0, later=later)


def test_prompt_loss_adds_the_weighted_mean_nll_of_prompt_tokens():
    import jax

    from skilljax.models import qwen

    _, model = models.load("tiny", vocab_size=64, num_layers=1, seed=0)
    samples = [StepSample([1, 9, 4, 7], [8, 3], np.zeros(2), 0, 0, 0, "a", True, "", 0.0, False, {}),
               StepSample([2, 5], [6, 11, 12], np.zeros(3), 0, 0, 0, "a", True, "", 0.0, False, {})]
    tokens, loss_mask, attn = sft._batch(samples, pad_id=0)
    logp = np.asarray(jax.nn.log_softmax(qwen.sequence_logits(model, tokens, attn), axis=-1))
    # By hand: token t is scored by the logits at t - 1; the prompt's first token is not scored.
    resp, prompt = [], []
    for row, s in enumerate(samples):
        ids = s.prompt_ids + s.response_ids
        for t in range(1, len(ids)):
            (prompt if t < len(s.prompt_ids) else resp).append(logp[row, t - 1, ids[t]])
    want_resp, want_prompt = -np.mean(resp), -np.mean(prompt)
    np.testing.assert_allclose(sft.sft_loss(model, tokens, loss_mask, attn, None, 0.0), want_resp,
                               rtol=1e-5)
    np.testing.assert_allclose(sft.response_nll(model, tokens, loss_mask, attn), want_resp,
                               rtol=1e-5)
    np.testing.assert_allclose(sft.sft_loss(model, tokens, loss_mask, attn, None, 0.1),
                               want_resp + 0.1 * want_prompt, rtol=1e-5)
    with pytest.raises(ValueError, match="prompt_loss_weight"):
        sft.train(model, samples, sft.SFTConfig(steps=1, prompt_loss_weight=-1.0), pad_id=0)
