"""Batched generation with a KV cache: jitted prefill, then a jitted `lax.while_loop` decode.

Prompts are left-padded to a bucketed length P; generated token i is written at cache slot P + i for
every row, while each row's RoPE position continues from its own prompt length. Batch size, prompt
length and generation length are rounded up to buckets, so a training run compiles a handful of
shapes. Temperature, top-p, top-k, stop ids and the exact max_new_tokens are traced values: changing
them never recompiles.

Memory: the sampler holds one KV cache, donated through prefill and decode and reused by the next
call of the same shape; a call with another shape frees it before allocating its own, so device
memory does not grow with the number of shapes seen. With `max_batch`, larger batches run in
chunks of at most that many rows (one shape for all chunks). Sampling runs on an inference copy of
the weights made once per `generate`: LoRA adapters folded in, cast to the compute dtype, and, when
the training layout shards weights over `fsdp`, gathered into the tensor-parallel layout (`tp`), so
the decode loop moves no weights between devices (`decode_collectives` counts what it does move).

Returned `logprobs` are log-softmax of the raw logits (the policy itself, temperature 1, no
truncation) at the sampled tokens: the "old logprobs" of GRPO. `sampling_logprobs` (optional) are
under the distribution actually sampled from (temperature, top-k, top-p).

Randomness is per row: `generate` takes one key per prompt (or one key, from which row i gets
`fold_in(key, i)`), and decode step j of a row draws from `fold_in(row_key, j)`. A row's sample
therefore does not depend on which other prompts share its batch, so a rollout split across
processes samples what one process would (`skilljax.rl.rollout` keys rows by task group).

In a multi-process run `generate` is collective: every process calls it once per turn with its own
prompts (possibly none); the prompts and keys are gathered, sampled as one global batch on the
global mesh, and each process gets its own rows back.

Images (Qwen2.5-VL, `skilljax.models.qwen_vl.QwenVL`): `generate(token_ids, params, rng,
images=[...])` with one entry per prompt: None (text only), a list of PIL images (preprocessed by
`vl_image` with the Sampler's `image_kw`), or a (pixel_values, grid_thw) pair as
`qwen_vl.images_to_inputs` returns it. A prompt's token ids already hold its images' image-pad
tokens, expanded as the HF processor writes them (t·h·w / m² per image, in order). The prefill runs
the vision tower over all images of the batch and M-RoPE positions [3, B, P] (`qwen_vl.rope_index`;
left padding sits at position 0, as in the text prefill); decoding is text, each row continuing at
its last position + 1 on all three M-RoPE rows (HF's `rope_deltas`: position = tokens so far +
delta). The image patches of a batch are padded to a bucket of merge units (`bucket_length`), so
images of nearby sizes share the tower's compile; the tower attends over all patches of a chunk at
once ([heads, patches, patches] scores), so `max_batch` also bounds its memory. A batch without
images takes the text prefill.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from skilljax import distributed
from skilljax import sharding as shd
from skilljax.distributed import to_host
from skilljax.models import qwen, qwen_vl, vl_image

MAX_STOP_IDS = 8  # stop ids are padded to this many (traced), -1 = unused


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0 → greedy
    top_p: float = 1.0        # 1 → off
    top_k: int = 0            # 0 → off; at most Sampler.max_top_k
    stop_token_ids: tuple[int, ...] = ()
    return_sampling_logprobs: bool = False

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}.")
        if len(self.stop_token_ids) > MAX_STOP_IDS:
            raise ValueError(f"At most {MAX_STOP_IDS} stop token ids, got {len(self.stop_token_ids)}.")


@dataclasses.dataclass
class SampleOutput:
    token_ids: list[list[int]]          # per prompt: generated ids, through the first stop token
    logprobs: list[np.ndarray]          # per prompt: policy logprob of each generated token
    lengths: np.ndarray                 # [B] number of generated tokens
    finish_reasons: list[str]           # "stop" (emitted a stop id) or "length"
    sampling_logprobs: list[np.ndarray] | None = None


def bucket_length(n: int, minimum: int = 16) -> int:
    """2^k and 1.5·2^k up to 1024 (16, 24, 32, 48, 64, 96, 128, 192, ...), then multiples of 512.

    Two buckets per octave: at most a third of a bucket is padding (powers of two alone waste up
    to half, and a prompt one token past 64 costs as much as 128), for twice the compiled shapes.
    """
    n = max(n, minimum)
    if n <= 1024:
        p = 1 << (n - 1).bit_length()
        return 3 * p // 4 if n <= 3 * p // 4 else p
    return -(-n // 512) * 512


MAX_BANNED = 4


class _Knobs(NamedTuple):
    temperature: jax.Array
    top_p: jax.Array
    top_k: jax.Array
    stop_ids: jax.Array
    max_new: jax.Array
    banned: jax.Array  # [MAX_BANNED] ids never sampled (-1: none), e.g. a VL model's image pads
    start: jax.Array   # the decode step this call begins at (a compacted batch continues)
    min_live: jax.Array  # the loop stops early once at most this many rows are live (-1: never)


def _inverse_cdf(weights_BK, u_B):
    """Index j per row with P(j) ∝ weights (≥ 0, some > 0 per row), from one uniform per row.

    The first index whose running sum reaches u × total, restricted to positive weights so float
    rounding can never pick an excluded entry.
    """
    cdf_BK = jnp.cumsum(weights_BK, axis=-1)
    hit_BK = (cdf_BK >= (u_B * cdf_BK[:, -1])[:, None]) & (weights_BK > 0)
    last_B = weights_BK.shape[-1] - 1 - jnp.argmax((weights_BK > 0)[:, ::-1], axis=-1)
    return jnp.where(jnp.any(hit_BK, axis=-1), jnp.argmax(hit_BK, axis=-1), last_B)


def _sample_two_level(weights_BV, u_B, chunk: int = 256):
    """Inverse-CDF sampling over a large vocabulary: pick a chunk by its mass, then a token in it.

    Two short cumulative sums instead of one over V; one uniform per row serves both levels.
    """
    b, v = weights_BV.shape
    pad = -v % chunk
    w_BCk = jnp.pad(weights_BV, ((0, 0), (0, pad))).reshape(b, -1, chunk)
    mass_BC = jnp.sum(w_BCk, axis=-1)
    c_B = _inverse_cdf(mass_BC, u_B)
    below_B = jnp.sum(jnp.where(jnp.arange(mass_BC.shape[1]) < c_B[:, None], mass_BC, 0), axis=-1)
    w_Bk = jnp.take_along_axis(w_BCk, c_B[:, None, None], axis=1)[:, 0]
    mass_B = jnp.take_along_axis(mass_BC, c_B[:, None], axis=-1)[:, 0]
    u_in_B = jnp.clip((u_B * jnp.sum(mass_BC, axis=-1) - below_B) / mass_B, 0.0, 1.0)
    return c_B * chunk + _inverse_cdf(w_Bk, u_in_B)


def _top_p_threshold(z_BV, top_p, iters: int = 40):
    """Largest t with P(z ≥ t) ≥ top_p, by bisection: the top-p cut without sorting the vocabulary.

    Keeping {z ≥ t} is exactly the sorted definition (smallest prefix whose mass reaches top_p);
    40 halvings of the logit range are below float32 resolution.
    """
    probs_BV = jax.nn.softmax(z_BV, axis=-1)

    def body(_, lohi):
        lo, hi = lohi
        mid = 0.5 * (lo + hi)
        ok = jnp.sum(jnp.where(z_BV >= mid[:, None], probs_BV, 0.0), axis=-1) >= top_p
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lowest_B = jnp.min(jnp.where(jnp.isfinite(z_BV), z_BV, jnp.inf), -1)  # banned ids: -inf
    lo, _ = jax.lax.fori_loop(0, iters, body, (lowest_B, jnp.max(z_BV, -1) + 1e-6))
    return lo


def _sample(logits_BV, keys_B, knobs: _Knobs, max_top_k: int):
    """(token, policy logprob, sampling logprob) per row; row b draws its uniform from keys_B[b].

    Temperature, then top-k, then top-p on the top-k-renormalised distribution (as in HF).
    Sampling is by inverse CDF with one uniform per row: a Gumbel per vocabulary entry costs more
    than the model's decode step on CPU for 32k+ vocabularies, and sorting the vocabulary for
    top-p costs far more again.
    """
    b, vocab = logits_BV.shape
    t = jnp.where(knobs.temperature > 0, knobs.temperature, 1.0)
    # Banned ids (a VL model's vision tokens) are never drawn; the policy logprob stays that of
    # the model's whole distribution, as the learner computes it.
    banned_V = jnp.any(jnp.arange(vocab)[:, None] == knobs.banned[None, :], axis=-1)
    allowed_BV = jnp.where(banned_V[None], -jnp.inf, logits_BV)
    z_BV = allowed_BV / t
    u_B = jax.vmap(jax.random.uniform)(keys_B)

    def with_top_k():
        # Top-k candidates come sorted, so top-p within them is a prefix.
        top_BK, ids_BK = jax.lax.top_k(z_BV, min(max_top_k, vocab))
        probs_BK = jax.nn.softmax(jnp.where(jnp.arange(top_BK.shape[-1]) < knobs.top_k, top_BK,
                                            -jnp.inf), axis=-1)
        keep_BK = ((jnp.cumsum(probs_BK, axis=-1) - probs_BK) < knobs.top_p) & (probs_BK > 0)
        w_BK = jnp.where(keep_BK.at[:, 0].set(True), probs_BK, 0.0)
        j_B = _inverse_cdf(w_BK, u_B)
        pick = lambda a: jnp.take_along_axis(a, j_B[:, None], axis=-1)[:, 0]
        return pick(ids_BK), jnp.log(pick(w_BK) / jnp.sum(w_BK, axis=-1))

    def over_vocab():
        threshold_B = jax.lax.cond(knobs.top_p < 1, lambda: _top_p_threshold(z_BV, knobs.top_p),
                                   lambda: jnp.full((b,), -jnp.inf, z_BV.dtype))
        w_BV = jnp.where(z_BV >= threshold_B[:, None], jnp.exp(z_BV - jnp.max(z_BV, -1, keepdims=True)),
                         0.0)
        token_B = _sample_two_level(w_BV, u_B)
        w_tok = jnp.take_along_axis(w_BV, token_B[:, None], axis=-1)[:, 0]
        return token_B, jnp.log(w_tok / jnp.sum(w_BV, axis=-1))

    def sampled():
        return jax.lax.cond(knobs.top_k > 0, with_top_k, over_vocab)

    def greedy():  # the sampling distribution is a point mass: log-probability 0
        return jnp.argmax(allowed_BV, axis=-1), jnp.zeros((b,), z_BV.dtype)

    # Only the branch in use runs: greedy evaluation skips the sampling work entirely.
    token_B, sampling_logp_B = jax.lax.cond(knobs.temperature <= 0, greedy, sampled)
    token_B = token_B.astype(jnp.int32)
    policy_logp_B = (jnp.take_along_axis(logits_BV, token_B[:, None], axis=-1)[:, 0]
                     - jax.nn.logsumexp(logits_BV, axis=-1))
    return token_B, policy_logp_B, sampling_logp_B


class _DecodeState(NamedTuple):
    step: jax.Array
    cache: list
    logits_BV: jax.Array
    done_B: jax.Array
    length_B: jax.Array
    stopped_B: jax.Array
    tokens_BN: jax.Array
    logp_BN: jax.Array
    sampling_logp_BN: jax.Array


def _prefill(graphdef, state, cache, tokens_BP, mask_BP, positions_B3P=None, vision=None):
    """Last-position logits and the filled cache. With images: their M-RoPE positions (batch
    first, so the rows shard like the tokens) and the tower's inputs (`qwen_vl.VisionInputs`)."""
    model = nnx.merge(graphdef, state)
    p, s = tokens_BP.shape[1], cache.k_LBKSH.shape[3]
    positions_BP = (qwen.positions_from_mask(mask_BP) if vision is None
                    else jnp.moveaxis(positions_B3P, 1, 0))  # [3, B, P]
    valid_BS = jnp.zeros((tokens_BP.shape[0], s), bool).at[:, :p].set(mask_BP.astype(bool))
    causal_PS = jnp.arange(s)[None, :] <= jnp.arange(p)[:, None]
    images = {} if vision is None else {"vision": vision}
    h_BPD, cache = model.hidden(tokens_BP, positions_BP, causal_PS[None] & valid_BS[:, None, :],
                                cache, 0, **images)  # a Python 0: a prefill (the cache is empty)
    return model.logits(h_BPD[:, -1:])[:, 0], cache


