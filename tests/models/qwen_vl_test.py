"""Qwen2.5-VL: image preprocessing and logits / greedy tokens against transformers on tiny random
checkpoints (window and full attention blocks, several image sizes, 1-2 images a prompt)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from PIL import Image

from skilljax import models, render, sharding
from skilljax.models import hf_io, qwen, qwen_vl, vl_image
from tests.conftest import rel_err

IMAGE, VIDEO, START, END = 250, 251, 252, 253
VL_TINY = dict(
    text_config=dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                     bos_token_id=None, eos_token_id=None, pad_token_id=None,
                     # head_dim 16: 8 frequencies, 2 temporal, 3 height, 3 width
                     rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                      "mrope_section": [2, 3, 3]}),
    # Windows of 56 px = 2 x 2 merge units; blocks 1 and 3 attend over the whole image.
    vision_config=dict(depth=4, hidden_size=32, intermediate_size=48, num_heads=2,
                       out_hidden_size=64, window_size=56, fullatt_block_indexes=[1, 3]),
    image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
    vision_end_token_id=END, tie_word_embeddings=False)
MAX_PIXELS = 28 * 28 * 12  # small images: at most 48 patches each
CFG = qwen_vl.QwenVLConfig(vocab_size=256, embed_dim=64, mlp_dim=96, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=16, model_type="qwen2", qkv_bias=True,
                           qk_norm=False, mrope_section=(2, 3, 3), image_token_id=IMAGE,
                           video_token_id=VIDEO, vision_start_token_id=START,
                           vision_end_token_id=END, vision=qwen_vl.VisionConfig(
                               depth=4, embed_dim=32, mlp_dim=48, num_heads=2, out_dim=64,
                               window_size=56, fullatt_block_indexes=(1, 3)))


def build_hf_vl(path, seed=0, **config):
    """A random Qwen2_5_VLForConditionalGeneration (eager attention, every tensor random), saved."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Qwen2_5_VLConfig(**{**VL_TINY, **config})
    model = transformers.Qwen2_5_VLForConditionalGeneration(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_q" in name:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            else:  # smaller in the tower: its attention stays soft, so masks and order show
                std = 0.05 if "visual" in name else 0.15
                p.copy_(std * torch.randn(p.shape, generator=gen))
    model.save_pretrained(path)
    return transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        path, attn_implementation="eager").eval()


def history_image(steps: int, cf: float) -> Image.Image:
    text = "\n".join(f"[Observation] You arrive at countertop {i}. On it you see a mug {i}, a "
                     f"knife {i}. [Action] take mug {i} from countertop {i}" for i in range(steps))
    return render.compress(render.render_text(text, 392, 10, render.ALFWORLD_HIGHLIGHTS), cf)


def noise_image(height, width, seed):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


# ----------------------------------------------------------------------------- preprocessing


def test_smart_resize_matches_transformers():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    for h in (1, 10, 28, 38, 55, 57, 300, 1001, 4000):
        for w in (14, 29, 402, 3000):
            if max(h, w) / min(h, w) > 200:
                continue
            for lo, hi in ((56 * 56, 28 * 28 * 1280), (28 * 28 * 4, 28 * 28 * 16)):
                assert vl_image.smart_resize(h, w, 28, lo, hi) == smart_resize(h, w, 28, lo, hi)


