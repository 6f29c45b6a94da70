"""Qwen2-VL / Qwen2.5-VL image preprocessing with Pillow and NumPy.

    pixel_values, grid_thw = preprocess(images)   # [num_patches, C·T·P·P] float32, [num_images, 3]

does what `transformers`' Qwen2-VL image processor (its PIL backend) does, number for number:
1. RGB (transparency composited onto white);
2. resize (Pillow bicubic) to sides that are multiples of `patch_size · merge_size` (28 px) with an
   area within [min_pixels, max_pixels], keeping the aspect ratio (`smart_resize`);
3. × 1/255 in float64, to float32, then (x − mean) / std with the OpenAI CLIP statistics;
4. cut into P × P patches listed merge block by merge block (the 2 × 2 patches the vision tower's
   merger joins are consecutive), each patch repeated over `temporal_patch_size` frames (a still
   image is a two-frame video to the 3-D patch embedding).

An image becomes t·h·w / merge² image-pad tokens in the prompt (`num_image_tokens`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from PIL import Image

# OpenAI CLIP's per-channel pixel statistics, which Qwen2-VL's vision tower was trained with.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PATCH_SIZE, TEMPORAL_PATCH_SIZE, MERGE_SIZE = 14, 2, 2
# The processor's defaults (its `size` shortest_edge / longest_edge, in pixels of area).
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 1280


def smart_resize(height: int, width: int, factor: int = PATCH_SIZE * MERGE_SIZE,
                 min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor`, rescaled into [min_pixels, max_pixels]."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"Image of {height} x {width} px: the aspect ratio must stay below 200.")
    h, w = round(height / factor) * factor, round(width / factor) * factor  # Python's round: as HF
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def to_rgb(image: Image.Image) -> Image.Image:
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def normalized(image: Image.Image, height: int, width: int) -> np.ndarray:
    """The image resized to height × width, as normalised float32 [C, H, W]."""
    pixels_HWC = np.asarray(to_rgb(image).resize((width, height), Image.Resampling.BICUBIC))
    x_CHW = (pixels_HWC.astype(np.float64) * (1 / 255)).astype(np.float32).transpose(2, 0, 1)
    mean, std = np.asarray(CLIP_MEAN, np.float32), np.asarray(CLIP_STD, np.float32)
    return (x_CHW - mean[:, None, None]) / std[:, None, None]


def patchify(x_CHW: np.ndarray, patch_size: int = PATCH_SIZE, merge_size: int = MERGE_SIZE,
             temporal_patch_size: int = TEMPORAL_PATCH_SIZE) -> np.ndarray:
    """[h·w, C·T·P·P] patches in merge-block order: (block row, block col, row in block, col in
    block), each flattened as (channel, frame, y, x) like the Conv3d weight it meets."""
    c, height, width = x_CHW.shape
    p, m = patch_size, merge_size
    gh, gw = height // p, width // p
    x = x_CHW.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], temporal_patch_size, p, p))
    return x.reshape(gh * gw, c * temporal_patch_size * p * p)


def preprocess(images: Sequence[Image.Image], *, min_pixels: int = MIN_PIXELS,
               max_pixels: int = MAX_PIXELS, patch_size: int = PATCH_SIZE,
               merge_size: int = MERGE_SIZE, temporal_patch_size: int = TEMPORAL_PATCH_SIZE
               ) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values [sum of h·w, C·T·P·P] float32, grid_thw [num_images, 3] int64) of the images,
    concatenated in order, as the HF processor's `pixel_values` and `image_grid_thw`."""
    patches, grids = [], []
    for image in images:
        height, width = smart_resize(image.height, image.width, patch_size * merge_size,
                                     min_pixels, max_pixels)
        patches.append(patchify(normalized(image, height, width), patch_size, merge_size,
                                temporal_patch_size))
        grids.append((1, height // patch_size, width // patch_size))
    return np.concatenate(patches, axis=0), np.asarray(grids, np.int64).reshape(-1, 3)


def num_image_tokens(grid_thw: np.ndarray, merge_size: int = MERGE_SIZE) -> list[int]:
    """Image-pad tokens per image: one per merge block of patches."""
    return [int(t * h * w) // merge_size ** 2 for t, h, w in np.asarray(grid_thw).reshape(-1, 3)]