def _prefill_shared(graphdef, state, cache, prefix_UQ, prefix_mask_UQ, row_prefix_B, suffix_BR,
                    mask_BP):
    """`_prefill` for rows that share prompt prefixes: each of the U distinct prefixes [U, Q] runs
    once, its keys and values are copied into the cache rows of the prompts that start with it
    (`row_prefix_B`), and each row's own suffix [B, R] runs over them at slots Q.. (`mask_BP`: the
    whole prompts' mask [B, P], prefix part first, then the suffix, then P - Q - R empty slots
    that make P a prompt bucket: the decode that follows is the unshared path's program).
    Positions count real tokens as in `_prefill`, so a row's keys, values and logits are those of
    its whole prompt."""
    model = nnx.merge(graphdef, state)
    (u, q), (b, r), s = prefix_UQ.shape, suffix_BR.shape, cache.k_LBKSH.shape[3]
    p = mask_BP.shape[1]
    layers, _, kv, _, h = cache.k_LBKSH.shape
    put = lambda x: shd.constrain(x, qwen.CACHE_AXES, model.layout)
    small = qwen.LayerCache(*(put(jnp.zeros((layers, u, kv, q, h), c.dtype)) for c in cache))
    causal_QQ = jnp.tril(jnp.ones((q, q), bool))
    _, small = model.hidden(prefix_UQ, qwen.positions_from_mask(prefix_mask_UQ),
                            causal_QQ[None] & prefix_mask_UQ.astype(bool)[:, None, :], small, 0)
    cache = qwen.LayerCache(*(jax.lax.dynamic_update_slice(c, put(x[:, row_prefix_B]), (0,) * 5)
                              for c, x in zip(cache, small)))
    valid_BS = jnp.zeros((b, s), bool).at[:, :p].set(mask_BP.astype(bool))
    causal_RS = jnp.arange(s)[None, :] <= (q + jnp.arange(r))[:, None]
    h_BRD, cache = model.hidden(suffix_BR, qwen.positions_from_mask(mask_BP)[:, q:q + r],
                                causal_RS[None] & valid_BS[:, None, :], cache, q)
    return model.logits(h_BRD[:, -1:])[:, 0], cache


