"""Sampler with images (Qwen2.5-VL): greedy parity with transformers' generate, logprobs equal to a
full forward pass, no recompiles within a bucket, chunks and an 8-device mesh equal to one device."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from skilljax import models, sampling, sharding
from skilljax.models import qwen, qwen_vl
from skilljax.sampling import Sampler, SamplingParams
from tests.models.qwen_vl_test import (CFG, IMAGE, MAX_PIXELS, build_hf_vl, history_image,
                                       noise_image, prompt)


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_5_vl_sampler")
    return path, build_hf_vl(path, seed=3)


def requests(images_per_row, seed=0):
    """(token ids, images as (pixel_values, grid_thw) or None) per prompt; rows of different
    lengths, so the batch is left-padded."""
    ids, images = [], []
    for r, row in enumerate(images_per_row):
        if row:
            pixels, grid, num_tokens = qwen_vl.images_to_inputs(CFG, row, max_pixels=MAX_PIXELS)
            images.append((pixels, grid))
        else:
            num_tokens = []
            images.append(None)
        ids.append([int(t) for t in prompt(num_tokens, [2 + 3 * r] + [3] * len(row), seed + r)])
    return ids, images


# Prompts with 1 and 2 images of different sizes and a text-only one; 39 merge units in all.
MIXED = [[noise_image(84, 140, 1)], [history_image(2, 2), noise_image(56, 56, 2)], [],
         [noise_image(112, 84, 3)]]


def hf_generate(ref, ids, images, max_new):
    """transformers' greedy generate on the left-padded batch (mm_token_type_ids: its M-RoPE)."""
    import torch
    t = max(map(len, ids))
    batch = np.zeros((len(ids), t), np.int64)
    mask = np.zeros_like(batch)
    for i, row in enumerate(ids):
        batch[i, t - len(row):], mask[i, t - len(row):] = row, 1
    present = [x for x in images if x is not None]
    with torch.no_grad():
        out = ref.generate(
            input_ids=torch.as_tensor(batch), attention_mask=torch.as_tensor(mask),
            pixel_values=torch.as_tensor(np.concatenate([x[0] for x in present])),
            image_grid_thw=torch.as_tensor(np.concatenate([x[1] for x in present])),
            mm_token_type_ids=torch.as_tensor((batch == IMAGE).astype(np.int64)),
            max_new_tokens=max_new, do_sample=False, pad_token_id=0)
    return out[:, t:].tolist()


@nnx.jit
def _full_logits(model, seq_BT, is_image_BT, positions_3BT, vision):
    x_BTD = model.embed(seq_BT)
    if vision is not None:
        x_BTD = qwen_vl.place_images(x_BTD, is_image_BT, model.visual(vision))
    h_BTD, _ = model.hidden_from_embeds(x_BTD, positions_3BT, qwen.causal_mask(
        jnp.ones_like(seq_BT)))
    return model.logits(h_BTD)


def full_forward_logprobs(model, prompt_ids, images, generated):
    """Policy logprobs of `generated` from one forward pass over prompt + response. The response
    is text whatever its ids (a random model may emit the image-pad id, which at decode, as in
    transformers, embeds as a token): the images fill the prompt's pads only, and the response's
    positions continue from the prompt's last."""
    seq = np.asarray([prompt_ids + generated])
    pixels, grid = images if images is not None else (None, None)
    positions, delta, vision = qwen_vl.prepare(model.cfg, seq[:, :len(prompt_ids)], None, pixels,
                                               grid)
    response = len(prompt_ids) + delta[0] + np.arange(len(generated))
    positions = np.concatenate([positions, np.broadcast_to(response, (3, 1, len(generated)))], -1)
    is_image = np.zeros(seq.shape, bool)
    is_image[:, :len(prompt_ids)] = seq[:, :len(prompt_ids)] == IMAGE
    logits = _full_logits(model, jnp.asarray(seq), jnp.asarray(is_image),
                          jnp.asarray(positions, jnp.int32), vision)
    logp = np.asarray(jax.nn.log_softmax(logits[0], axis=-1))
    idx = np.arange(len(prompt_ids) - 1, len(prompt_ids) + len(generated) - 1)
    return logp[idx, generated]


def test_greedy_matches_transformers_generate(vl_dir):
    """PIL images in (preprocessed by the sampler), one prompt alone, then the mixed batch."""
    path, ref = vl_dir
    _, model = models.load(path)
    sampler = Sampler(model, image_kw={"max_pixels": MAX_PIXELS})
    params = SamplingParams(max_new_tokens=10, temperature=0)
    for rows in ([MIXED[1]], MIXED):
        ids, images = requests(rows)
        out = sampler.generate(ids, params, jax.random.key(0), images=[r or None for r in rows])
        want = hf_generate(ref, ids, images, 10)
        print(f"{len(rows)} prompt(s), grids {[None if x is None else x[1].tolist() for x in images]}"
              f": tokens {out.token_ids}")
        assert out.token_ids == want
        assert out.finish_reasons == ["length"] * len(rows)
        assert len({t for row in out.token_ids for t in row}) > 3  # not one token repeated
    # Not vacuous: another picture of the same size changes the generation.
    ids, images = requests([MIXED[0]])
    other = sampler.generate(ids, params, jax.random.key(0), images=[[noise_image(84, 140, 7)]])
    assert other.token_ids != out.token_ids[:1]


