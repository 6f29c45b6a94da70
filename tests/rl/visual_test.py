"""SKILL0's visual context through the rollout, the batch and the learner (a tiny random
Qwen2.5-VL policy on the chores env)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from skilljax import render
from skilljax.envs.chores import Chores
from skilljax.envs.pool import EnvPool
from skilljax.models import qwen_vl, vl_image
from skilljax.rl import batch as batch_lib
from skilljax.rl import learner as learner_lib
from skilljax.rl.rollout import PromptConfig, RolloutConfig, ThinkAction, rollout
from skilljax.rl.visual import (VISION_SPECIALS, VisualConfig, collate_kw,
                                parse_highlights, vision_ids)
from skilljax.sampling import Sampler, SamplingParams
from skilljax.tokenizer import Tokenizer
from skilljax.tools.bench_rollout import env_texts

SMALL = VisualConfig(max_pixels=28 * 28 * 48)  # small images: at most 48 image-pad tokens


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(env_texts("chores", 40), vocab_size=400, specials=VISION_SPECIALS)


@pytest.fixture(scope="module")
def model(tok):
    return qwen_vl.create(_vl_cfg(tok), None, seed=0)


@pytest.fixture(scope="module")
def pool():
    with EnvPool("chores", num_workers=2) as p:
        yield p


def test_parse_highlights():
    assert parse_highlights("[Observation]:0,0,255;[Action]:255,0,0") == (
        ("[Observation]", (0, 0, 255)), ("[Action]", (255, 0, 0)))
    assert parse_highlights("<search>:0,0,255;") == (("<search>", (0, 0, 255)),)
    for bad in ("[Action]", "[Action]:1,2", "[Action]:0,0,300", ":1,2,3"):
        with pytest.raises(ValueError, match="marker:r,g,b"):
            parse_highlights(bad)


def _visual_rollout(tok, model, pool, *, expert=False, temperature=1.0, n=2):
    cfg = RolloutConfig(group_size=2, max_turns=3, visual=SMALL,
                        sampling=SamplingParams(max_new_tokens=12, temperature=temperature),
                        prompt=PromptConfig(history_length=2))
    sampler = None if expert else Sampler(model, pad_id=tok.pad_id)
    tasks = Chores.make_tasks("train", n, 0, "random")
    return rollout(sampler, tok, pool, tasks, cfg, jax.random.key(0), fmt=ThinkAction(),
                   expert=expert)


def test_visual_rollout_shows_the_history_as_an_image(tok, model, pool):
    res = _visual_rollout(tok, model, pool, expert=True)
    start, pad, end = vision_ids(tok)
    by_episode = {}
    for s in res.samples:
        by_episode.setdefault(s.episode, []).append(s)
    for e, steps in by_episode.items():
        t = res.trajectories[e]
        for k, s in enumerate(steps):
            text, cf = s.image
            assert cf == 1.0  # the expert writes <compression>1.0</compression>
            lines = text.split("\n") if text else []
            assert len(lines) == min(k, 2)  # history_length 2
            if k:
                assert lines[-1].endswith(f"[Action]: {t.actions[k - 1]}")
            # The prompt holds one image: start, its pads, end; no history text.
            ids = s.prompt_ids
            assert ids.count(start) == 1 and ids.count(end) == 1
            pads = ids.count(pad)
            assert pads == s.counts["image"] - 2 and s.counts["history"] == 0
            _, grid, n = SMALL.inputs(SMALL.renderer().image(text, cf))
            assert n == pads
            assert tok.decode(s.response_ids).endswith("<compression>1.0</compression><|im_end|>")
    # The first step's image is the 38 x 38 blank, which the processor resizes to 84 x 84 (9 pads).
    first = [s for s in res.samples if s.step == 0]
    assert all(s.image == ("", 1.0) and s.counts["image"] == 9 + 2 for s in first)
    assert res.stats["tokens_image"] > 0


def test_sampled_visual_rollout_and_update(tok, model, pool):
    res = _visual_rollout(tok, model, pool, n=1)
    _, pad, _ = vision_ids(tok)
    for s in res.samples:
        assert pad not in s.response_ids  # vision ids are never sampled
        assert 1.0 <= s.compression <= 5.0
    # The batch's image sizes (taken without drawing) are those of the images as drawn, and
    # match the image-pad runs the sampler was given.
    kw = collate_kw(res.samples, SMALL, model.cfg)
    renderer = SMALL.renderer()
    images = [SMALL.inputs(renderer.image(*s.image))[:2] for s in res.samples]
    for s, size, (_, grid) in zip(res.samples, kw["grids"], images):
        np.testing.assert_array_equal(size, grid)
        assert s.prompt_ids.count(pad) == sum(vl_image.num_image_tokens(grid))
    adv = np.linspace(-1, 1, len(res.samples))
    batch = batch_lib.collate(res.samples, adv, tok.pad_id, **kw)
    # The batch holds only what the images are drawn from; a mini-batch draws them when placed.
    assert isinstance(batch.vision, batch_lib.RowImages)
    assert batch.vision.sources == [s.image for s in res.samples]
    drawn = batch.vision[np.arange(len(res.samples))].inputs()
    want = qwen_vl.row_vision_inputs(images, model.cfg.vision, batch.vision.units)
    for a, b in zip(drawn, want):
        np.testing.assert_array_equal(a, b)
    learner = learner_lib.Learner(model, learner_lib.LearnerConfig(
        learning_rate=1e-3, micro_batch_size=2, mini_batch_size=4, row_multiple=2))
    before = jax.tree.map(jnp.copy, learner.model.visual.patch_embed[...])
    out = learner.update(batch)
    assert out and all(np.isfinite(m["loss"]) for m in out)
    # The first mini-batch starts on-policy: its old logprobs are the learner's own.
    assert abs(out[0]["approx_kl"]) < 1e-6
    assert not np.allclose(before, learner.model.visual.patch_embed[...])  # the tower trains


@dataclasses.dataclass
class Row:
    prompt_ids: list
    response_ids: list
    logprobs: np.ndarray


def _image_rows(tok, counts, seed):
    """Step-sample-like rows whose prompts open with an image of k history lines (none for 0),
    and each row's (pixel_values, grid_thw)."""
    rng = np.random.default_rng(seed)
    start, pad, end = vision_ids(tok)
    rows, images = [], []
    for k in counts:
        x, head = None, []
        if k:
            im = render.render_text("[Observation]: a desk [Action]: look\n" * k)
            pixels, grid, n = SMALL.inputs(render.compress(im, 1.0 + k / 4))
            x, head = (pixels, grid), [start] + [pad] * n + [end]
        rows.append(Row([tok.im_start_id] + head + list(rng.integers(10, 300, 5)),
                        list(rng.integers(10, 300, 3)), np.zeros(3, np.float32)))
        images.append(x)
    return rows, images