def share_prefixes(token_ids: Sequence[Sequence[int]], min_shared: int = 16
                   ) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """Groups of prompts that start alike, and the prefix each group runs once: (the distinct
    prefixes, each prompt's prefix index, each prompt's prefix length).

    Prompts are sorted, so those that share a prefix are neighbours; a run of neighbours saves
    (size - 1) × (its shortest common prefix) tokens. Runs are split at their weakest link (a
    Cartesian tree over the neighbours' common-prefix lengths) wherever the two halves save more
    apart: a task's G rollouts keep their task and skill text, and two tasks that share only the
    chat template are not merged. A prefix stays one token shorter than each of its prompts (the
    last token's row gives the logits); common prefixes under `min_shared` tokens count as none, and
    a prompt in no group is its own prefix but its last token."""
    n = len(token_ids)
    order = sorted(range(n), key=lambda i: token_ids[i])

    def common(a, b):
        m = min(len(a), len(b)) - 1  # each keeps its last token
        diff = np.flatnonzero(np.asarray(a[:m]) != np.asarray(b[:m]))
        c = int(diff[0]) if diff.size else m
        return c if c >= min_shared else 0

    lcp = np.array([common(token_ids[i], token_ids[j]) for i, j in zip(order, order[1:])], np.int64)
    best: dict[tuple[int, int], tuple[int, list[tuple[int, int]]]] = {}
    stack = [(0, n, False)]
    while stack:  # post-order over the Cartesian tree of `lcp` (no recursion limit)
        lo, hi, expanded = stack.pop()
        if hi - lo == 1:
            best[lo, hi] = (0, [(lo, hi)])
            continue
        k = lo + int(np.argmin(lcp[lo:hi - 1]))
        if not expanded:
            stack += [(lo, hi, True), (lo, k + 1, False), (k + 1, hi, False)]
            continue
        (s_left, c_left), (s_right, c_right) = best.pop((lo, k + 1)), best.pop((k + 1, hi))
        whole = (hi - lo - 1) * int(lcp[k])
        best[lo, hi] = ((whole, [(lo, hi)]) if whole > s_left + s_right
                        else (s_left + s_right, c_left + c_right))
    prefixes, row_prefix, row_len = [], np.zeros(n, np.int32), np.zeros(n, np.int32)
    for lo, hi in best[0, n][1]:
        rows = order[lo:hi]
        length = int(lcp[lo:hi - 1].min()) if hi - lo > 1 else len(token_ids[rows[0]]) - 1
        row_prefix[rows], row_len[rows] = len(prefixes), length
        prefixes.append(list(token_ids[rows[0]][:length]))
    return prefixes, row_prefix, row_len