@pytest.mark.parametrize("params", [
    SamplingParams(max_new_tokens=9, temperature=0),
    SamplingParams(max_new_tokens=9, temperature=1.2, top_p=0.9, top_k=20),
])
def test_logprobs_equal_full_forward(vl_dir, params):
    _, model = models.load(vl_dir[0])
    ids, images = requests(MIXED, seed=5)
    out = Sampler(model).generate(ids, params, jax.random.key(4), images=images)
    errs = []
    for prompt_ids, x, gen, logp in zip(ids, images, out.token_ids, out.logprobs):
        want = full_forward_logprobs(model, prompt_ids, x, gen)
        errs.append(float(np.max(np.abs(logp - want))))
        np.testing.assert_allclose(logp, want, atol=1e-5)
    print(f"temperature {params.temperature}: logprob max abs error per row {errs}")


def test_no_recompile_within_a_bucket(vl_dir, monkeypatch):
    """Other images (4 x 12, 12 x 4, 8 x 6 and two 4 x 4 patch grids: 8-12 merge units, padded to
    the bucket of 16), other prompts and every sampling setting: one prefill, one decode."""
    chex.clear_trace_counter()
    monkeypatch.setattr(sampling, "_decode", chex.assert_max_traces(sampling._decode, n=1))
    monkeypatch.setattr(sampling, "_prefill", chex.assert_max_traces(sampling._prefill, n=1))
    _, model = models.load(vl_dir[0])
    sampler = Sampler(model, compact=False)  # compaction compiles smaller batches
    settings = [(0.0, 1.0, 0, 16), (0.7, 0.9, 0, 12), (1.3, 1.0, 5, 9), (0.2, 0.5, 40, 16)]
    shapes = [[(56, 168)], [(168, 56)], [(112, 84)], [(56, 56), (56, 56)]]
    for i, ((temp, top_p, top_k, new), sizes) in enumerate(zip(settings, shapes)):
        ids, images = requests([[noise_image(h, w, 10 + i) for h, w in sizes], []], seed=i)
        assert 16 < max(map(len, ids)) <= 24  # one prompt bucket
        out = sampler.generate(ids, SamplingParams(max_new_tokens=new, temperature=temp,
                                                   top_p=top_p, top_k=top_k, stop_token_ids=(i,)),
                               jax.random.key(i), images=images)
        assert max(out.lengths) <= new


def test_padded_tower_keeps_real_features(vl_dir):
    """Padding merge units (the sampler's patch bucket) leaves every real feature as it was."""
    _, model = models.load(vl_dir[0])
    pixels, grid, _ = qwen_vl.images_to_inputs(CFG, [noise_image(84, 140, 1), history_image(2, 2)],
                                               max_pixels=MAX_PIXELS)
    vision = qwen_vl.vision_inputs(pixels, grid, CFG.vision)
    tower = nnx.jit(lambda m, v: m.visual(v))
    real = np.asarray(tower(model, vision))
    padded = np.asarray(tower(model, qwen_vl.pad_vision_inputs(vision, real.shape[0] + 13,
                                                               CFG.vision)))
    assert padded.shape == (real.shape[0] + 13, real.shape[1])
    np.testing.assert_allclose(padded[:real.shape[0]], real, rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # in `bash run.sh test-slow`: compiles the VL sampler on a mesh
def test_chunks_and_mesh_match_one_device(vl_dir):
    """max_batch chunks (one of them text only) and the fsdp_tp layout on
    data=2, fsdp=2, tensor=2 (weights gathered into tp for sampling) sample what one device does."""
    path = vl_dir[0]
    _, single = models.load(path)
    _, sharded = models.load(path, sharding.make_mesh("data=2,fsdp=2,tensor=2"), layout="fsdp_tp")
    # chunks of 2: images | text only | images
    ids, images = requests(MIXED[:3] + [[], MIXED[3], [noise_image(56, 56, 9)]], seed=8)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=20)
    keys = jax.random.split(jax.random.key(6), len(ids))
    whole = Sampler(single).generate(ids, params, keys, images=images)
    for name, sampler in (("chunks of 2", Sampler(single, max_batch=2)), ("mesh", Sampler(sharded))):
        out = sampler.generate(ids, params, keys, images=images)
        err = max(float(np.max(np.abs(x - y))) for x, y in zip(out.logprobs, whole.logprobs))
        print(f"{name}: logprob max abs difference {err:.1e}")
        assert out.token_ids == whole.token_ids
        assert err <= 1e-5
    # A row samples the same alone (with its key) as in the batch.
    alone = Sampler(single).generate(ids[1:2], params, keys[1:2], images=images[1:2])
    assert alone.token_ids[0] == whole.token_ids[1]


def test_bad_image_requests(vl_dir):
    _, model = models.load(vl_dir[0])
    sampler = Sampler(model)
    ids, images = requests([[noise_image(56, 56, 0)]])
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="one entry per prompt"):
        sampler.generate(ids, params, jax.random.key(0), images=images * 2)
    with pytest.raises(ValueError, match=r"holds 4 image-pad tokens \(id 250\); its images need 0"):
        sampler.generate(ids, params, jax.random.key(0))
    _, text_model = models.load("tiny")
    with pytest.raises(ValueError, match="images need a Qwen2.5-VL model"):
        Sampler(text_model).generate([[1, 2]], params, jax.random.key(0), images=[None])
    mixed_ids, mixed_images = requests(MIXED)
    swapped = [mixed_images[1], mixed_images[0], None, mixed_images[3]]
    with pytest.raises(ValueError, match=r"Prompt 0 holds 8 image-pad tokens \(id 250\); its "
                                         r"images need 12 \(8 \+ 4\)"):
        sampler.generate(mixed_ids, params, jax.random.key(0), images=swapped)