@pytest.mark.parametrize("size", [{}, {"shortest_edge": 28 * 28 * 64, "longest_edge": 28 * 28 * 256}])
def test_preprocess_equals_hf_processor_on_history_images(size):
    """Rendered histories of several lengths at cf 1, 2, 4 (incl. the 38 x 38 first image,
    which is upscaled to min_pixels, and tall ones the max_pixels bound shrinks)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    images = [history_image(steps, cf) for steps, cf in
              [(0, 1), (1, 1), (3, 2), (8, 4), (20, 1), (30, 2), (60, 1)]]
    images.append(images[2].convert("RGBA"))  # transparency composited onto white
    hf = Qwen2VLImageProcessorPil(**({"size": size} if size else {}))(images, return_tensors="np")
    kw = {"min_pixels": size["shortest_edge"], "max_pixels": size["longest_edge"]} if size else {}
    pixel_values, grid_thw = vl_image.preprocess(images, **kw)
    np.testing.assert_array_equal(grid_thw, hf["image_grid_thw"])
    assert pixel_values.dtype == np.float32 and pixel_values.shape == hf["pixel_values"].shape
    np.testing.assert_allclose(pixel_values, hf["pixel_values"], rtol=0, atol=1e-6)
    assert len(set(map(tuple, grid_thw))) >= 5  # the images really differ in size
    assert vl_image.num_image_tokens(grid_thw) == [int(np.prod(g)) // 4 for g in grid_thw]


# ----------------------------------------------------------------------------- the model


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_5_vl")
    return path, build_hf_vl(path)


def prompt(num_tokens_per_image, text_lens, seed):
    """Token ids: text runs with <vision_start> pads <vision_end> between them."""
    rng = np.random.default_rng(seed)
    ids = list(rng.integers(0, 240, text_lens[0]))
    for n, t in zip(num_tokens_per_image, text_lens[1:]):
        ids += [START] + [IMAGE] * n + [END] + list(rng.integers(0, 240, t))
    return ids


def batch(images_per_row, seed=0, max_pixels=MAX_PIXELS):
    """(ids [B, T] left-padded, mask, pixel_values, grid_thw) for rows of PIL images."""
    rows, pixels, grids = [], [], []
    for r, images in enumerate(images_per_row):
        pv, grid, num_tokens = qwen_vl.images_to_inputs(CFG, images, max_pixels=max_pixels)
        pixels.append(pv)
        grids.append(grid)
        rows.append(prompt(num_tokens, [3 + r] + [4] * len(images), seed + r))
    t = max(map(len, rows))
    ids = np.zeros((len(rows), t), np.int64)
    mask = np.zeros((len(rows), t), np.int64)
    for r, row in enumerate(rows):
        ids[r, t - len(row):], mask[r, t - len(row):] = row, 1
    return ids, mask, np.concatenate(pixels), np.concatenate(grids)


def hf_inputs(ids, mask, pixel_values, grid_thw):
    import torch
    return dict(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                pixel_values=torch.as_tensor(pixel_values),
                image_grid_thw=torch.as_tensor(grid_thw),
                mm_token_type_ids=torch.as_tensor((ids == IMAGE).astype(np.int64)))


def hf_logits(model, *args):
    import torch
    with torch.no_grad():
        return model(**hf_inputs(*args)).logits.float().numpy()


def our_logits(model, ids, mask, pixel_values, grid_thw, layout=None):
    positions, _, vision = qwen_vl.prepare(model.cfg, ids, mask, pixel_values, grid_thw)
    tokens = jnp.asarray(ids)
    if layout is not None:
        tokens = jax.device_put(tokens, layout.sharding(ids.shape, ("batch", "seq")))
    return np.asarray(qwen_vl.forward(model, tokens, jnp.asarray(mask), positions, vision))


CASES = {
    # 4 x 4 patches: one window; 6 x 10: windows cut through the image (2 x 3 of them)
    "one_image": [[noise_image(56, 56, 0)]],
    "two_images": [[noise_image(84, 140, 1), history_image(6, 4)]],
    # rows of different lengths, left-padded; 1 and 2 images
    "padded_batch": [[noise_image(112, 84, 2)], [history_image(2, 2), noise_image(60, 150, 3)]],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case, vl_dir):
    path, ref = vl_dir
    cfg, model = models.load(path)
    assert isinstance(cfg, qwen_vl.QwenVLConfig) and isinstance(model, qwen_vl.QwenVL)
    assert cfg.mrope_section == (2, 3, 3) and cfg.vision.fullatt_block_indexes == (1, 3)
    args = batch(CASES[case])
    ids, mask, _, grid_thw = args
    # M-RoPE positions as transformers computes them
    import torch
    hf_pos, hf_delta = ref.model.get_rope_index(
        torch.as_tensor(ids), mm_token_type_ids=torch.as_tensor((ids == IMAGE).astype(np.int64)),
        image_grid_thw=torch.as_tensor(grid_thw), attention_mask=torch.as_tensor(mask))
    positions, deltas, _ = qwen_vl.prepare(cfg, ids, mask, *args[2:])
    real = mask.astype(bool)
    np.testing.assert_array_equal(positions[:, real], hf_pos.numpy()[:, real])
    np.testing.assert_array_equal(deltas, hf_delta.numpy()[:, 0])

    out, want = our_logits(model, *args), hf_logits(ref, *args)
    err = rel_err(out[real], want[real])
    print(f"{case}: grids {grid_thw.tolist()}, logits max relative error {err:.2e}")
    assert err <= 1e-4


def test_logits_match_transformers_other_config(tmp_path):
    """Tied embeddings, GQA 4:1, θ = 1e6, other M-RoPE sections, 4 vision heads, 3 blocks with
    only the first attending fully, 112 px windows (4 x 4 merge units) over larger images."""
    ref = build_hf_vl(tmp_path, seed=1, tie_word_embeddings=True, text_config={
        **VL_TINY["text_config"], "num_key_value_heads": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 2, 2]}},
        vision_config={**VL_TINY["vision_config"], "depth": 3, "num_heads": 4, "window_size": 112,
                       "fullatt_block_indexes": [0]})
    cfg, model = models.load(tmp_path)
    assert cfg.tie_embeddings and cfg.vision.merger_window == 4 and cfg.mrope_section == (4, 2, 2)
    args = batch([[noise_image(168, 224, 5), history_image(12, 1)]], max_pixels=28 * 28 * 48)
    assert args[3].tolist() == [[1, 12, 16], [1, 10, 16]]
    out, want = our_logits(model, *args), hf_logits(ref, *args)
    err = rel_err(out, want)
    print(f"other config: grids {args[3].tolist()}, logits max relative error {err:.2e}")
    assert err <= 1e-4


def test_rope_index_text_only_and_mismatches():
    ids = np.array([[5, 6, 7, 8], [0, 0, 9, 10]])
    mask = np.array([[1, 1, 1, 1], [0, 0, 1, 1]])
    positions, deltas = qwen_vl.rope_index(ids, mask, None, CFG)
    np.testing.assert_array_equal(positions, np.broadcast_to([[0, 1, 2, 3], [0, 0, 0, 1]], (3, 2, 4)))
    np.testing.assert_array_equal(deltas, [0, 0])
    image = [START] + [IMAGE] * 4 + [END]  # a 4 x 4 patch grid: 2 x 2 merged
    with pytest.raises(ValueError, match="more images"):
        qwen_vl.rope_index(np.array([image]), None, [[1, 4, 4], [1, 4, 4]], CFG)
    with pytest.raises(ValueError, match="needs 6 consecutive"):
        qwen_vl.rope_index(np.array([image]), None, [[1, 4, 6]], CFG)
    with pytest.raises(ValueError, match="4 image-pad tokens in the prompt, 8 image features"):
        qwen_vl.prepare(CFG, np.array([image]), None, np.zeros((32, 1176)), [[1, 4, 8]])
    positions, deltas = qwen_vl.rope_index(np.array([[1] + image + [2]]), None, [[1, 4, 4]], CFG)
    np.testing.assert_array_equal(positions[:, 0], [[0, 1, 2, 2, 2, 2, 4, 5],   # temporal
                                                    [0, 1, 2, 2, 3, 3, 4, 5],   # height
                                                    [0, 1, 2, 3, 2, 3, 4, 5]])  # width
    np.testing.assert_array_equal(deltas, [6 - 8])


def test_windows_and_mrope_matter(vl_dir):
    """The parity above is not vacuous: all-full attention or 1-D positions change the logits."""
    path, ref = vl_dir
    args = batch(CASES["two_images"])
    ids, mask = args[:2]
    cfg, model = models.load(path)
    base = our_logits(model, *args)
    full_cfg, full = models.load(path, vision=dataclasses.replace(
        cfg.vision, fullatt_block_indexes=(0, 1, 2, 3)))
    assert rel_err(our_logits(full, *args), base) > 1e-3
    _, _, vision = qwen_vl.prepare(cfg, *args)
    flat = np.asarray(qwen_vl.forward(model, jnp.asarray(ids), jnp.asarray(mask),
                                      qwen.positions_from_mask(jnp.asarray(mask)), vision))
    assert rel_err(flat, base) > 1e-3


@pytest.mark.parametrize("layout,mesh_spec", [("fsdp_tp", "data=2,fsdp=2,tensor=2"),
                                              ("tp", "data=2,tensor=4")])
def test_mesh_logits_match_transformers(layout, mesh_spec, vl_dir):
    path, ref = vl_dir
    mesh = sharding.make_mesh(mesh_spec)
    assert mesh.size == 8
    _, model = models.load(path, mesh, layout=layout)
    params = {k: v.get_value() for k, v in hf_io._flat(nnx.state(model))}
    split = ["visual.blocks.mlp.up", "visual.blocks.mlp.down", "visual.merger.fc2",
             "layers.attn.q", "layers.mlp.gate"]
    if layout == "fsdp_tp":  # (2 vision heads stay whole on a tensor axis of 4)
        split += ["visual.blocks.attn.qkv", "visual.blocks.attn.proj", "visual.patch_embed"]
    for name in split:
        assert sharding.is_split(params[name]), (name, params[name].sharding.spec)
    args = batch(CASES["padded_batch"])
    real = args[1].astype(bool)
    out = our_logits(model, *args, layout=sharding.Layout(mesh, layout))
    err = rel_err(out[real], hf_logits(ref, *args)[real])
    print(f"{layout} on {mesh_spec}: logits max relative error {err:.2e}")
    assert err <= 1e-4


def greedy(model, ids, mask, pixel_values, grid_thw, steps):
    """Prefill with the images into a KV cache, then text decode steps; greedy tokens [B, steps]."""
    b, t = ids.shape
    s = t + steps
    positions, deltas, vision = qwen_vl.prepare(model.cfg, ids, mask, pixel_values, grid_thw)
    valid_S = np.zeros((b, s), bool)
    valid_S[:, :t] = mask.astype(bool)
    valid_S[:, t:] = True
    call = nnx.jit(lambda m, *args: m(*args))
    cache = model.init_cache(b, s)
    causal = np.arange(s)[None, None, :] <= np.arange(t)[None, :, None]
    logits, cache = call(model, jnp.asarray(ids), positions, jnp.asarray(causal & valid_S[:, None]),
                         cache, jnp.int32(0), vision)
    token = np.asarray(jnp.argmax(logits[:, -1], -1))
    out, count = [token], mask.sum(-1)
    for i in range(1, steps):
        step_positions = np.broadcast_to((count + deltas)[None, :, None], (3, b, 1)).astype(np.int32)
        step_mask = (np.arange(s) <= t + i - 1)[None, None, :] & valid_S[:, None]
        logits, cache = call(model, jnp.asarray(token[:, None]), step_positions,
                             jnp.asarray(step_mask), cache, jnp.int32(t + i - 1), None)
        token, count = np.asarray(jnp.argmax(logits[:, -1], -1)), count + 1
        out.append(token)
    return np.stack(out, axis=1)


@pytest.mark.parametrize("case", ["two_images", "padded_batch"])
def test_greedy_generation_matches_transformers(case, vl_dir):
    import torch
    path, ref = vl_dir
    steps = 6
    args = batch(CASES[case], seed=7)
    with torch.no_grad():
        want = ref.generate(**hf_inputs(*args), max_new_tokens=steps, do_sample=False,
                            pad_token_id=0)[:, args[0].shape[1]:].numpy()
    _, model = models.load(path)
    got = greedy(model, *args, steps)
    print(f"{case}: greedy tokens {got.tolist()}")
    np.testing.assert_array_equal(got, want)
    assert len(set(got.ravel().tolist())) > 1  # not one token repeated


def test_one_compile_for_images_of_equal_patch_count(vl_dir):
    """Window order, positions and segments are inputs, not constants: 4 x 12, 12 x 4 and 8 x 6
    patch grids (different windows and M-RoPE positions) share one compiled forward."""
    import chex
    _, model = models.load(vl_dir[0])
    chex.clear_trace_counter()
    counted = nnx.jit(chex.assert_max_traces(qwen_vl.sequence_logits, n=1))
    outs = []
    for height, width in ((56, 168), (168, 56), (112, 84)):
        ids, mask, pixels, grid = batch([[noise_image(height, width, 4)]])
        assert grid.tolist() == [[1, height // 14, width // 14]]
        positions, _, vision = qwen_vl.prepare(model.cfg, ids, mask, pixels, grid)
        tokens, mask = jnp.asarray(ids), jnp.asarray(mask)
        outs.append(np.asarray(counted(model, tokens, mask, positions, vision)))
        np.testing.assert_allclose(outs[-1], our_logits(model, ids, np.asarray(mask), pixels, grid),
                                   rtol=1e-6, atol=1e-6)
    assert rel_err(outs[0], outs[1]) > 1e-3


def test_export_round_trip(tmp_path, vl_dir):
    import transformers
    path, ref = vl_dir
    cfg, model = models.load(path)
    out_dir = hf_io.export(model, tmp_path / "export")
    assert hf_io.read_config(out_dir) == cfg
    a, b = hf_io.checkpoint_tensors(path), hf_io.checkpoint_tensors(out_dir)
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
    reloaded = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        out_dir, attn_implementation="eager").eval()
    args = batch(CASES["one_image"])
    np.testing.assert_array_equal(hf_logits(reloaded, *args), hf_logits(ref, *args))


def test_in_memory_names_load(tmp_path, vl_dir):
    """transformers 5's in-memory names (model.language_model.*, model.visual.*) load the same."""
    path, _ = vl_dir
    tensors = hf_io.checkpoint_tensors(path)
    renamed = {("model.language_model." + k[len("model."):] if k.startswith("model.") else
                "model." + k if k.startswith("visual.") else k): np.asarray(v)
               for k, v in tensors.items()}
    assert any(k.startswith("model.visual.") for k in renamed)
    (tmp_path / "config.json").write_bytes((path / "config.json").read_bytes())
    hf_io.write_safetensors(tmp_path / "model.safetensors", renamed)
    _, a = models.load(path)
    _, b = models.load(tmp_path)
    for (ka, va), (kb, vb) in zip(hf_io._flat(nnx.state(a)), hf_io._flat(nnx.state(b))):
        assert ka == kb
        np.testing.assert_array_equal(np.asarray(va.get_value()), np.asarray(vb.get_value()))