def _decode(graphdef, state, cache, logits_BV, mask_BP, real_B, key_data_B2, knobs: _Knobs,
            max_new: int, max_top_k: int, delta_B=None):
    """The decode loop. `delta_B` (M-RoPE models): each row's rope delta, so that generated token
    i sits at position prompt length + delta + i (its last prompt position + 1 + i)."""
    model = nnx.merge(graphdef, state)
    keys_B = jax.random.wrap_key_data(key_data_B2)
    b, p = mask_BP.shape
    s = cache.k_LBKSH.shape[3]
    prompt_len_B = jnp.sum(mask_BP, axis=-1).astype(jnp.int32)
    if delta_B is not None:
        prompt_len_B = prompt_len_B + delta_B
    prompt_valid_BS = jnp.zeros((b, s), bool).at[:, :p].set(mask_BP.astype(bool))

    def cond(st: _DecodeState):
        live = jnp.sum(~st.done_B)
        return (st.step < knobs.max_new) & (live > 0) & (live > knobs.min_live)

    sample = lambda logits_BV, keys_B, knobs: _sample(logits_BV, keys_B, knobs, max_top_k)
    if model.layout is not None:  # rows are independent: sample each device's rows in place
        rows = model.layout.spec((b,), ("batch",))
        knob_specs = jax.tree.map(lambda _: jax.sharding.PartitionSpec(), knobs)
        sample = jax.shard_map(sample, mesh=model.layout.mesh,
                               in_specs=(jax.sharding.PartitionSpec(rows[0], None), rows, knob_specs),
                               out_specs=(rows, rows, rows), check_vma=False)

    def body(st: _DecodeState):
        step_keys_B = jax.vmap(jax.random.fold_in, (0, None))(keys_B, st.step)
        token_B, logp_B, slogp_B = sample(st.logits_BV, step_keys_B, knobs)
        live_B = ~st.done_B
        token_B = jnp.where(live_B, token_B, 0)
        is_stop_B = jnp.any(token_B[:, None] == knobs.stop_ids[None, :], axis=-1) & live_B
        upd = lambda buf, v: jax.lax.dynamic_update_slice(buf, v[:, None].astype(buf.dtype), (0, st.step))
        tokens_BN = upd(st.tokens_BN, token_B)
        logp_BN = upd(st.logp_BN, jnp.where(live_B, logp_B, 0.0))
        slogp_BN = upd(st.sampling_logp_BN, jnp.where(live_B, slogp_B, 0.0))
        # Feed the token back: slot p + step, position prompt_len + step.
        slot = p + st.step
        mask_B1S = (prompt_valid_BS | ((jnp.arange(s) >= p) & (jnp.arange(s) <= slot))[None])[:, None]
        logits_B1V, cache = model(token_B[:, None], (prompt_len_B + st.step)[:, None], mask_B1S,
                                  st.cache, slot)
        return _DecodeState(st.step + 1, cache, logits_B1V[:, 0], st.done_B | is_stop_B,
                            st.length_B + live_B, st.stopped_B | is_stop_B, tokens_BN, logp_BN,
                            slogp_BN)

    zeros_BN = jnp.zeros((b, max_new), jnp.float32)
    init = _DecodeState(knobs.start, cache, logits_BV, ~real_B, jnp.zeros(b, jnp.int32),
                        jnp.zeros(b, bool), jnp.zeros((b, max_new), jnp.int32), zeros_BN, zeros_BN)
    st = jax.lax.while_loop(cond, body, init)
    return (st.cache, st.logits_BV, st.tokens_BN, st.logp_BN, st.sampling_logp_BN, st.length_B,
            st.stopped_B, st.done_B, st.step)


def _compact(cache, logits_BV, rows_C):
    """The cache and next-token logits of rows `rows_C` only (a smaller batch for the rows still
    decoding)."""
    return (qwen.LayerCache(*(c[:, rows_C] for c in cache)), logits_BV[rows_C])


# One prompt's images: pixel values [patches, C·T·P·P] and grid_thw [images, 3], or None.
PromptImages = tuple[np.ndarray, np.ndarray] | None


def inference_layout(layout: shd.Layout | None) -> shd.Layout | None:
    """Where the sampler's weights live: the training layout, except that weights sharded over a
    `fsdp` axis are gathered into the tensor-parallel layout (batch still split over data × fsdp),
    so decoding does not gather every weight at every token."""
    if layout is None or layout.mesh.shape["fsdp"] == 1 or layout.name == "tp":
        return layout
    return shd.Layout(layout.mesh, "tp")


