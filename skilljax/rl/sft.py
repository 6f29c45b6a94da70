"""Supervised warm start: cross-entropy on expert step samples, loss on response tokens only.

The samples come from `rollout(..., expert=True)`, so the prompts are exactly those the policy sees
in RL (same template, history window and skill context); the response is the expert's action in the
env's response format.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from skilljax import console
from skilljax.models import qwen
from skilljax.rl import batch as batch_lib
from skilljax.rl.batch import response_window
from skilljax.rl.learner import token_logprobs
from skilljax.rl.rollout import StepSample
from skilljax.rl.visual import collate_kw


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    learning_rate: float = 1e-3
    warmup_steps: int = 20
    steps: int = 200
    batch_size: int = 32
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    prompt_loss_weight: float = 0.0


def make_optimizer(cfg: SFTConfig) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, cfg.learning_rate, min(cfg.warmup_steps, max(cfg.steps - 1, 0)), max(cfg.steps, 1),
        end_value=cfg.learning_rate * 0.1)
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                       optax.adamw(schedule, weight_decay=cfg.weight_decay))


def response_nll(model: qwen.Qwen, tokens_BT, loss_mask_BT, attn_mask_BT,
                 window: int | None = None, positions_B3T=None, vision=None):
    """Mean negative log-likelihood per response token (`window`: see `token_logprobs`; a VL
    policy's rows come with their M-RoPE positions and images)."""
    logp_BT, _ = token_logprobs(model, tokens_BT, attn_mask_BT, 1.0, loss_mask_BT, window,
                                positions_B3T, vision)
    n = jnp.maximum(loss_mask_BT.sum(), 1.0)
    return -(logp_BT * loss_mask_BT).sum() / n


def sft_loss(model: qwen.Qwen, tokens_BT, loss_mask_BT, attn_mask_BT, window: int | None,
             prompt_weight: float, positions_B3T=None, vision=None):
    """`response_nll`, plus `prompt_weight` × the mean NLL of the prompt tokens (position ≥ 1)."""
    if not prompt_weight:
        return response_nll(model, tokens_BT, loss_mask_BT, attn_mask_BT, window, positions_B3T,
                            vision)
    logp_BT, _ = token_logprobs(model, tokens_BT, attn_mask_BT, 1.0, positions_B3T=positions_B3T,
                                vision=vision)
    resp = -(logp_BT * loss_mask_BT).sum() / jnp.maximum(loss_mask_BT.sum(), 1.0)
    prompt_BT = (attn_mask_BT > 0) & (loss_mask_BT == 0) & (jnp.arange(tokens_BT.shape[1]) > 0)
    prompt = -(logp_BT * prompt_BT).sum() / jnp.maximum(prompt_BT.sum(), 1.0)
    return resp + prompt_weight * prompt


@nnx.jit(donate_argnums=(0, 1), static_argnums=(5, 6))
def _step(model: qwen.Qwen, optimizer: nnx.Optimizer, tokens_BT, loss_mask_BT, attn_mask_BT,
          window: int | None, prompt_weight: float = 0.0, positions_B3T=None, vision=None):
    grad_of = nnx.value_and_grad(sft_loss, argnums=nnx.DiffState(0, qwen.trainable(model.cfg)))
    loss, grads = grad_of(model, tokens_BT, loss_mask_BT, attn_mask_BT, window, prompt_weight,
                          positions_B3T, vision)
    optimizer.update(model, grads)
    return loss, optax.global_norm(grads)


_eval_nll = nnx.jit(response_nll, static_argnums=(4,))


# Warm-start rows are padded to a multiple of this many tokens, not to the RL length buckets:
# thousands of steps over many lengths waste less on padding for a few more compiled shapes, and
# the CPU experiment's warm start (whose jump off its plateau is chaotic in float32, see
# docs/results.md) keeps the computation its recorded runs had.
LENGTH_MULTIPLE = 32


def _batch(samples: Sequence[StepSample], pad_id: int, visual=None, vl_cfg=None):
    """(tokens, loss mask, attention mask), and with `visual` (a VisualConfig; `vl_cfg` the
    policy's) the rows' M-RoPE positions and images."""
    kw = collate_kw(samples, visual, vl_cfg)
    a = batch_lib.collate(samples, np.zeros(len(samples)), pad_id, multiple=LENGTH_MULTIPLE, **kw)
    return (a.tokens_BT, a.loss_mask_BT, a.attn_mask_BT) + ((a.positions_B3T, a.vision) if kw
                                                             else ())


def _place(arrays, layout):
    return [batch_lib.place_field(a, layout) for a in arrays]


def train(model: qwen.Qwen, samples: Sequence[StepSample], cfg: SFTConfig, pad_id: int,
          seed: int = 0, log_every: int = 0, on_step=None, should_stop=None,
          later: Sequence[StepSample] = (), admit_later=None, visual=None
          ) -> list[dict[str, float]]:
    """Up to `cfg.steps` optimiser steps on batches drawn without replacement (reshuffled per epoch).

    Batch rows are grouped by length (a shuffled epoch is cut into chunks of 16 batches, each chunk
    sorted by length) so padding stays small. `on_step(step, metrics)` is called after each step;
    training ends early when `should_stop(step)` returns True (the learning-rate schedule still
    spans `cfg.steps`, so `cfg.steps` is a budget, not a promise).

    `later`: samples held back until `admit_later(step)` (asked after each step) first returns
    True; from then on batches are drawn from `samples` and `later` together (a fresh epoch
    starts at once). Same optimiser state and schedule throughout.

    `visual` (a `skilljax.rl.visual.VisualConfig`): the samples' history images are drawn again
    for each batch (SKILL0's visual context; the policy is a Qwen2.5-VL model).
    """
    if not samples:
        raise ValueError("SFT needs at least one expert step sample.")
    if cfg.prompt_loss_weight < 0:
        raise ValueError(f"sft.prompt_loss_weight={cfg.prompt_loss_weight} must be >= 0 (0: loss on "
                         "response tokens only).")
    if later and admit_later is None:
        raise ValueError("sft.train: `later` samples need an `admit_later(step)` condition.")
    optimizer = nnx.Optimizer(model, make_optimizer(cfg), wrt=qwen.trainable(model.cfg))
    vis = (visual, model.cfg) if visual is not None else ()
    rng = np.random.default_rng(seed)
    bs = min(cfg.batch_size, len(samples))
    order: list[int] = []
    history = []
    admitted = not later
    pool = list(samples)
    for step in range(cfg.steps):
        if len(order) < bs:
            perm = list(rng.permutation(len(pool)))
            chunk = bs * 16
            for c in range(0, len(perm), chunk):
                perm[c:c + chunk] = sorted(perm[c:c + chunk], key=lambda i: len(pool[i].prompt_ids))
            batches = [perm[i:i + bs] for i in range(0, len(perm) - bs + 1, bs)]
            rng.shuffle(batches)
            order = [i for b in batches for i in b]
        idx, order = order[:bs], order[bs:]
        t0 = time.perf_counter()
        arrays = _batch([pool[i] for i in idx], pad_id, *vis)
        window = response_window(arrays[1])
        placed = _place(arrays, model.layout)
        loss, gnorm = _step(model, optimizer, *placed[:3], window, cfg.prompt_loss_weight,
                            *placed[3:])
        metrics = dict(step=step + 1, loss=float(loss), grad_norm=float(gnorm),
                       step_s=time.perf_counter() - t0)
        history.append(metrics)
        if on_step is not None:
            on_step(step + 1, metrics)
        if log_every and (step + 1) % log_every == 0:
            console.info(f"sft step {step + 1}/{cfg.steps}: loss {metrics['loss']:.4f}")
        if should_stop is not None and should_stop(step + 1):
            break
        if not admitted and admit_later(step + 1):
            admitted, pool, order = True, pool + list(later), []
            history[-1]["admitted_later"] = len(later)
    return history


def evaluate_nll(model: qwen.Qwen, samples: Sequence[StepSample], pad_id: int,
                 batch_size: int = 64, visual=None) -> float:
    """Mean response NLL per token over `samples` (held-out expert data)."""
    total, count = 0.0, 0
    vis = (visual, model.cfg) if visual is not None else ()
    for i in range(0, len(samples), batch_size):
        chunk = samples[i:i + batch_size]
        arrays = _batch(chunk, pad_id, *vis)
        tokens, mask, attn, *extra = _place(arrays, model.layout)
        n = float(mask.sum())
        total += float(_eval_nll(model, tokens, mask, attn, response_window(arrays[1]),
                                 *extra)) * n
        count += n
    return total / max(count, 1.0)
