"""GRPO/PPO learner: a jitted update over a batch of step samples.

A step sample is one environment step: `tokens_BT` holds prompt then response (left-aligned, padded
on the right), `loss_mask_BT` marks response tokens (the only ones trained), `old_logp_BT` the
sampler's logprobs at those tokens, `advantages_B` one scalar per sample. One `update` runs
`ppo_epochs` passes over the batch in mini-batches (one optimiser step each), each mini-batch in
micro-batches whose gradients are accumulated exactly: loss numerators and denominators are summed
over micro-batches before one division (see `losses.policy_loss_terms`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from skilljax.distributed import to_host
from skilljax.models import qwen
from skilljax.rl import losses
from skilljax.sampling import bucket_length


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    learning_rate: float = 1e-6
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    grad_clip: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    loss_agg: str = "token-mean"
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    mini_batch_size: int | None = None  # None: the whole batch is one mini-batch
    micro_batch_size: int | None = None  # None: no gradient accumulation
    ppo_epochs: int = 1
    temperature: float = 1.0  # logprobs of logits / temperature, as the sampler's policy
    response_window: bool = True  # vocabulary projection only over the responses (same result)


class Batch(NamedTuple):
    tokens_BT: jax.Array
    loss_mask_BT: jax.Array     # 1 on response tokens
    attn_mask_BT: jax.Array     # 1 on real (prompt or response) tokens
    old_logp_BT: jax.Array
    advantages_B: jax.Array
    ref_logp_BT: jax.Array | None = None


def token_logprobs(model: qwen.Qwen, tokens_BT, attn_mask_BT, temperature: float = 1.0,
                   loss_mask_BT=None, window: int | None = None):
    """log π(tokens[t] | tokens[<t]) aligned with `tokens_BT` (position 0 gets 0), and entropy.

    With `window` (static, from `response_window`) and `loss_mask_BT`, the vocabulary projection,
    log-softmax and entropy run only over each row's `window` positions from its first response
    token; elsewhere both outputs are 0. Step prompts are long and responses short, so this skips
    most of the [B, T, V] work; values at response tokens are those of the full computation.
    """
    if window is None:
        logits_BTV = qwen.sequence_logits(model, tokens_BT, attn_mask_BT) / temperature
        logp_BTV = jax.nn.log_softmax(logits_BTV[:, :-1], axis=-1)
        logp_BT = jnp.take_along_axis(logp_BTV, tokens_BT[:, 1:, None], axis=-1)[..., 0]
        entropy_BT = -jnp.sum(jnp.exp(logp_BTV) * logp_BTV, axis=-1)
        pad = lambda x: jnp.pad(x, ((0, 0), (1, 0)))
        return pad(logp_BT), pad(entropy_BT)
    b, t = tokens_BT.shape
    h_BTD, _ = model.hidden(tokens_BT, qwen.positions_from_mask(attn_mask_BT),
                            qwen.causal_mask(attn_mask_BT))
    start_B = jnp.maximum(jnp.argmax(loss_mask_BT > 0, axis=1), 1)  # first response token
    idx_BR = start_B[:, None] + jnp.arange(window)[None]  # the tokens scored
    h_BRD = jnp.take_along_axis(h_BTD, jnp.clip(idx_BR - 1, 0, t - 1)[..., None], axis=1)
    logp_BRV = jax.nn.log_softmax(model.logits(h_BRD) / temperature, axis=-1)
    tok_BR = jnp.take_along_axis(tokens_BT, jnp.clip(idx_BR, 0, t - 1), axis=1)
    logp_BR = jnp.take_along_axis(logp_BRV, tok_BR[..., None], axis=-1)[..., 0]
    entropy_BR = -jnp.sum(jnp.exp(logp_BRV) * logp_BRV, axis=-1)
    rows_B1 = jnp.arange(b)[:, None]
    scatter = lambda x_BR: jnp.zeros((b, t), x_BR.dtype).at[rows_B1, idx_BR].set(x_BR, mode="drop")
    return scatter(logp_BR), scatter(entropy_BR)


def response_window(loss_mask_BT) -> int | None:
    """A static window length (a `bucket_length` ≥ 16) covering every row's response, for
    `token_logprobs`; None when a row's response is not one contiguous run of the loss mask or
    the window would not be shorter than the sequence (then logits are computed everywhere)."""
    m = np.asarray(loss_mask_BT) > 0
    counts = m.sum(axis=1)
    if not counts.any():
        return None
    first = m.argmax(axis=1)
    last = m.shape[1] - 1 - m[:, ::-1].argmax(axis=1)
    rows = counts > 0
    if np.any((last - first + 1)[rows] != counts[rows]):
        return None
    window = bucket_length(int(counts.max()))
    return window if window < m.shape[1] else None


def _loss_terms(model, batch: Batch, cfg: LearnerConfig, window: int | None = None):
    logp_BT, entropy_BT = token_logprobs(model, batch.tokens_BT, batch.attn_mask_BT, cfg.temperature,
                                         batch.loss_mask_BT, window)
    num, den, sums = losses.policy_loss_terms(
        logp_BT, batch.old_logp_BT, batch.advantages_B, batch.loss_mask_BT, cfg.clip_low,
        cfg.clip_high, cfg.dual_clip, cfg.loss_agg)
    ent_num, _ = losses.aggregate(entropy_BT, batch.loss_mask_BT, cfg.loss_agg)
    num = num - cfg.entropy_coef * ent_num
    sums["entropy"], _ = losses.aggregate(entropy_BT, batch.loss_mask_BT, "token-mean")
    if cfg.kl_coef > 0:
        kl_BT = losses.kl_penalty(logp_BT, batch.ref_logp_BT, cfg.kl_kind)
        kl_num, _ = losses.aggregate(kl_BT, batch.loss_mask_BT, cfg.loss_agg)
        num = num + cfg.kl_coef * kl_num
        sums["kl"], _ = losses.aggregate(kl_BT, batch.loss_mask_BT, "token-mean")
    return num, den, sums


def _split(batch: Batch, n: int) -> Batch:
    """[B, ...] → [n, B/n, ...] for every field."""
    return jax.tree.map(lambda x: x.reshape(n, x.shape[0] // n, *x.shape[1:]), batch)


def make_optimizer(cfg: LearnerConfig) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                       optax.adamw(cfg.learning_rate, cfg.b1, cfg.b2, weight_decay=cfg.weight_decay))


def accumulate_grads(model: qwen.Qwen, batch: Batch, cfg: LearnerConfig,
                     window: int | None = None):
    """(metrics, grads) of one mini-batch, summed over micro-batches and divided once.

    `window`: see `token_logprobs` (the same result, less work)."""
    b = batch.tokens_BT.shape[0]
    micro = cfg.micro_batch_size or b
    if b % micro:
        raise ValueError(f"mini-batch of {b} is not a multiple of micro_batch_size={micro}.")
    micro_batches = _split(batch, b // micro)
    graphdef, params, other = nnx.split(model, nnx.Param, ...)

    def grads_of(mb):
        def f(p):
            num, den, sums = _loss_terms(nnx.merge(graphdef, p, other), mb, cfg, window)
            return num, (den, sums)
        (num, (den, sums)), grads = jax.value_and_grad(f, has_aux=True)(params)
        return num, den, sums, grads

    def body(carry, mb):
        return jax.tree.map(jnp.add, carry, grads_of(mb)), None

    first = jax.tree.map(lambda x: x[0], micro_batches)
    others = jax.tree.map(lambda x: x[1:], micro_batches)
    (num, den, sums, grads), _ = jax.lax.scan(body, grads_of(first), others)
    den = jnp.maximum(den, 1e-9)
    grads = jax.tree.map(lambda g: g / den, grads)
    tokens = jnp.maximum(sums.pop("tokens"), 1)
    metrics = {k: v / tokens for k, v in sums.items()}
    metrics.update(loss=num / den, grad_norm=optax.global_norm(grads))
    return metrics, grads


@nnx.jit(static_argnums=(3, 4), donate_argnums=(0, 1))
def _mini_batch_step(model: qwen.Qwen, optimizer: nnx.Optimizer, batch: Batch,
                     cfg: LearnerConfig, window: int | None):
    metrics, grads = accumulate_grads(model, batch, cfg, window)
    optimizer.update(model, grads)
    return metrics


_reference_logprobs = nnx.jit(lambda model, tokens, mask, t: token_logprobs(model, tokens, mask, t)[0],
                              static_argnums=3)


def pad_to_bucket(batch: Batch) -> Batch:
    """Right-pad the sequence axis to a bucketed length so a run compiles a few shapes only."""
    t = batch.tokens_BT.shape[1]
    extra = bucket_length(t) - t
    if not extra:
        return batch
    return jax.tree.map(lambda x: x if x.ndim == 1 else jnp.pad(x, ((0, 0), (0, extra))), batch)


class Learner:
    """Owns the optimizer and, only when kl_coef > 0, a frozen copy of the initial policy."""

    def __init__(self, model: qwen.Qwen, cfg: LearnerConfig):
        if cfg.kl_kind not in ("k1", "k2", "k3"):
            raise ValueError(f"kl_kind={cfg.kl_kind!r}; choose k1, k2 or k3.")
        self.model, self.cfg = model, cfg
        self.optimizer = nnx.Optimizer(model, make_optimizer(cfg), wrt=nnx.Param)
        self.reference = None
        if cfg.kl_coef > 0:
            graphdef, state = nnx.split(model)
            self.reference = nnx.merge(graphdef, jax.tree.map(jnp.copy, state))

    def reference_logprobs(self, batch: Batch) -> jax.Array:
        if self.reference is None:
            raise ValueError("No reference policy: it is built only when kl_coef > 0.")
        return _reference_logprobs(self.reference, batch.tokens_BT, batch.attn_mask_BT,
                                   self.cfg.temperature)

    def update(self, batch: Batch, rng: jax.Array | None = None) -> list[dict[str, float]]:
        """ppo_epochs × mini-batches optimiser steps; one metrics dict per step.

        With `rng`, samples are shuffled before each epoch (otherwise kept in order, as verl's
        `shuffle=False`).
        """
        b = batch.tokens_BT.shape[0]
        mini = self.cfg.mini_batch_size or b
        if b % mini:
            raise ValueError(f"batch of {b} step samples is not a multiple of mini_batch_size={mini}.")
        batch = pad_to_bucket(batch)
        if self.cfg.kl_coef > 0 and batch.ref_logp_BT is None:
            batch = batch._replace(ref_logp_BT=self.reference_logprobs(batch))
        if batch.ref_logp_BT is None:
            batch = batch._replace(ref_logp_BT=jnp.zeros_like(batch.old_logp_BT))
        window = (response_window(to_host(batch.loss_mask_BT)) if self.cfg.response_window
                  else None)
        out = []
        for epoch in range(self.cfg.ppo_epochs):
            order = jnp.arange(b) if rng is None else jax.random.permutation(
                jax.random.fold_in(rng, epoch), b)
            shuffled = jax.tree.map(lambda x: x[order], batch)
            for i in range(b // mini):
                mb = jax.tree.map(lambda x: x[i * mini:(i + 1) * mini], shuffled)
                t0 = time.perf_counter()
                metrics = self._step(mb, window)
                step_s = time.perf_counter() - t0
                adv = to_host(mb.advantages_B)
                metrics.update(step_s=step_s,
                               tokens_per_s=float(to_host(mb.attn_mask_BT).sum()) / step_s,
                               adv_mean=float(adv.mean()), adv_std=float(adv.std()),
                               adv_min=float(adv.min()), adv_max=float(adv.max()))
                out.append(metrics)
        return out

    def _step(self, mb: Batch, window: int | None) -> dict[str, float]:
        """One optimiser step; its metrics as floats (which is where an OOM surfaces)."""
        try:
            return {k: float(v) for k, v in
                    _mini_batch_step(self.model, self.optimizer, mb, self.cfg, window).items()}
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            b, t = mb.tokens_BT.shape
            micro = self.cfg.micro_batch_size or b
            raise MemoryError(
                f"Out of memory in the learner update ({b} step samples x {t} tokens, gradients "
                f"over micro-batches of {micro}). Accumulate over smaller micro-batches: set "
                f"rl.micro_batch_size to a smaller divisor of {b} (e.g. "
                f"--config.rl.micro_batch_size={max(1, micro // 4)}), or shorten prompts "
                "(prompt.history_length, prompt.max_prompt_tokens).") from e
