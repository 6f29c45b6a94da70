"""GRPO/PPO learner: a jitted update over a batch of step samples.

A step sample is one environment step: `tokens_BT` holds prompt then response (left-aligned, padded
on the right), `loss_mask_BT` marks response tokens (the only ones trained), `old_logp_BT` the
behaviour policy's logprobs at those tokens, `advantages_B` one scalar per sample. Rows without
response tokens are padding and never trained.

One `update` runs `ppo_epochs` passes over the batch's step samples in mini-batches of at most
`mini_batch_size` samples, one AdamW step each, as the released runs do (`ppo_mini_batch_size`:
`shared/reference/skill0_released_code.md` §6): a batch of n samples makes ceil(n / size)
mini-batches of nearly equal size, padded to a multiple of `row_multiple` rows (and of the devices
the rows are sharded over) so a run compiles few shapes; `skilljax.rl.batch` pads the sequence
length, once, and places each mini-batch sharded over the batch axes. Each
mini-batch runs in micro-batches whose gradients are accumulated exactly: loss numerators and
denominators are summed over micro-batches before one division (`losses.policy_loss_terms`).

Old logprobs: with `recompute_old_logp` (the default, as the released actor does) the learner
computes them itself under its own policy, softmax(logits / temperature), before its first step,
so the sampler's numerics and its temperature cannot make the first mini-batch off-policy (its
ratio is 1). Without it the batch's `old_logp_BT` is used: the sampler's logprobs are those of the
raw logits, the learner's policy only at temperature 1, which the config then checks.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from skilljax.distributed import to_host
from skilljax.models import qwen
from skilljax.rl import batch as batch_lib
from skilljax.rl import losses
from skilljax.rl.batch import Batch, response_window  # noqa: F401  (re-exported)


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
    recompute_old_logp: bool = True  # old logprobs from the learner's policy before its first step
    # Truncated importance sampling between the behaviour policy (the sampler's logprobs, as
    # collated) and the recomputed old policy: each token's loss × min(π_old / π_behaviour, cap).
    # Corrects for a sampler that is not the learner's policy (another precision, or weights a
    # step or more stale). 0 = off.
    behaviour_is_cap: float = 0.0
    row_multiple: int = 1  # each mini-batch padded to a multiple of this many rows (fewer compiles)

    def __post_init__(self):
        if self.mini_batch_size is not None and self.mini_batch_size < 1:
            raise ValueError(f"mini_batch_size must be >= 1 or None, got {self.mini_batch_size}.")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or None, got {self.micro_batch_size}.")
        if self.behaviour_is_cap and (self.behaviour_is_cap < 1 or not self.recompute_old_logp):
            raise ValueError(
                f"behaviour_is_cap={self.behaviour_is_cap}: the cap must be >= 1 (0 = off), and "
                "the old policy must be the learner's (recompute_old_logp=true) for the sampler's "
                "logprobs to be the behaviour policy it is compared with.")
        if self.behaviour_is_cap and self.temperature != 1.0:
            raise ValueError(
                f"behaviour_is_cap needs rl.temperature 1 (got {self.temperature}): the sampler's "
                "logprobs are those of the raw logits, the old policy's would be at this "
                "temperature. Train at temperature 1 or set behaviour_is_cap=0.")
        if not self.recompute_old_logp and self.temperature != 1.0:
            raise ValueError(
                f"recompute_old_logp=False takes the sampler's logprobs as the old policy; they are "
                f"those of the raw logits, but the learner's policy is at temperature "
                f"{self.temperature}. Recompute them (rl.recompute_old_logp=true) or train at "
                "temperature 1.")


def token_logprobs(model: qwen.Qwen, tokens_BT, attn_mask_BT, temperature: float = 1.0,
                   loss_mask_BT=None, window: int | None = None, positions_B3T=None, vision=None):
    """log π(tokens[t] | tokens[<t]) aligned with `tokens_BT` (position 0 gets 0), and entropy.

    With `window` (static, from `response_window`) and `loss_mask_BT`, the vocabulary projection,
    log-softmax and entropy run only over each row's `window` positions from its first response
    token; elsewhere both outputs are 0. Step prompts are long and responses short, so this skips
    most of the [B, T, V] work; values at response tokens are those of the full computation.
    A Qwen2.5-VL policy takes its rows' M-RoPE positions and images (`Batch.positions_B3T`,
    `Batch.vision`).
    """
    b, t = tokens_BT.shape
    positions = (qwen.positions_from_mask(attn_mask_BT) if positions_B3T is None
                 else positions_B3T.swapaxes(0, 1))
    images = {} if vision is None else {"vision": vision}
    h_BTD, _ = model.hidden(tokens_BT, positions, qwen.causal_mask(attn_mask_BT), **images)
    if window is None:
        pad = lambda x: jnp.pad(x, ((0, 0), (1, 0)))
        return tuple(map(pad, _scored(model, h_BTD[:, :-1], tokens_BT[:, 1:], temperature)))
    start_B = jnp.maximum(jnp.argmax(loss_mask_BT > 0, axis=1), 1)  # first response token
    idx_BR = start_B[:, None] + jnp.arange(window)[None]  # the tokens scored
    h_BRD = jnp.take_along_axis(h_BTD, jnp.clip(idx_BR - 1, 0, t - 1)[..., None], axis=1)
    tok_BR = jnp.take_along_axis(tokens_BT, jnp.clip(idx_BR, 0, t - 1), axis=1)
    logp_BR, entropy_BR = _scored(model, h_BRD, tok_BR, temperature)
    rows_B1 = jnp.arange(b)[:, None]
    scatter = lambda x_BR: jnp.zeros((b, t), x_BR.dtype).at[rows_B1, idx_BR].set(x_BR, mode="drop")
    return scatter(logp_BR), scatter(entropy_BR)


def _scored(model: qwen.Qwen, h_BRD, tok_BR, temperature: float):
    """(log-probability, entropy) [B, R] of each token under the logits of the hidden state before
    it. With `cfg.logits_block` the vocabulary projection runs that many positions at a time
    (each block recomputed in the backward pass): [B, block, V] logits, never [B, R, V]."""
    def score(h_BKD, tok_BK):
        logp_BKV = jax.nn.log_softmax(model.logits(h_BKD) / temperature, axis=-1)
        return (jnp.take_along_axis(logp_BKV, tok_BK[..., None], axis=-1)[..., 0],
                -jnp.sum(jnp.exp(logp_BKV) * logp_BKV, axis=-1))

    (b, r), block = tok_BR.shape, model.cfg.logits_block
    if not block or r <= block:
        return score(h_BRD, tok_BR)
    pad = -r % block
    split = lambda x: jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2)).reshape(
        b, -1, block, *x.shape[2:]).swapaxes(0, 1)
    out = jax.lax.map(jax.checkpoint(lambda xs: score(*xs)), (split(h_BRD), split(tok_BR)))
    return tuple(x.swapaxes(0, 1).reshape(b, -1)[:, :r] for x in out)


def behaviour_weights(old_logp_BT, behaviour_logp_BT, mask_BT, cap: float):
    """Truncated importance weights min(exp(old − behaviour), cap) per token (1 off the responses)
    and their statistics over response tokens: mean weight, the share truncated, and the mean of
    behaviour − old logprob (an estimate of KL(behaviour ‖ old) on the sampled tokens)."""
    mask = np.asarray(mask_BT) > 0
    log_ratio = np.where(mask, np.asarray(old_logp_BT) - np.asarray(behaviour_logp_BT), 0.0)
    weight = np.where(mask, np.minimum(np.exp(log_ratio), cap), 1.0).astype(np.float32)
    n = max(int(mask.sum()), 1)
    stats = {"is_weight_mean": float(weight[mask].sum() / n),
             "is_truncated_frac": float((np.exp(log_ratio) > cap)[mask].sum() / n),
             "behaviour_kl": float(-log_ratio[mask].sum() / n)}
    return weight, stats


def _loss_terms(model, batch: Batch, cfg: LearnerConfig, window: int | None = None):
    logp_BT, entropy_BT = token_logprobs(model, batch.tokens_BT, batch.attn_mask_BT, cfg.temperature,
                                         batch.loss_mask_BT, window, batch.positions_B3T,
                                         batch.vision)
    num, den, sums = losses.policy_loss_terms(
        logp_BT, batch.old_logp_BT, batch.advantages_B, batch.loss_mask_BT, cfg.clip_low,
        cfg.clip_high, cfg.dual_clip, cfg.loss_agg, batch.is_weight_BT)
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
    """[B, ...] → [n, B/n, ...] for every field: micro-batch i takes rows i, i + n, i + 2n, ...,
    so each keeps a share of every device's rows (the batch is row-sharded) and the split moves
    no data. The loss sums over micro-batches, so which rows share one does not matter."""
    return jax.tree.map(lambda x: x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1),
                        batch)


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
    graphdef, params, other = nnx.split(model, qwen.trainable(model.cfg), ...)

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


@nnx.jit(static_argnums=(2, 3, 4))
def _policy_logprobs(model: qwen.Qwen, mb: Batch, temperature: float, window: int | None,
                     micro: int):
    """Logprobs of a mini-batch's tokens under `model`, one micro-batch at a time (no gradients)."""
    b, t = mb.tokens_BT.shape

    def one(x: Batch):
        return token_logprobs(model, x.tokens_BT, x.attn_mask_BT, temperature, x.loss_mask_BT,
                              window, x.positions_B3T, x.vision)[0]

    return jax.lax.map(one, _split(mb, b // micro)).swapaxes(0, 1).reshape(b, t)


def _rows(n: int, cfg: LearnerConfig, shards: int = 1) -> tuple[int, int]:
    """(mini-batches, rows per mini-batch) for n step samples; rows are a multiple of the
    micro-batch size and of `shards` (the devices the batch is split over)."""
    count = -(-n // (cfg.mini_batch_size or n))
    multiple = np.lcm.reduce([cfg.row_multiple, cfg.micro_batch_size or 1, shards])
    return count, int(-(-(-(-n // count)) // multiple) * multiple)


def mini_batches(order: np.ndarray, cfg: LearnerConfig, shards: int = 1
                 ) -> list[tuple[np.ndarray, int]]:
    """The step samples `order` (row indices) in ceil(n / mini_batch_size) mini-batches of nearly
    equal size: (row indices padded to one common row count, number of real rows) per mini-batch."""
    count, rows = _rows(len(order), cfg, shards)
    return [(np.concatenate([chunk, np.full(rows - len(chunk), chunk[0])]), len(chunk))
            for chunk in np.array_split(order, count)]


class Learner:
    """Owns the optimizer and, only when kl_coef > 0, a frozen copy of the initial policy."""

    def __init__(self, model: qwen.Qwen, cfg: LearnerConfig):
        if cfg.kl_kind not in ("k1", "k2", "k3"):
            raise ValueError(f"kl_kind={cfg.kl_kind!r}; choose k1, k2 or k3.")
        self.model, self.cfg = model, cfg
        # With LoRA only the adapters are trained and in the optimizer state.
        self.optimizer = nnx.Optimizer(model, make_optimizer(cfg), wrt=qwen.trainable(model.cfg))
        self.reference = None
        if cfg.kl_coef > 0:
            graphdef, state = nnx.split(model)
            self.reference = nnx.merge(graphdef, jax.tree.map(jnp.copy, state))

    def _shards(self) -> int:
        """Devices the batch rows are split over (the mesh's data × fsdp)."""
        mesh = self.model.layout.mesh if self.model.layout is not None else None
        return 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]

    def _logprobs(self, model, mb: dict[str, np.ndarray], window: int | None) -> np.ndarray:
        b = mb["tokens_BT"].shape[0]
        micro = self.cfg.micro_batch_size or b
        put = lambda k: batch_lib.place_field(mb[k], self.model.layout) if k in mb else None
        part = Batch(put("tokens_BT"), put("loss_mask_BT"), put("attn_mask_BT"), None, None,
                     positions_B3T=put("positions_B3T"), vision=put("vision"))
        return to_host(_policy_logprobs(model, part, self.cfg.temperature, window,
                                        micro if b % micro == 0 else b))

    def reference_logprobs(self, batch: Batch) -> jax.Array:
        """The frozen reference policy's logprobs at every position of `batch`."""
        if self.reference is None:
            raise ValueError("No reference policy: it is built only when kl_coef > 0.")
        host = batch_lib.to_host(batch)
        host["loss_mask_BT"] = np.ones_like(host["loss_mask_BT"])
        return jnp.asarray(self._logprobs(self.reference, host, None))

    def update(self, batch: Batch, rng: jax.Array | None = None) -> list[dict[str, float]]:
        """ppo_epochs × mini-batches optimiser steps; one metrics dict per step ([] when no row
        has response tokens).

        `batch`: host arrays as `batch.collate` pads them (device arrays are fetched). With `rng`,
        samples are shuffled before each epoch (otherwise kept in order, as verl's
        `shuffle=False`). Each mini-batch is placed sharded over the batch axes (`batch.place`).
        """
        host = batch_lib.to_host(batch)
        real = np.flatnonzero(host["loss_mask_BT"].sum(axis=1) > 0)
        if not len(real):
            return []
        is_stats = {}
        window = response_window(host["loss_mask_BT"]) if self.cfg.response_window else None
        shards = self._shards()
        # Old (and reference) logprobs of every sample before the first optimiser step, in the
        # first epoch's mini-batches when unshuffled (so its first ratio is exactly that of step 1).
        need_ref = self.cfg.kl_coef > 0 and "ref_logp_BT" not in host
        if self.cfg.recompute_old_logp or need_ref:
            old, ref = np.zeros_like(host["old_logp_BT"]), np.zeros_like(host["old_logp_BT"])
            for idx, n in mini_batches(real, self.cfg, shards):
                mb = batch_lib.rows(host, idx, n)
                if self.cfg.recompute_old_logp:
                    old[idx[:n]] = self._logprobs(self.model, mb, window)[:n]
                if need_ref:
                    ref[idx[:n]] = self._logprobs(self.reference, mb, window)[:n]
            if self.cfg.behaviour_is_cap:  # the collated logprobs are the sampler's
                host["is_weight_BT"], is_stats = behaviour_weights(
                    old, host["old_logp_BT"], host["loss_mask_BT"], self.cfg.behaviour_is_cap)
            if self.cfg.recompute_old_logp:
                host["old_logp_BT"] = old
            if need_ref:
                host["ref_logp_BT"] = ref
        host.setdefault("ref_logp_BT", np.zeros_like(host["old_logp_BT"]))
        out = []
        for epoch in range(self.cfg.ppo_epochs):
            order = real if rng is None else real[np.asarray(jax.random.permutation(
                jax.random.fold_in(rng, epoch), len(real)))]
            for idx, n in mini_batches(order, self.cfg, shards):
                mb = batch_lib.rows(host, idx, n)
                t0 = time.perf_counter()
                metrics = self._step(batch_lib.place_batch(mb, self.model.layout), window)
                step_s = time.perf_counter() - t0
                trained = mb["loss_mask_BT"].sum(axis=1) > 0
                adv = mb["advantages_B"][trained]
                metrics.update(step_s=step_s, samples=int(trained.sum()),
                               tokens_per_s=float(mb["attn_mask_BT"].sum()) / step_s,
                               adv_mean=float(adv.mean()), adv_std=float(adv.std()),
                               adv_min=float(adv.min()), adv_max=float(adv.max()), **is_stats)
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