def test_config_round_trip_and_param_count(vl_dir):
    path, ref = vl_dir
    cfg = hf_io.read_config(path)
    assert qwen_vl.from_hf_config(qwen_vl.to_hf_config(cfg)) == cfg
    assert cfg.num_params() == sum(p.numel() for p in ref.parameters())
    # transformers 4.x layout: the decoder at the top level, rope_scaling of type "mrope"
    flat = {**qwen_vl.to_hf_config(cfg)["text_config"], "model_type": "qwen2_5_vl",
            "vision_config": qwen_vl.to_hf_config(cfg)["vision_config"],
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}, "rope_theta": 1e4,
            "image_token_id": IMAGE, "video_token_id": VIDEO, "vision_start_token_id": START,
            "vision_end_token_id": END, "tie_word_embeddings": False}
    del flat["rope_parameters"]
    assert qwen_vl.from_hf_config(flat) == cfg


def test_table_round_trips_every_vision_parameter():
    cfg = qwen_vl.QwenVLConfig(
        vocab_size=64, embed_dim=32, mlp_dim=48, num_layers=1, num_heads=2, num_kv_heads=1,
        head_dim=16, model_type="qwen2", qkv_bias=True, qk_norm=False, tie_embeddings=False,
        mrope_section=(2, 3, 3), vision=qwen_vl.VisionConfig(
            depth=2, embed_dim=16, mlp_dim=24, num_heads=2, out_dim=32, window_size=28,
            fullatt_block_indexes=(1,)))
    _, state = nnx.split(qwen_vl.abstract_model(cfg))
    seen = 0
    for stacked, var in hf_io._flat(state):
        for path, shape, _ in hf_io._per_layer(stacked, tuple(var.shape)):
            rule, name = hf_io.ours_to_hf(path)
            assert hf_io.hf_to_ours(name)[1] == path
            a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
            np.testing.assert_array_equal(rule.to_ours(rule.to_hf(a), shape), a)
            seen += path.startswith("visual.")
    assert seen == 1 + 2 * 12 + 5  # patch embedding, 12 per block, 5 in the merger
