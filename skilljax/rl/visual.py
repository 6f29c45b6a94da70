"""SKILL0's visual context in the rollout and the learner (the released OCR path,
`shared/reference/skill0_released_code.md` §4.2 and §5).

With `visual` on, a step's prompt shows the interaction history as one image instead of text: the
same `[Observation]: ... [Action]: ...` lines the text prompt would hold, rendered by
`skilljax.render` at the env's setting and placed at the start of the user turn as Qwen2.5-VL's
`<|vision_start|>` + one `<|image_pad|>` per merge unit + `<|vision_end|>`. Skills, the task, the
current observation and the admissible actions stay text, as in the released code; with
`skills_in_image` the skill text is drawn too, above the history, as the paper describes it. With `agent_compression`, the prompt
asks for `<compression>x</compression>` after the action; the factor the agent writes at step t
shrinks the area of the image it is shown at step t + 1 (`rollout.parse_compression`: clamped to
[1, 5], missing → 1, repeated → invalid), and `rewards.compression_bonus` pays coef · ln(cf) on
successful trajectories.

A step sample keeps the history text and factor of its image (`StepSample.image`), not pixels: the
learner's batch carries only those (`collate_kw`: the sizes for the M-RoPE positions, the images
as a `batch.RowImages`), and each mini-batch draws its rows' images again, identically, when it is
placed, so thousands of step samples cost a few kilobytes each on the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from skilljax import render
from skilljax.models import vl_image

VISION_START, VISION_END, IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"
VISION_SPECIALS = (VISION_START, VISION_END, IMAGE_PAD)
MAX_PIXELS = 2048 * 2048  # the released `process_image` caps the area here (below the processor's)


def parse_highlights(spec: str) -> tuple[tuple[str, tuple[int, int, int]], ...]:
    """Marker colours in the released `HIGHLIGHT_CONFIGS` form, `marker:r,g,b;marker:r,g,b`."""
    out = []
    for item in filter(None, (x.strip() for x in spec.split(";"))):
        marker, sep, rgb = item.rpartition(":")
        try:
            colour = tuple(int(v) for v in rgb.split(","))
        except ValueError:
            colour = ()
        if not sep or not marker or len(colour) != 3 or not all(0 <= v <= 255 for v in colour):
            raise ValueError(f"visual.highlights item {item!r}: write marker:r,g,b (0-255 each), "
                             "items separated by ';', e.g. '[Observation]:0,0,255;[Action]:255,0,0'.")
        out.append((marker, colour))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class VisualConfig:
    """How history images are drawn, sized for the model and chosen by the agent."""
    width: int = 392
    font_size: int = 10
    highlights: tuple[tuple[str, tuple[int, int, int]], ...] = tuple(
        render.ALFWORLD_HIGHLIGHTS.items())
    padding: int = render.PADDING
    agent_compression: bool = True
    expert_compression: float = 1.0  # the factor expert (warm-start) responses write
    skills_in_image: bool = False  # the skill text drawn above the history (the paper's
                                   # description) instead of given as text (the released code)
    min_pixels: int = vl_image.MIN_PIXELS
    max_pixels: int = MAX_PIXELS
    patch_size: int = vl_image.PATCH_SIZE
    merge_size: int = vl_image.MERGE_SIZE
    temporal_patch_size: int = vl_image.TEMPORAL_PATCH_SIZE

    def __post_init__(self):
        if self.width < render.MIN_SIDE or self.font_size < 1:
            raise ValueError(f"visual.width={self.width} px (>= {render.MIN_SIDE}) and "
                             f"visual.font_size={self.font_size} (>= 1).")
        if not 1.0 <= self.expert_compression <= 5.0:
            raise ValueError(f"visual.expert_compression={self.expert_compression}: in [1, 5].")

    @classmethod
    def for_env(cls, env_name: str, **kwargs) -> "VisualConfig":
        """The released width, font size and marker colours of `alfworld` or `search_qa`."""
        width, size, highlights = render.SETTINGS.get(env_name, render.SETTINGS["alfworld"])
        return cls(**{"width": width, "font_size": size,
                      "highlights": tuple(highlights.items()), **kwargs})

    def renderer(self) -> render.HistoryRenderer:
        return render.HistoryRenderer(self.width, self.font_size, dict(self.highlights),
                                      self.padding)

    def inputs(self, image) -> tuple[np.ndarray, np.ndarray, int]:
        """(pixel_values, grid_thw, image-pad tokens) of one image, as the HF processor gives."""
        pixels, grid = vl_image.preprocess(
            [image], min_pixels=self.min_pixels, max_pixels=self.max_pixels,
            patch_size=self.patch_size, merge_size=self.merge_size,
            temporal_patch_size=self.temporal_patch_size)
        return pixels, grid, sum(vl_image.num_image_tokens(grid, self.merge_size))

    def grid(self, size: tuple[int, int]) -> np.ndarray:
        """grid_thw of an image of `size` (width, height) after the processor's resize."""
        width, height = size
        h, w = vl_image.smart_resize(height, width, self.patch_size * self.merge_size,
                                     self.min_pixels, self.max_pixels)
        return np.asarray([[1, h // self.patch_size, w // self.patch_size]], np.int64)

    def check_model(self, model_cfg) -> None:
        """A clear error when the policy cannot read these images."""
        from skilljax.models import qwen_vl
        if not isinstance(model_cfg, qwen_vl.QwenVLConfig):
            raise ValueError("visual.enabled needs a Qwen2.5-VL policy (model.checkpoint: a "
                             "Qwen2.5-VL directory, or the 'tiny_vl' preset); this one is a text "
                             "model. Turn visual.enabled off for text prompts.")
        v = model_cfg.vision
        mine = (self.patch_size, self.merge_size, self.temporal_patch_size)
        if (v.patch_size, v.spatial_merge_size, v.temporal_patch_size) != mine:
            raise ValueError(f"The model's vision tower takes {v.patch_size} px patches, merge "
                             f"{v.spatial_merge_size}, temporal {v.temporal_patch_size}; the image "
                             f"preprocessing is set for {mine}.")


def vision_ids(tok) -> tuple[int, int, int]:
    """(vision start, image pad, vision end) ids of a tokenizer, or a clear error."""
    ids = tuple(tok.tok.token_to_id(t) for t in (VISION_START, IMAGE_PAD, VISION_END))
    if None in ids:
        raise ValueError(f"The tokenizer has no {', '.join(VISION_SPECIALS)} tokens: visual "
                         "prompts need a Qwen2.5-VL tokenizer (or a trained one with "
                         "visual.enabled, which adds them).")
    return ids


def image_prompt_ids(tok, pads: int) -> list[int]:
    """The ids of one image in a prompt: start, `pads` image pads, end."""
    start, pad, end = vision_ids(tok)
    return [start] + [pad] * pads + [end]


def compression_suffix(instruction: str) -> str:
    """The response-format instruction with SKILL0's compression request after it."""
    return (f"{instruction} After it, choose a compression factor of 1.0 or more for your next "
            "history image inside <compression> </compression>: a higher factor costs fewer "
            "tokens but makes the image harder to read (e.g. <compression>1.1</compression>).")


class _Drawer:
    """(history text, cf) → (pixel_values, grid_thw), one renderer (and its line cache) for the
    rows of a batch: lines an episode's samples share are drawn once."""

    def __init__(self, cfg: VisualConfig):
        self.cfg, self.renderer = cfg, cfg.renderer()

    def __call__(self, source):
        return self.cfg.inputs(self.renderer.image(*source))[:2]

    def grid(self, source) -> np.ndarray:
        """grid_thw of the image, from its size alone (no stacking, resizing or pixel values)."""
        return self.cfg.grid(self.renderer.size(*source))


def collate_kw(samples: Sequence, cfg: VisualConfig | None, model_cfg) -> dict:
    """`batch.collate`'s image arguments for these step samples ({} without `visual`)."""
    if cfg is None:
        return {}
    from skilljax.rl.batch import RowImages
    draw = _Drawer(cfg)
    sources = [s.image for s in samples]
    grids = [None if x is None else draw.grid(x) for x in sources]
    return {"images": RowImages(sources, draw, model_cfg.vision, 0), "grids": grids,
            "vl_cfg": model_cfg}