class Sampler:
    """Generates for a batch of token-id prompts (with their images, for a Qwen2.5-VL model) with
    the current weights of `model`.

    The model is read at every call, so a learner that updates it in place is sampled from as is.
    `max_batch`: rows per chunk (None: the whole batch at once). `gather_weights=False` keeps the
    training layout for decoding (for measurements). `image_kw`: `vl_image.preprocess` keywords
    (min_pixels, max_pixels) for prompts whose images come as PIL images. `share_prefix_min`:
    prompts of a chunk that share at least this many leading tokens (a task's G rollouts: its
    whole first prompt, then the task and skill text of every turn) prefill the shared part once
    (`share_prefixes`, `_prefill_shared`; 0 = off; text prompts only). `last_timing` counts the
    prompt tokens (`prefill_tokens`) and those the model ran (`prefill_tokens_computed`).
    `compact`: once at most half a batch's rows are still decoding, they go on in the smallest
    batch of the halving chain b → bucket(b / 2) → ... that holds them (finished rows stop costing
    compute; one decode compile per batch on the chain).
    """

    def __init__(self, model: qwen.Qwen, *, pad_id: int = 0, max_top_k: int = 64,
                 cache_dtype=None, max_batch: int | None = None, gather_weights: bool = True,
                 image_kw: Mapping[str, Any] | None = None, share_prefix_min: int = 16,
                 compact: bool = True):
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be >= 1 or None, got {max_batch}.")
        self.vl = isinstance(model.cfg, qwen_vl.QwenVLConfig)
        # A VL policy never writes vision tokens: an image-pad id in a response would be read as
        # an image slot when the learner rebuilds the sequence.
        banned = ([model.cfg.image_token_id, model.cfg.video_token_id,
                   model.cfg.vision_start_token_id, model.cfg.vision_end_token_id]
                  if self.vl else [])
        self.banned_ids = np.array(banned + [-1] * (MAX_BANNED - len(banned)), np.int32)
        if self.vl and pad_id == model.cfg.image_token_id:
            raise ValueError(f"pad_id {pad_id} is the image-pad token id.")
        self.image_kw = dict(image_kw or {})  # vl_image.preprocess keywords for PIL images
        if share_prefix_min < 0:
            raise ValueError(f"share_prefix_min must be >= 0 (0 = off), got {share_prefix_min}.")
        self.share_prefix_min, self.compact = share_prefix_min, compact
        self.model = model
        self.pad_id, self.max_top_k = pad_id, max_top_k
        self.cache_dtype, self.max_batch = cache_dtype, max_batch
        cfg = model.cfg
        self.layout = inference_layout(model.layout) if gather_weights else model.layout
        # Decoding always scans the (stacked) layers: unrolled, each layer's cache slice and
        # weights were copied at every token (1.55x slower decode, tiny preset on CPU).
        self.cfg = cfg.replace(lora_rank=0, param_dtype=cfg.dtype, scan_layers=True)
        self._converts = (cfg.lora_rank > 0 or cfg.param_dtype != cfg.dtype
                          or self.layout != model.layout)  # (scanning needs no conversion)
        self.graphdef, abstract = nnx.split(qwen_vl.abstract_model_of(self.cfg, self.layout))
        if self._converts:
            shardings = (None if self.layout is None
                         else shd.state_shardings(abstract, self.layout).to_pure_dict())
            train_graphdef = nnx.graphdef(model)
            self._convert = jax.jit(
                lambda state: qwen.merged_state(nnx.merge(train_graphdef, state),
                                                qwen.DTYPES[cfg.dtype]),
                out_shardings=shardings)
        self._cache: tuple[tuple[int, int], qwen.LayerCache] | None = None
        self._prefill = jax.jit(_prefill, static_argnums=0, donate_argnums=2)
        self._prefill_shared = jax.jit(_prefill_shared, static_argnums=0, donate_argnums=2)
        self._decode = jax.jit(_decode, static_argnums=(0, 8, 9), donate_argnums=2)
        self._compact = jax.jit(_compact)
        self.last_timing: dict[str, float] = {}

    def inference_state(self):
        """The weights sampled from, in the inference layout and compute dtype (module doc)."""
        if not self._converts:
            return nnx.state(self.model)
        return self._convert(nnx.state(self.model))

    def snapshot(self) -> "PinnedSampler":
        """This sampler on a copy of the model's current weights (in the inference layout and
        compute dtype), which later updates of the model do not touch: what a rollout running
        while the learner updates (and donates) the weights samples from. It holds one more copy
        of the weights on the devices while it lives."""
        state = self.inference_state()
        if not self._converts:  # the model's own buffers: the learner donates them
            state = jax.tree.map(jnp.copy, state)
        return PinnedSampler(self, state)

    def _take_cache(self, b: int, s: int) -> qwen.LayerCache:
        """The held cache when it has this shape; otherwise it is freed and a new one made."""
        if self._cache is not None and self._cache[0] == (b, s):
            cache, self._cache = self._cache[1], None
            return cache
        self.release()
        return qwen.init_cache(self.cfg, self.layout, b, s, self.cache_dtype)

    def release(self) -> None:
        """Free the held KV cache now (the next call allocates one)."""
        if self._cache is not None:
            for a in self._cache[1]:
                a.delete()
        self._cache = None

    def _batch_bucket(self, b: int) -> int:
        n = bucket_length(b, minimum=1)
        if self.layout is not None:
            dp = self.layout.mesh.shape["data"] * self.layout.mesh.shape["fsdp"]
            n = -(-n // dp) * dp
        return n

    def _put(self, x: np.ndarray, axes):
        if self.layout is None:
            return jax.device_put(x)  # (jnp.asarray compiles a program per shape)
        return distributed.put_rows(x, self.layout.sharding(x.shape, axes))

    def prepare(self, token_ids: Sequence[Sequence[int]], max_new_tokens: int, *,
                batch: int | None = None, prompt_len: int | None = None):
        """Left-padded bucketed batch: (tokens_BP, mask_BP, cache length, generation bucket).
        `batch` / `prompt_len`: at least this many rows / prompt positions (chunks share a shape)."""
        b = self._batch_bucket(max(len(token_ids), batch or 0))
        p = bucket_length(max(max(len(t) for t in token_ids), prompt_len or 0))
        n = bucket_length(max_new_tokens)
        max_pos = self.model.cfg.max_position_embeddings
        if max(len(t) for t in token_ids) + max_new_tokens > max_pos:
            raise ValueError(f"Prompt plus max_new_tokens exceeds the model's "
                             f"max_position_embeddings={max_pos}.")
        tokens, mask = self._left_padded(token_ids, b, p)
        mask[len(token_ids):, -1] = 1  # filler rows: one fake token; they start done
        return tokens, mask, p + n, n

    def _left_padded(self, seqs: Sequence[Sequence[int]], rows: int, width: int):
        """(tokens, mask) [rows, width]: each sequence right-aligned, pad ids before it; rows past
        the sequences are all padding."""
        tokens = np.full((rows, width), self.pad_id, np.int32)
        mask = np.zeros((rows, width), np.int32)
        for i, t in enumerate(seqs):
            tokens[i, width - len(t):], mask[i, width - len(t):] = t, 1
        return tokens, mask

    def generate(self, token_ids: Sequence[Sequence[int]], params: SamplingParams,
                 rng: jax.Array, images: Sequence | None = None, *, weights=None
                 ) -> SampleOutput:
        """Generate for each prompt. `rng`: one key (row i of the whole batch, all processes' prompts
        in process order, samples from `fold_in(rng, i)`) or one key per prompt (shape
        [len(token_ids)]). `images` (a Qwen2.5-VL model): one entry per prompt, None, a list of PIL
        images or a (pixel_values, grid_thw) pair (module doc). Collective in a multi-process run
        (module doc): every process calls it, possibly with no prompts, and bad requests raise on
        every process alike. `weights`: sample from these (an `inference_state()`) instead of
        the model's current weights (see `snapshot`). `rng` may also be raw key data, one row
        per prompt (a uint32 numpy array [prompts, key words], `jax.random.key_data` of the keys):
        no device work, so no small program compiled for each number of prompts."""
        token_ids = [list(t) for t in token_ids]
        raw = isinstance(rng, np.ndarray)
        if raw and (rng.ndim != 2 or len(rng) != len(token_ids) or rng.dtype != np.uint32):
            raise ValueError(f"rng as key data: uint32 [{len(token_ids)}, key words], one row per "
                             f"prompt; got {rng.dtype} {rng.shape}.")
        if not raw and (rng.ndim not in (0, 1)
                        or (rng.ndim == 1 and rng.shape != (len(token_ids),))):
            raise ValueError(f"rng: one key, or one key per prompt ({len(token_ids)}), got keys "
                             f"of shape {rng.shape}.")
        if images is not None:
            if not self.vl:  # (the same model on every process)
                raise ValueError("images need a Qwen2.5-VL model (skilljax.models.qwen_vl); this "
                                 f"Sampler's model is a {type(self.model).__name__}.")
            images = list(images)
            if len(images) == len(token_ids):  # otherwise raised after the gather, everywhere
                images = [self._image_inputs(x) for x in images]
        multi = distributed.count() > 1
        start = 0
        if rng.ndim == 0 and multi:  # this process's rows' positions in the whole batch
            counts = distributed.allgather_objects(len(token_ids))
            start = sum(counts[:distributed.index()])
        if raw:
            key_data = rng
        else:
            keys = (jax.vmap(jax.random.fold_in, (None, 0))(rng, start + jnp.arange(len(token_ids)))
                    if rng.ndim == 0 else rng)
            key_data = np.asarray(jax.random.key_data(keys))  # [rows, key words]
        if multi:
            mine = (token_ids, key_data) if images is None else (token_ids, key_data, images)
            parts = distributed.allgather_objects(mine)
            start = sum(len(p[0]) for p in parts[:distributed.index()])
            all_ids, key_data = (distributed.concat(p[0] for p in parts),
                                 np.concatenate([p[1] for p in parts]))
        else:
            all_ids = token_ids
            parts = [(token_ids, key_data) if images is None else (token_ids, key_data, images)]
        if any(len(p) > 2 and len(p[2]) != len(p[0]) for p in parts):
            raise ValueError("images: one entry per prompt, got "
                             f"{[len(p[2]) if len(p) > 2 else None for p in parts]} entries for "
                             f"{[len(p[0]) for p in parts]} prompts (by process).")
        if any(len(p) > 2 for p in parts):  # a process without images sends none
            images = distributed.concat(p[2] if len(p) > 2 else [None] * len(p[0]) for p in parts)
        self._check(all_ids, params, images)  # the whole batch: every process raises alike
        out = self._generate(all_ids, key_data, params, images, weights)
        if not multi:
            return out
        rows = slice(start, start + len(token_ids))
        return SampleOutput(out.token_ids[rows], out.logprobs[rows], out.lengths[rows],
                            out.finish_reasons[rows], out.sampling_logprobs[rows]
                            if out.sampling_logprobs is not None else None)

    def _image_inputs(self, images) -> PromptImages:
        """One prompt's images as (pixel_values, grid_thw), or None for none."""
        if images is None or (isinstance(images, (list, tuple)) and len(images) == 0):
            return None
        if (isinstance(images, tuple) and len(images) == 2
                and all(isinstance(a, (np.ndarray, jax.Array)) for a in images)):
            pixels, grid = np.asarray(images[0], np.float32), np.asarray(images[1], np.int64)
            return pixels, grid.reshape(-1, 3)
        pixels, grid, _ = qwen_vl.images_to_inputs(self.model.cfg, list(images), **self.image_kw)
        return pixels, grid

    def _check(self, token_ids: list[list[int]], params: SamplingParams,
               images: list[PromptImages] | None = None) -> None:
        if params.top_k > self.max_top_k:
            raise ValueError(f"top_k={params.top_k} exceeds this Sampler's max_top_k="
                             f"{self.max_top_k}; construct Sampler(..., max_top_k=...).")
        vocab = self.model.cfg.vocab_size
        if not token_ids or any(len(t) == 0 for t in token_ids):
            raise ValueError("Every prompt needs at least one token.")
        if any(min(t) < 0 or max(t) >= vocab for t in token_ids):
            raise ValueError(f"Prompt token ids must lie in [0, {vocab}).")
        if not self.vl:
            return
        cfg = self.model.cfg
        for i, ids in enumerate(token_ids):
            x = None if images is None else images[i]
            want = ([] if x is None
                    else vl_image.num_image_tokens(x[1], cfg.vision.spatial_merge_size))
            have = sum(t == cfg.image_token_id for t in ids)
            if have != sum(want):
                raise ValueError(f"Prompt {i} holds {have} image-pad tokens (id "
                                 f"{cfg.image_token_id}); its images need {sum(want)} "
                                 f"({' + '.join(map(str, want)) or 'no images'}).")
            if x is not None and x[0].shape != (int(np.prod(x[1], axis=-1).sum()),
                                                cfg.vision.patch_dim):
                raise ValueError(f"Prompt {i}: pixel_values of shape {x[0].shape}, its grid_thw "
                                 f"{x[1].tolist()} needs {cfg.vision.patch_dim} values for each "
                                 "of its patches.")

    def _units(self, images: list[PromptImages]) -> int:
        """Merge units (image-pad tokens) of these prompts' images together."""
        m = self.model.cfg.vision.spatial_merge_size
        return sum(sum(vl_image.num_image_tokens(x[1], m)) for x in images if x is not None)

    def _generate(self, token_ids: list[list[int]], key_data: np.ndarray,
                  params: SamplingParams, images: list[PromptImages] | None = None,
                  weights=None) -> SampleOutput:
        rows = len(token_ids)
        chunks = -(-rows // (self.max_batch or rows))
        size = -(-rows // chunks)
        prompt_len = max(len(t) for t in token_ids)
        if images is not None and all(x is None for x in images):
            images = None
        # Every chunk with images pads its patches to the largest chunk's bucket: one tower shape.
        units = None if images is None else bucket_length(max(
            self._units(images[lo:lo + size]) for lo in range(0, rows, size)))
        state = self.inference_state() if weights is None else weights
        outs, timing = [], {}
        for lo in range(0, rows, size):
            out = self._chunk(state, token_ids[lo:lo + size], key_data[lo:lo + size], params,
                              size, prompt_len, None if images is None else images[lo:lo + size],
                              units)
            outs.append(out)
            for k, v in self.last_timing.items():
                timing[k] = timing.get(k, 0) + v
        del state
        self.last_timing = timing
        if len(outs) == 1:
            return outs[0]
        cat = lambda name: [x for o in outs for x in getattr(o, name)]
        return SampleOutput(cat("token_ids"), cat("logprobs"),
                            np.concatenate([o.lengths for o in outs]), cat("finish_reasons"),
                            cat("sampling_logprobs") if params.return_sampling_logprobs else None)

    def _share_plan(self, token_ids: list[list[int]], b: int, p: int, n: int):
        """The shared-prefix prefill of a chunk (`_prefill_shared`), or None where it would not
        save a quarter of the padded prefill tokens (or would stretch the cache by over half the
        prompt bucket): (prompt mask [b, P], cache length, its device arguments but the mask,
        prompt tokens it computes). P is the bucket of Q + R, so the cache and the decode have
        the shapes of an unshared batch (one decode program for both paths)."""
        prefixes, row_prefix, row_len = share_prefixes(token_ids, self.share_prefix_min)
        row_len = row_len.tolist()
        # Prefix rows in powers of two (not the 1.5x buckets): fewer shapes of plans in a run
        # (each compiled program costs XLA:CPU hundreds of memory mappings, `skilljax.jit_cache`).
        u = self._batch_bucket(1 << (len(prefixes) - 1).bit_length())
        q = bucket_length(max(len(x) for x in prefixes))
        r = bucket_length(max(len(t) - l for t, l in zip(token_ids, row_len)))
        if u * q + b * r > 0.75 * b * p or bucket_length(q + r) > p + p // 2:
            return None
        prefix, prefix_mask = self._left_padded(prefixes, u, q)  # filler rows: never read
        suffix, suffix_mask = self._left_padded([t[l:] for t, l in zip(token_ids, row_len)], b, r)
        rows = np.zeros(b, np.int32)  # filler rows: prefix 0 and one fake token; they start done
        rows[:len(token_ids)] = row_prefix
        suffix_mask[len(token_ids):, -1] = 1
        width = bucket_length(q + r)
        mask = np.concatenate([prefix_mask[rows], suffix_mask,
                               np.zeros((b, width - q - r), np.int32)], axis=1)
        computed = (sum(len(prefixes[k]) for k in set(row_prefix.tolist()))
                    + int(sum(len(t) - l for t, l in zip(token_ids, row_len))))
        args = (self._put(prefix, ("batch", "seq")), self._put(prefix_mask, ("batch", "seq")),
                self._put(rows, ("batch",)), self._put(suffix, ("batch", "seq")))
        return mask, width + n, args, computed

    def _vision_args(self, tokens: np.ndarray, mask: np.ndarray, images: list[PromptImages],
                     units: int):
        """Prefill extras of a chunk with images: (M-RoPE positions [B, 3, P], tower inputs padded
        to `units` merge units) and the rope deltas [B] of its decode."""
        cfg = self.model.cfg
        present = [x for x in images if x is not None]
        if not present:  # a chunk of text prompts among chunks with images: the text prefill
            return (), self._put(np.zeros(len(images), np.int32), ("batch",))
        pixels = np.concatenate([x[0] for x in present])
        grid = np.concatenate([x[1] for x in present])
        positions_3BP, delta_B, vision = qwen_vl.prepare(cfg, tokens, mask, pixels, grid)
        vision = qwen_vl.pad_vision_inputs(vision, units, cfg.vision)
        replicated = lambda a: self._put(np.asarray(a), (None,) * np.ndim(a))
        positions_B3P = self._put(np.ascontiguousarray(positions_3BP.transpose(1, 0, 2)),
                                  ("batch", None, "seq"))
        return ((positions_B3P, qwen_vl.VisionInputs(*map(replicated, vision))),
                self._put(delta_B, ("batch",)))

    def _chunk(self, state, token_ids: list[list[int]], key_data: np.ndarray,
               params: SamplingParams, batch: int, prompt_len: int,
               images: list[PromptImages] | None = None, units: int | None = None
               ) -> SampleOutput:
        tokens, mask, s, n = self.prepare(token_ids, params.max_new_tokens, batch=batch,
                                          prompt_len=prompt_len)
        b = tokens.shape[0]
        shared = (None if images is not None or not self.share_prefix_min
                  else self._share_plan(token_ids, b, tokens.shape[1], n))
        if shared is not None:
            mask, s, shared_args, computed = shared
        cache = self._take_cache(b, s)
        stop = np.full(MAX_STOP_IDS, -1, np.int32)
        stop[:len(params.stop_token_ids)] = params.stop_token_ids
        knobs = _Knobs(jnp.float32(params.temperature), jnp.float32(params.top_p),
                       jnp.int32(params.top_k), jnp.asarray(stop), jnp.int32(params.max_new_tokens),
                       jnp.asarray(self.banned_ids), jnp.int32(0), jnp.int32(-1))
        tokens_d = self._put(tokens, ("batch", "seq"))
        mask_d = self._put(mask, ("batch", "seq"))
        real_d = self._put(np.arange(b) < len(token_ids), ("batch",))
        keys = np.zeros((b, key_data.shape[1]), key_data.dtype)  # filler rows: any key
        keys[:len(token_ids)] = key_data
        keys_d = self._put(keys, ("batch", None))
        vision_args, delta = (), ()
        if images is not None:  # filler rows: no images (delta 0)
            vision_args, delta_d = self._vision_args(
                tokens, mask, list(images) + [None] * (b - len(token_ids)), units)
            delta = (delta_d,)

        t0 = time.perf_counter()
        if shared is None:
            logits, cache = self._prefill(self.graphdef, state, cache, tokens_d, mask_d,
                                          *vision_args)
            computed = int(mask[:len(token_ids)].sum())
        else:
            logits, cache = self._prefill_shared(self.graphdef, state, cache, *shared_args, mask_d)
        logits.block_until_ready()
        t1 = time.perf_counter()
        out_tokens, lengths, stopped = (np.zeros((b, n), np.int32), np.zeros(b, np.int32),
                                        np.zeros(b, bool))
        logp, slogp = np.zeros((b, n), np.float32), np.zeros((b, n), np.float32)
        # Rows of the decoding batch → rows of the chunk (-1: filler). Once at most half the rows
        # are live, the loop stops and the live rows go on in the smallest batch of the halving
        # chain b → bucket(b / 2) → ... that holds them: finished rows stop costing compute (one
        # decode compile per batch on the chain).
        where, step, width = np.arange(b), 0, b
        where[len(token_ids):] = -1
        host = {"mask": mask, "keys": keys, "delta": to_host(delta[0]) if delta else None}
        while True:
            smaller = self.compact and self._batch_bucket(max(width // 2, 1)) < width
            knobs = knobs._replace(start=jnp.int32(step),
                                   min_live=jnp.int32(width // 2 if smaller else -1))
            cache, logits, *outs = self._decode(
                self.graphdef, state, cache, logits, mask_d, real_d, keys_d, knobs, n,
                self.max_top_k, *delta)
            tok_h, lp_h, slp_h, len_h, stop_h, done_h, end = (to_host(a) for a in outs)
            mine, end = where >= 0, int(end)
            for buf, part in ((out_tokens, tok_h), (logp, lp_h), (slogp, slp_h)):
                buf[where[mine], step:end] = part[mine, step:end]
            lengths[where[mine]] += len_h[mine]
            stopped[where[mine]] |= stop_h[mine]
            live = np.flatnonzero(~done_h & mine)
            step = end
            if step >= params.max_new_tokens or live.size == 0:
                break
            while (half := self._batch_bucket(max(width // 2, 1))) < width and half >= live.size:
                width = half  # down the halving chain from b: few (batch, cache) programs
            take = np.zeros(width, np.int32)  # filler rows: a copy of row 0, started done
            take[:live.size] = live
            cache, logits = self._compact(cache, logits, self._put(take, ("batch",)))
            where = np.where(np.arange(width) < live.size, where[take], -1)
            host = {k: None if v is None else v[take] for k, v in host.items()}
            mask_d = self._put(host["mask"], ("batch", "seq"))
            keys_d = self._put(host["keys"], ("batch", None))
            real_d = self._put(np.arange(width) < live.size, ("batch",))
            if delta:
                delta = (self._put(host["delta"], ("batch",)),)
        t2 = time.perf_counter()
        self._cache = ((width, s), cache)
        self.last_timing = {"prefill_s": t1 - t0, "decode_s": t2 - t1,
                            "prefill_tokens": int(mask[:len(token_ids)].sum()),
                            "prefill_tokens_computed": computed,
                            "decode_tokens": int(lengths[:len(token_ids)].sum())}

        rows = range(len(token_ids))
        return SampleOutput(
            token_ids=[out_tokens[i, :lengths[i]].tolist() for i in rows],
            logprobs=[logp[i, :lengths[i]] for i in rows],
            lengths=np.asarray(lengths[:len(token_ids)]),
            finish_reasons=["stop" if stopped[i] else "length" for i in rows],
            sampling_logprobs=([slogp[i, :lengths[i]] for i in rows]
                               if params.return_sampling_logprobs else None),
        )

    def lower(self, batch: int, prompt_len: int, max_new_tokens: int):
        """(prefill, decode) lowered at this request shape from abstract arguments, without
        allocating anything: for memory plans and collective counts (`.compile()` them)."""
        b, p, n = self._batch_bucket(batch), bucket_length(prompt_len), bucket_length(max_new_tokens)

        def arr(shape, dtype, axes):
            sharding = None if self.layout is None else self.layout.sharding(shape, axes)
            return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

        _, abstract = nnx.split(qwen_vl.abstract_model_of(self.cfg, self.layout))
        state = shd.abstract_state(abstract, self.layout).to_pure_dict()
        cache_shape = (self.cfg.num_layers, b, self.cfg.num_kv_heads, p + n, self.cfg.head_dim)
        cache_dtype = self.cache_dtype or qwen.DTYPES[self.cfg.dtype]
        cache = qwen.LayerCache(*(arr(cache_shape, cache_dtype, qwen.CACHE_AXES) for _ in range(2)))
        tokens, mask = arr((b, p), jnp.int32, ("batch", "seq")), arr((b, p), jnp.int32, ("batch", "seq"))
        key_words = jax.random.key_data(jax.random.key(0)).shape[-1]
        scalar = lambda d: jax.ShapeDtypeStruct((), d)
        knobs = _Knobs(scalar(jnp.float32), scalar(jnp.float32), scalar(jnp.int32),
                       jax.ShapeDtypeStruct((MAX_STOP_IDS,), jnp.int32), scalar(jnp.int32),
                       jax.ShapeDtypeStruct((MAX_BANNED,), jnp.int32), scalar(jnp.int32),
                       scalar(jnp.int32))
        prefill = self._prefill.lower(self.graphdef, state, cache, tokens, mask)
        decode = self._decode.lower(
            self.graphdef, state, cache, arr((b, self.cfg.vocab_size), jnp.float32, ("batch", "act_vocab")),
            mask, arr((b,), jnp.bool_, ("batch",)), arr((b, key_words), jnp.uint32, ("batch", None)),
            knobs, n, self.max_top_k)
        return prefill, decode

    def decode_collectives(self, batch: int, prompt_len: int, max_new_tokens: int) -> dict[str, int]:
        """Collective ops (all-gather, all-reduce, ...) in the compiled decode loop at this shape:
        what decoding moves between devices at every token."""
        return count_collectives(self.lower(batch, prompt_len, max_new_tokens)[1].compile().as_text())


COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


class PinnedSampler:
    """A Sampler sampling from fixed weights (`Sampler.snapshot`); everything else is the
    sampler's (its KV cache, buckets, `last_timing`)."""

    def __init__(self, sampler: Sampler, weights):
        self.sampler, self.weights = sampler, weights

    def generate(self, token_ids, params: SamplingParams, rng: jax.Array, images=None
                 ) -> SampleOutput:
        return self.sampler.generate(token_ids, params, rng, images, weights=self.weights)

    def __getattr__(self, name):
        return getattr(self.sampler, name)


def count_collectives(hlo_text: str) -> dict[str, int]:
    """Collective instructions in compiled HLO text, by kind (async start/done pairs count once)."""
    return {kind: len(re.findall(rf"(?<![\w.-]){kind}(?:-start)?\(", hlo_text))
            for kind in COLLECTIVES}