def test_learner_logprobs_match_the_model_per_row(tok, model):
    """Rows of different images (and one without) in one batch: each row's response logprobs
    are those of the model on that row alone."""
    rows, images = _image_rows(tok, (1, 4, 0), seed=0)
    b = batch_lib.collate(rows, np.ones(3), tok.pad_id, images=images, vl_cfg=model.cfg)
    window = batch_lib.response_window(b.loss_mask_BT)
    logp, _ = learner_lib.token_logprobs(
        model, jnp.asarray(b.tokens_BT), jnp.asarray(b.attn_mask_BT), 1.0,
        jnp.asarray(b.loss_mask_BT), window, jnp.asarray(b.positions_B3T),
        jax.tree.map(jnp.asarray, b.vision.inputs()))
    for r, (row, x) in enumerate(zip(rows, images)):
        ids = np.asarray([row.prompt_ids + row.response_ids])
        pos, _, vis = qwen_vl.prepare(model.cfg, ids, None, *(x or (None, None)))
        logits = qwen_vl.forward(model, jnp.asarray(ids), jnp.ones(ids.shape, jnp.int32),
                                 jnp.asarray(pos), vis)
        full = np.asarray(jax.nn.log_softmax(logits[0], axis=-1))
        p = len(row.prompt_ids)
        want = [full[t - 1, ids[0, t]] for t in range(p, p + 3)]
        np.testing.assert_allclose(np.asarray(logp)[r, p:p + 3], want, atol=2e-5)


def test_skills_in_image(tok, model, pool):
    """`skills_in_image`: the skill text is drawn above the history, not given as text."""
    tasks = Chores.make_tasks("train", 1, 0, "random")
    cfg = RolloutConfig(group_size=1, max_turns=2, prompt=PromptConfig(history_length=2),
                        visual=dataclasses.replace(SMALL, skills_in_image=True))
    context = "## Procedure\nuse the heater, then the basin"
    res = rollout(None, tok, pool, tasks, cfg, jax.random.key(0), fmt=ThinkAction(),
                  expert=True, skill_context=lambda t: context)
    for s in res.samples:
        assert s.counts["skill"] == 0 and s.image[0].startswith(context)
    assert "[Action]" in res.samples[1].image[0]
    plain = rollout(None, tok, pool, tasks, dataclasses.replace(cfg, visual=SMALL),
                    jax.random.key(0), fmt=ThinkAction(), expert=True,
                    skill_context=lambda t: context)
    assert all(s.counts["skill"] > 0 and context not in s.image[0] for s in plain.samples)


