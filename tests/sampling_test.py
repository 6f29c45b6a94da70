"""Sampler: greedy parity with transformers, logprobs, truncated sampling, RNG, recompiles, meshes."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from skilljax import models, sampling, sharding
from skilljax.models import qwen
from skilljax.sampling import Sampler, SamplingParams
from tests.conftest import QWEN2_TINY, QWEN3_TINY, build_hf_model

PROMPTS = [[5, 17, 99, 4, 150, 8, 42], [3, 1], [120, 64, 33, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22],
           [77]]
EOS = 7


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    # qwen2_mha: one query head per KV head (G = 1), which takes the batched-dot decode path.
    mha = dict(QWEN2_TINY, num_key_value_heads=QWEN2_TINY["num_attention_heads"])
    for name, cfg in (("qwen2", QWEN2_TINY), ("qwen3", QWEN3_TINY), ("qwen2_mha", mha)):
        path = tmp_path_factory.mktemp(name)
        out[name] = (path, build_hf_model(path, **cfg, eos_token_id=EOS))
    return out


def hf_greedy(model, prompts, max_new, eos):
    import torch
    p = max(map(len, prompts))
    ids = torch.zeros((len(prompts), p), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, t in enumerate(prompts):
        ids[i, p - len(t):] = torch.tensor(t)
        mask[i, p - len(t):] = 1
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             eos_token_id=eos, pad_token_id=0)
    rows = []
    for row in out[:, p:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:cut])
    return rows


@pytest.mark.parametrize("which", ["qwen2", "qwen3", "qwen2_mha"])
def test_greedy_matches_transformers_generate(checkpoints, which):
    path, ref_model = checkpoints[which]
    _, model = models.load(path)
    out = Sampler(model).generate(PROMPTS, SamplingParams(max_new_tokens=24, temperature=0,
                                                          stop_token_ids=(EOS, 9)), jax.random.key(0))
    expected = hf_greedy(ref_model, PROMPTS, 24, [EOS, 9])
    assert out.token_ids == expected
    assert [len(t) for t in expected] == out.lengths.tolist()
    assert out.finish_reasons == ["stop" if t[-1] in (EOS, 9) else "length" for t in expected]
    if which == "qwen3":  # this random model stops some rows early and runs others to the limit
        assert {"stop", "length"} <= set(out.finish_reasons)


def full_forward_logprobs(model, prompt, generated):
    seq = jnp.asarray([prompt + generated])
    logp = jax.nn.log_softmax(qwen.forward(model, seq, jnp.ones_like(seq))[0], axis=-1)
    idx = np.arange(len(prompt) - 1, len(prompt) + len(generated) - 1)
    return np.asarray(logp)[idx, generated]


@pytest.mark.parametrize("params", [
    SamplingParams(max_new_tokens=12, temperature=0),
    SamplingParams(max_new_tokens=12, temperature=1.3, top_p=0.9, top_k=20),
])
def test_logprobs_equal_full_forward(checkpoints, params):
    for which in ("qwen3", "qwen2_mha"):
        _, model = models.load(checkpoints[which][0])
        out = Sampler(model).generate(PROMPTS, params, jax.random.key(3))
        for prompt, gen, logp in zip(PROMPTS, out.token_ids, out.logprobs):
            np.testing.assert_allclose(logp, full_forward_logprobs(model, prompt, gen), atol=1e-5)


def truncated_distribution(logits, temperature, top_k, top_p):
    """Reference: temperature, top-k, then top-p on the renormalised top-k distribution."""
    z = logits / temperature
    order = np.argsort(-z)
    keep = np.zeros_like(z, bool)
    k = top_k or len(z)
    probs = np.exp(z[order[:k]] - z[order[0]])
    probs /= probs.sum()
    mass_before = np.cumsum(probs) - probs
    keep[order[:k][mass_before < top_p]] = True
    p = np.where(keep, np.exp(z - z.max()), 0)
    return p / p.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.8, 8, 1.0), (1.0, 0, 0.7), (1.5, 12, 0.85)])
def test_sampling_frequencies_match_truncated_distribution(checkpoints, temperature, top_k, top_p):
    _, model = models.load(checkpoints["qwen2"][0])
    prompt = PROMPTS[0]
    seq = jnp.asarray([prompt])
    logits = np.asarray(qwen.forward(model, seq, jnp.ones_like(seq))[0, -1], np.float64)
    target = truncated_distribution(logits, temperature, top_k, top_p)
    full = truncated_distribution(logits, temperature, 0, 1.0)
    sampler = Sampler(model)
    params = SamplingParams(max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p,
                            return_sampling_logprobs=True)
    counts = np.zeros_like(target)
    for i in range(8):
        out = sampler.generate([prompt] * 256, params, jax.random.key(i))
        toks = np.array([t[0] for t in out.token_ids])
        np.add.at(counts, toks, 1)
        # The sampling logprob is the log of the truncated probability of that token.
        np.testing.assert_allclose([s[0] for s in out.sampling_logprobs], np.log(target[toks]),
                                   atol=1e-4)
    assert counts[target == 0].sum() == 0  # nothing outside the kept set
    # Pearson chi-square over the kept tokens; under the target it has mean df and std sqrt(2 df),
    # so mean + 5 std fails a correct sampler with negligible probability.
    kept = target > 0
    df = kept.sum() - 1
    limit = df + 5 * np.sqrt(2 * df)
    assert chi_square(counts[kept], target[kept]) < limit
    # The same counts are far from the untruncated distribution: the check can fail.
    assert chi_square(counts, full) > 3 * limit


def chi_square(counts, probs):
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


def test_rng_explicit(checkpoints):
    _, model = models.load(checkpoints["qwen3"][0])
    sampler = Sampler(model)
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    a = sampler.generate(PROMPTS, params, jax.random.key(1))
    b = sampler.generate(PROMPTS, params, jax.random.key(1))
    c = sampler.generate(PROMPTS, params, jax.random.key(2))
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_a_row_samples_the_same_whatever_shares_its_batch(checkpoints):
    """Randomness is per row: with its own key, a prompt gets the same sample alone, first or last
    in a larger batch (what lets a rollout split across processes sample what one process would)."""
    _, model = models.load(checkpoints["qwen3"][0])
    sampler = Sampler(model)
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    keys = jax.random.split(jax.random.key(7), len(PROMPTS))
    whole = sampler.generate(PROMPTS, params, keys)
    alone = sampler.generate(PROMPTS[2:3], params, keys[2:3])
    reversed_ = sampler.generate(PROMPTS[::-1], params, keys[::-1])
    assert alone.token_ids[0] == whole.token_ids[2]
    assert reversed_.token_ids[::-1] == whole.token_ids
    np.testing.assert_allclose(alone.logprobs[0], whole.logprobs[2], atol=1e-5)
    with pytest.raises(ValueError, match="one key per prompt"):
        sampler.generate(PROMPTS, params, keys[:2])


def test_collective_generate_as_process_one_of_two(checkpoints, monkeypatch):
    """`generate` in a two-process run, seen from process 1 (process 0's share faked): it samples
    the whole batch and keeps its rows; with no prompts of its own it still takes part; a bad
    prompt on either process raises on both (no process is left waiting in a collective)."""
    from skilljax import distributed
    _, model = models.load(checkpoints["qwen3"][0])
    sampler = Sampler(model)
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    keys = jax.random.split(jax.random.key(11), len(PROMPTS))
    whole = sampler.generate(PROMPTS, params, keys)
    other = {"ids": PROMPTS[:2], "keys": np.asarray(jax.random.key_data(keys[:2]))}

    def gather(obj):  # process 0's object first, then this process's
        return [len(other["ids"]) if isinstance(obj, int) else (other["ids"], other["keys"]), obj]

    monkeypatch.setattr(distributed, "count", lambda: 2)
    monkeypatch.setattr(distributed, "index", lambda: 1)
    monkeypatch.setattr(distributed, "allgather_objects", gather)
    mine = sampler.generate(PROMPTS[2:], params, keys[2:])
    assert mine.token_ids == whole.token_ids[2:]
    none = sampler.generate([], params, jax.random.split(jax.random.key(0), 0))
    assert none.token_ids == [] and len(none.lengths) == 0
    one_key = sampler.generate(PROMPTS[2:], params, jax.random.key(5))  # rows 2, 3 of the batch
    alone = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.key(5), np.arange(4))
    monkeypatch.setattr(distributed, "count", lambda: 1)
    assert one_key.token_ids == sampler.generate(PROMPTS, params, alone).token_ids[2:]
    monkeypatch.setattr(distributed, "count", lambda: 2)
    other["ids"] = [[1, 10**6]]
    with pytest.raises(ValueError, match="Prompt token ids must lie"):
        sampler.generate(PROMPTS[2:], params, keys[2:])


def test_no_recompile_within_a_bucket(checkpoints, monkeypatch):
    chex.clear_trace_counter()
    monkeypatch.setattr(sampling, "_decode", chex.assert_max_traces(sampling._decode, n=1))
    monkeypatch.setattr(sampling, "_prefill", chex.assert_max_traces(sampling._prefill, n=1))
    _, model = models.load(checkpoints["qwen3"][0])
    sampler = Sampler(model, compact=False)  # compaction compiles smaller batches
    # All these share batch bucket 4, prompt bucket 16 and generation bucket 16.
    for i, (temp, top_p, top_k, new) in enumerate([(0.0, 1.0, 0, 16), (0.7, 0.9, 0, 12),
                                                   (1.3, 1.0, 5, 9), (0.2, 0.5, 40, 16)]):
        prompts = [p[: 3 + i] for p in PROMPTS[:3]]
        out = sampler.generate(prompts, SamplingParams(max_new_tokens=new, temperature=temp, top_p=top_p,
                                                       top_k=top_k, stop_token_ids=(i,)),
                               jax.random.key(i))
        assert max(out.lengths) <= new


def test_stop_ids_cut_at_first_stop(checkpoints):
    _, model = models.load(checkpoints["qwen2"][0])
    sampler = Sampler(model)
    free = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=20, temperature=0), jax.random.key(0))
    assert free.finish_reasons == ["length"] * 4
    stop_a, stop_b = free.token_ids[0][4], free.token_ids[2][2]
    out = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=20, temperature=0,
                                                   stop_token_ids=(stop_a, stop_b)), jax.random.key(0))
    for full, cut, reason in zip(free.token_ids, out.token_ids, out.finish_reasons):
        first = next((i for i, t in enumerate(full) if t in (stop_a, stop_b)), None)
        if first is None:
            assert cut == full and reason == "length"
        else:
            assert cut == full[:first + 1] and reason == "stop"
    assert out.lengths[0] <= 5 and out.lengths[2] <= 3


@pytest.mark.parametrize("mesh_spec,layout", [
    ("data=2,fsdp=2,tensor=2", "fsdp_tp"),
    pytest.param("fsdp=8", "fsdp", marks=pytest.mark.slow),
    pytest.param("data=4,tensor=2", "tp", marks=pytest.mark.slow)])
def test_mesh_matches_single_device(checkpoints, mesh_spec, layout):
    path = checkpoints["qwen3"][0]
    _, single = models.load(path)
    _, sharded = models.load(path, sharding.make_mesh(mesh_spec), layout=layout)
    prompts = PROMPTS * 2  # 8 rows: one per device under fsdp=8
    for params in (SamplingParams(max_new_tokens=10, temperature=0),
                   SamplingParams(max_new_tokens=10, temperature=1.0, top_k=10)):
        a = Sampler(single).generate(prompts, params, jax.random.key(5))
        b = Sampler(sharded).generate(prompts, params, jax.random.key(5))
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs):
            np.testing.assert_allclose(x, y, atol=1e-5)


def test_bad_requests():
    _, model = models.load("tiny")
    sampler = Sampler(model, max_top_k=16)
    with pytest.raises(ValueError, match="max_top_k"):
        sampler.generate([[1]], SamplingParams(top_k=32), jax.random.key(0))
    with pytest.raises(ValueError, match="at least one token"):
        sampler.generate([[1], []], SamplingParams(), jax.random.key(0))
    with pytest.raises(ValueError, match=r"\[0, 512\)"):
        sampler.generate([[1, 600]], SamplingParams(), jax.random.key(0))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


def test_buckets():
    assert [sampling.bucket_length(n) for n in (1, 16, 17, 24, 25, 33, 65, 100, 1024, 1025, 1600)] \
        == [16, 16, 24, 24, 32, 48, 96, 128, 1024, 1536, 2048]
    assert [sampling.bucket_length(n, minimum=1) for n in (1, 2, 3, 5, 7, 48, 49)] == \
        [1, 2, 3, 6, 8, 48, 64]


def _live_bytes():
    return sum(a.nbytes for a in jax.live_arrays() if not a.is_deleted())


@pytest.mark.slow  # in `bash run.sh test-slow`: ~30 s
def test_repeated_calls_with_new_shapes_do_not_grow_device_memory():
    """One KV cache at a time: a new shape frees the old cache before allocating its own, and the
    inference copy of the weights lives only during a call."""
    _, model = models.load("tiny", dtype="bfloat16")  # float32 weights: a bfloat16 copy per call
    sampler = Sampler(model)
    params = lambda n: SamplingParams(max_new_tokens=n, temperature=1.0)
    rounds = []
    for _ in range(3):
        for length, new in ((5, 8), (40, 30), (200, 100), (12, 8)):
            sampler.generate([[3] * length] * 6, params(new), jax.random.key(length))
        rounds.append(_live_bytes())
    peak_cache = 2 * 2 * 6 * 2 * (256 + 128) * 32 * 2  # k+v · L · B(8) · K · S · H · bf16 bytes
    assert rounds[1] == rounds[0] == rounds[2], rounds
    sampler.generate([[3] * 200] * 6, params(100), jax.random.key(0))
    held = _live_bytes() - rounds[0]  # the biggest cache is now the one held
    assert 0 < held <= peak_cache
    sampler.release()
    assert _live_bytes() < rounds[0]


def test_chunked_batches_sample_the_same_rows(checkpoints):
    _, model = models.load(checkpoints["qwen3"][0])
    prompts = PROMPTS * 3  # 12 rows
    params = SamplingParams(max_new_tokens=9, temperature=1.0, top_k=20)
    whole = Sampler(model).generate(prompts, params, jax.random.key(3))
    chunked = Sampler(model, max_batch=5)  # chunks of 4, one shape
    out = chunked.generate(prompts, params, jax.random.key(3))
    assert out.token_ids == whole.token_ids and out.finish_reasons == whole.finish_reasons
    for x, y in zip(out.logprobs, whole.logprobs):
        np.testing.assert_allclose(x, y, atol=1e-5)
    assert chunked._cache[0][0] == 4  # (rows, cache length) of the chunks
    with pytest.raises(ValueError, match="max_batch"):
        Sampler(model, max_batch=0)


def test_fsdp_decode_moves_no_weights():
    """Counted in the compiled decode loop on fsdp=8: gathering the weights once per generate into
    the tensor-parallel layout (and sampling each device's rows in place) leaves no all-gather in
    the loop; decoding in the training layout gathers weights at every token."""
    cfg = qwen.PRESETS["tiny"].replace(dtype="bfloat16")
    model = qwen.create(cfg, sharding.Layout(sharding.make_mesh("fsdp=8"), "fsdp"))
    gathered = Sampler(model).decode_collectives(16, 32, 16)
    in_place = Sampler(model, gather_weights=False).decode_collectives(16, 32, 16)
    print(f"decode-loop collectives, fsdp=8: gathered once {gathered}, training layout {in_place}")
    # Left: one all-reduce of a boolean, the loop's "every row done?" exit test.
    assert gathered["all-gather"] == 0 and gathered["all-reduce"] <= 1
    assert sum(gathered.values()) == gathered["all-reduce"]
    assert in_place["all-gather"] >= 4  # q, k, v, o, gate, up, down, embedding: in the loop body
    out = Sampler(model).generate([[1, 2, 3]] * 8, SamplingParams(max_new_tokens=4), jax.random.key(0))
    assert all(len(t) == 4 for t in out.token_ids)


def test_banned_ids_are_never_drawn():
    """A VL model's vision ids (`_Knobs.banned`) are never sampled, greedy or not, top-p still
    cuts the rest, and the policy logprob stays that of the whole distribution."""
    from skilljax.sampling import MAX_BANNED, MAX_STOP_IDS, _Knobs, _sample
    logits = jnp.asarray([[5.0, 4.0, 1.0, 0.5, -1.0, 0.0]] * 64)  # id 0 the likeliest, banned
    banned = jnp.asarray([0] + [-1] * (MAX_BANNED - 1), jnp.int32)
    full = jax.nn.log_softmax(logits[0])
    keys = jax.random.split(jax.random.key(0), 64)
    for temperature, top_p, top_k in ((0.0, 1.0, 0), (1.0, 1.0, 0), (1.0, 0.5, 0), (1.0, 1.0, 3),
                                      (2.0, 0.9, 0)):
        knobs = _Knobs(jnp.float32(temperature), jnp.float32(top_p), jnp.int32(top_k),
                       jnp.full(MAX_STOP_IDS, -1, jnp.int32), jnp.int32(8), banned, jnp.int32(0),
                       jnp.int32(-1))
        token, logp, _ = _sample(logits, keys, knobs, 16)
        token = np.asarray(token)
        assert (token != 0).all()
        np.testing.assert_allclose(np.asarray(logp), np.asarray(full)[token], rtol=1e-6)
        if temperature == 0.0 or top_p == 0.5:  # id 1 alone holds > half the allowed mass
            assert (token == 1).all()


def test_share_prefixes_groups_prompts_that_start_alike():
    a, b = list(range(10, 40)), list(range(100, 120))
    prompts = [a + [1, 2], b + [5], a + [3], a, [7] * 5, b + [6, 6], [9] * 40]
    prefixes, row_prefix, row_len = sampling.share_prefixes(prompts, min_shared=16)
    # a's three prompts share a[:29] (a itself keeps its last token), b's two share b; a prompt
    # with no partner is its own prefix but the last token.
    assert row_len.tolist() == [29, 20, 29, 29, 4, 20, 39]
    assert [prefixes[k] for k in row_prefix] == [a[:29], b, a[:29], a[:29], [7] * 4, b, [9] * 39]
    assert len(prefixes) == 4
    # Under min_shared, b's 20 shared tokens count as none.
    assert sampling.share_prefixes(prompts, min_shared=21)[2].tolist() == [29, 20, 29, 29, 4, 21, 39]
    assert sampling.share_prefixes([a, a, a])[2].tolist() == [29] * 3
    # Two tasks behind one 20-token template: each task's rollouts share their whole prompt,
    # not just the template the two tasks have in common.
    template = [1] * 20
    task_a, task_b = template + list(range(30, 60)), template + list(range(60, 90))
    prefixes, row_prefix, row_len = sampling.share_prefixes([task_a, task_b] * 4)
    assert sorted(map(tuple, prefixes)) == [tuple(task_a[:-1]), tuple(task_b[:-1])]
    assert row_prefix.tolist() == [row_prefix[0], row_prefix[1]] * 4 and row_len.tolist() == [49] * 8


@pytest.mark.parametrize("mesh_spec", [None, "data=2,fsdp=2,tensor=2"])
def test_shared_prefix_prefill_samples_as_the_unshared_path(checkpoints, mesh_spec):
    """A task's G rollouts: identical first prompts, then prompts that share the task text. The
    shared prefill runs each prefix once and gives the same tokens and logprobs."""
    path = checkpoints["qwen3"][0]
    kw = {} if mesh_spec is None else dict(mesh=sharding.make_mesh(mesh_spec), layout="fsdp_tp")
    _, model = models.load(path, **kw)
    rng = np.random.default_rng(0)
    tasks = [rng.integers(8, 160, 40).tolist() for _ in range(4)]
    first = [t for t in tasks for _ in range(4)]
    later = [t + rng.integers(8, 160, int(rng.integers(1, 20))).tolist() for t in first]
    keys = jax.random.split(jax.random.key(3), len(first))
    for prompts in (first, later):
        for params in (SamplingParams(max_new_tokens=10, temperature=1.0, top_k=20),
                       SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(EOS,))):
            plain = Sampler(model, share_prefix_min=0).generate(prompts, params, keys)
            sampler = Sampler(model)
            shared = sampler.generate(prompts, params, keys)
            assert shared.token_ids == plain.token_ids
            assert shared.finish_reasons == plain.finish_reasons
            for x, y in zip(shared.logprobs, plain.logprobs):
                np.testing.assert_allclose(x, y, atol=1e-5)
            timing = sampler.last_timing
            assert timing["prefill_tokens"] == sum(map(len, prompts))
            shared_len = 39 if prompts is first else 40  # a prompt keeps its last token
            assert timing["prefill_tokens_computed"] == 4 * shared_len + sum(
                len(p) - shared_len for p in prompts)
    with pytest.raises(ValueError, match="share_prefix_min"):
        Sampler(model, share_prefix_min=-1)


def test_finished_rows_leave_the_batch_and_the_rest_sample_as_before():
    """Compaction: once half the rows have stopped, the live ones go on in a smaller batch (one
    compile per batch bucket) and sample exactly what they would have in the full batch."""
    _, model = models.load("tiny", seed=0)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 500, int(rng.integers(3, 30))).tolist() for _ in range(13)]
    keys = jax.random.split(jax.random.key(1), len(prompts))
    free = Sampler(model, compact=False).generate(
        prompts, SamplingParams(max_new_tokens=40, temperature=1.0, top_k=20), keys)
    # Stop ids drawn from what rows 0-7 emit at steps 2, 6, 10, ...: rows end at varied steps.
    stops = tuple(sorted({free.token_ids[i][2 + 4 * i] for i in range(8)}))
    params = SamplingParams(max_new_tokens=40, temperature=1.0, top_k=20, stop_token_ids=stops)
    whole = Sampler(model, compact=False).generate(prompts, params, keys)
    sampler = Sampler(model)
    out = sampler.generate(prompts, params, keys)
    assert sorted(whole.lengths.tolist())[:8] != [40] * 8  # most rows stop early
    assert out.token_ids == whole.token_ids and out.finish_reasons == whole.finish_reasons
    for x, y in zip(out.logprobs, whole.logprobs):
        np.testing.assert_allclose(x, y, atol=1e-5)
    assert sampler._cache[0][0] < 16  # the last decode ran on a smaller batch than the 16 rows