def test_visual_update_on_a_mesh_matches_one_device(tok):
    """A VL learner step with rows of different images (and one without) on a data x fsdp x
    tensor mesh of 8 fake devices: the same loss and gradients as on one device."""
    from flax import nnx

    from skilljax import sharding

    rows, images = _image_rows(tok, (1, 3, 0, 2, 1, 4, 2, 0), seed=1)
    advantages = np.random.default_rng(1).normal(size=8)
    host = batch_lib.collate(rows, advantages, tok.pad_id, images=images, vl_cfg=_vl_cfg(tok))
    window = batch_lib.response_window(host.loss_mask_BT)
    cfg = learner_lib.LearnerConfig(learning_rate=1e-3, micro_batch_size=4)
    results = []
    for mesh in (None, sharding.make_mesh("data=2,fsdp=2,tensor=2")):
        layout = None if mesh is None else sharding.Layout(mesh, "fsdp_tp")
        model = qwen_vl.create(_vl_cfg(tok), layout, seed=0)
        b = batch_lib.place_batch(batch_lib.to_host(host), layout)
        metrics, grads = nnx.jit(learner_lib.accumulate_grads, static_argnums=(2, 3))(
            model, b, cfg, window)
        results.append((float(metrics["loss"]), jax.tree.leaves(grads)))
    (l1, g1), (l8, g8) = results
    assert l8 == pytest.approx(l1, rel=1e-5)
    scale = max(float(jnp.abs(g).max()) for g in g1)
    for a, b in zip(g8, g1):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5 * scale)


def _vl_cfg(tok):
    start, pad, end = vision_ids(tok)
    return qwen_vl.PRESETS["tiny_vl"].replace(
        vocab_size=tok.vocab_size, dtype="float32", image_token_id=pad, video_token_id=pad,
        vision_start_token_id=start, vision_end_token_id=end)


def test_visual_needs_a_vl_policy_and_its_tokenizer(tok):
    from skilljax import config as config_lib
    from skilljax import experiment
    from tests.conftest import ROOT
    c = config_lib.load_config(str(ROOT / "configs" / "default.py") + ":runlocal",
                               ["--config.visual.enabled=true"])
    with pytest.raises(ValueError, match="needs a Qwen2.5-VL policy"):
        experiment.build_model(c, tok)
    c.model.checkpoint = "tiny_vl"
    c.model.overrides.update(embed_dim=None, mlp_dim=None, num_heads=None, head_dim=None)
    assert experiment.build_model(c, tok).cfg.image_token_id == vision_ids(tok)[1]
    text_tok = Tokenizer.train(env_texts("chores", 5), vocab_size=300)
    with pytest.raises(ValueError, match=re.escape("no <|vision_start|>")):
        experiment.build_model(c, text_tok)
    with pytest.raises(ValueError, match="visual.highlights"):
        experiment.visual_config(config_lib.load_config(
            str(ROOT / "configs" / "default.py"),
            ["--config.visual.enabled=true", "--config.visual.highlights=[Action]"]))


def test_swapped_images_keep_prompts_consistent(tok, pool):
    """`tools.visual_reading.swap_images`: each sample gets another episode's image of the same
    step, its image-pad run resized to match, the rest of the prompt unchanged."""
    from skilljax.tools.visual_reading import swap_images
    res = _visual_rollout(tok, None, pool, expert=True, n=3)
    swapped = swap_images(res.samples, tok, SMALL)
    start, pad, end = vision_ids(tok)
    moved = 0
    for s, t in zip(res.samples, swapped):
        assert t.step == s.step and t.response_ids == s.response_ids
        assert t.prompt_ids.count(pad) == SMALL.inputs(SMALL.renderer().image(*t.image))[2]
        cut = lambda ids: (ids[:ids.index(start)], ids[ids.index(end):])
        assert cut(t.prompt_ids) == cut(s.prompt_ids)
        moved += t.image != s.image
    assert moved > 0
