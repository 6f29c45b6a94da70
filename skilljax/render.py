"""SKILL0's visual context: the interaction history rendered as an image, compressed by the agent.

    image = compress(render_text(history, width=392, font_size=10, highlights=ALFWORLD_HIGHLIGHTS), cf)

follows the released renderer (AgentOCR, "fast mode"):
- the history is split into segments, one per line of text (one per past step), each stripped,
  empty ones dropped, `\\"` read as `"`;
- each segment is drawn on its own white strip of the full width in DejaVu Sans Mono, wrapped by
  character count: `int(width / average character width)` characters a line, the average measured
  on a fixed ASCII sample (65 characters at 392 px / size 10, 77 at 560 px / size 12), words packed
  greedily and a word longer than a line split; line height `int(1.2 × the sample's height)`;
  a segment is cut at `max_height` pixels;
- marker strings (`highlights`) are drawn in their colour wherever they occur whole in a wrapped line
  (ALFWorld: `[Observation]` blue, `[Action]` red; Search: the `<search>` / `<information>` tags);
- the strips are stacked; `compress(image, cf)` shrinks the area by the factor cf (each side by
  1/√cf, LANCZOS, at least 28 px) and then adds the 5 px white border; an empty history is a
  28 × 28 blank, so the first step's image is 38 × 38.

`HistoryRenderer` does this for one environment's episode, with its segments cached by text hash
(a step adds one segment; the earlier ones are not drawn again).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import string
from collections.abc import Mapping

from PIL import Image, ImageDraw, ImageFont

WHITE, BLACK = (255, 255, 255), (0, 0, 0)
MIN_SIDE = 28       # the smallest side of an image (Qwen2.5-VL's 28-px merge unit)
PADDING = 5         # white border added after compression
MAX_SEGMENT_HEIGHT = 4096
# The ASCII sample whose bounding box sets the average character width and the line height.
_SAMPLE = string.ascii_uppercase + string.ascii_lowercase + string.digits + " " + string.punctuation

ALFWORLD_HIGHLIGHTS = {"[Observation]": (0, 0, 255), "[Action]": (255, 0, 0)}
SEARCH_HIGHLIGHTS = {"<search>": (0, 0, 255), "</search>": (0, 0, 255),
                     "<information>": (255, 0, 0), "</information>": (255, 0, 0)}
# The released settings per environment: (width px, font size, highlights).
SETTINGS = {"alfworld": (392, 10, ALFWORLD_HIGHLIGHTS), "search_qa": (560, 12, SEARCH_HIGHLIGHTS)}

_FONT_PATHS = ("/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf",)


def font_path() -> str:
    """DejaVu Sans Mono: the system's copy, else the one matplotlib ships (a dependency)."""
    for path in _FONT_PATHS:
        if os.path.exists(path):
            return path
    import matplotlib
    path = os.path.join(matplotlib.get_data_path(), "fonts", "ttf", "DejaVuSansMono.ttf")
    if not os.path.exists(path):
        raise FileNotFoundError("DejaVu Sans Mono not found (neither the system's nor "
                                f"matplotlib's {path}); install fonts-dejavu-core or matplotlib.")
    return path


@functools.lru_cache(maxsize=16)
def _font(size: int, path: str | None = None) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path or font_path(), size)


@functools.lru_cache(maxsize=16)
def metrics(font_size: int, path: str | None = None) -> tuple[float, int]:
    """(average character width in px, line height in px) of the font at this size."""
    left, top, right, bottom = _font(font_size, path).getbbox(_SAMPLE)
    return (right - left) / len(_SAMPLE), int(1.2 * (bottom - top))


def chars_per_line(width: int, font_size: int, path: str | None = None) -> int:
    return int(width / metrics(font_size, path)[0])


def wrap(text: str, max_chars: int) -> list[str]:
    """Greedy word packing into lines of at most `max_chars` characters; longer words split."""
    lines, line = [], ""
    for word in text.split():
        while len(word) > max_chars:
            if line:
                lines.append(line)
                line = ""
            lines.append(word[:max_chars])
            word = word[max_chars:]
        if not word:
            continue
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= max_chars:
            line += " " + word
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines


def _runs(line: str, highlights: Mapping[str, tuple]) -> list[tuple[int, int, tuple]]:
    """(start, end, colour) of every whole marker occurrence in the line; overlaps keep the first."""
    found = sorted((i, i + len(m), colour) for m, colour in highlights.items() if m
                   for i in _find_all(line, m))
    out, end = [], 0
    for start, stop, colour in found:
        if start >= end:
            out.append((start, stop, colour))
            end = stop
    return out


def _find_all(line: str, marker: str):
    i = line.find(marker)
    while i >= 0:
        yield i
        i = line.find(marker, i + 1)


def render_segment(text: str, width: int = 392, font_size: int = 10,
                   highlights: Mapping[str, tuple] | None = None,
                   max_height: int = MAX_SEGMENT_HEIGHT, path: str | None = None) -> Image.Image:
    """One segment (one history line) as a white strip `width` px wide, wrapped and highlighted."""
    font = _font(font_size, path)
    _, line_h = metrics(font_size, path)
    lines = wrap(text, chars_per_line(width, font_size, path))[:max(1, max_height // line_h)]
    image = Image.new("RGB", (width, max(1, len(lines)) * line_h), WHITE)
    draw = ImageDraw.Draw(image)
    for row, line in enumerate(lines):
        y, at = row * line_h, 0
        # Plain text and markers as runs, each at the rendered width of the line before it.
        for start, stop, colour in _runs(line, highlights or {}) + [(len(line), len(line), None)]:
            for a, b, fill in ((at, start, BLACK), (start, stop, colour)):
                if b > a:
                    draw.text((font.getlength(line[:a]), y), line[a:b], font=font, fill=fill)
            at = stop
    return image


def segments(text: str) -> list[str]:
    """The history's segments: its lines, `\\"` read as `"`, stripped, empty ones dropped."""
    return [s.strip() for s in text.replace('\\"', '"').split("\n") if s.strip()]


def stack(images: list[Image.Image], width: int) -> Image.Image:
    """Images stacked top to bottom; none → the 28 × 28 blank."""
    if not images:
        return Image.new("RGB", (MIN_SIDE, MIN_SIDE), WHITE)
    out = Image.new("RGB", (width, sum(im.height for im in images)), WHITE)
    y = 0
    for im in images:
        out.paste(im, (0, y))
        y += im.height
    return out


def render_text(text: str, width: int = 392, font_size: int = 10,
                highlights: Mapping[str, tuple] | None = None,
                max_height: int = MAX_SEGMENT_HEIGHT) -> Image.Image:
    """The whole history as one image (no border: `compress` adds it)."""
    return stack([render_segment(s, width, font_size, highlights, max_height)
                  for s in segments(text)], width)


def compress(image: Image.Image, cf: float, padding: int = PADDING) -> Image.Image:
    """The image with its area shrunk by the factor `cf` ≥ 1 (each side by 1/√cf, LANCZOS, at
    least 28 px; cf = 1 leaves it as it is), then a white border of `padding` px."""
    w, h = _shrunk(image.width, image.height, cf)
    if (w, h) != image.size:
        image = image.resize((w, h), Image.Resampling.LANCZOS)
    if padding:
        out = Image.new("RGB", (image.width + 2 * padding, image.height + 2 * padding), WHITE)
        out.paste(image, (padding, padding))
        image = out
    return image


def _shrunk(width: int, height: int, cf: float) -> tuple[int, int]:
    """The size `compress` resizes to (before the border)."""
    if not cf >= 1.0 or math.isinf(cf):
        raise ValueError(f"compression factor {cf!r}: must be a finite number >= 1 (the parser "
                         "clamps the agent's <compression> to [1, 5]).")
    if cf == 1.0:
        return width, height
    return (max(MIN_SIDE, int(width / math.sqrt(cf))), max(MIN_SIDE, int(height / math.sqrt(cf))))


class HistoryRenderer:
    """One environment's history images over an episode: `image(history, cf)`; segments are cached
    by the hash of their text until `reset()` (each episode), so a step draws only what is new."""

    def __init__(self, width: int = 392, font_size: int = 10,
                 highlights: Mapping[str, tuple] | None = None, padding: int = PADDING,
                 max_height: int = MAX_SEGMENT_HEIGHT):
        self.width, self.font_size, self.padding = width, font_size, padding
        self.highlights, self.max_height = dict(highlights or {}), max_height
        self._cache: dict[str, Image.Image] = {}
        self.hits = self.misses = 0

    @classmethod
    def for_env(cls, env_name: str, **kwargs) -> "HistoryRenderer":
        """The released setting of `alfworld` or `search_qa` (other envs: ALFWorld's)."""
        width, size, highlights = SETTINGS.get(env_name, SETTINGS["alfworld"])
        return cls(width, size, highlights, **kwargs)

    def reset(self) -> None:
        self._cache.clear()

    def _strips(self, history: str) -> list[Image.Image]:
        strips = []
        for seg in segments(history):
            key = hashlib.sha1(seg.encode()).hexdigest()
            if key in self._cache:
                self.hits += 1
            else:
                self.misses += 1
                self._cache[key] = render_segment(seg, self.width, self.font_size,
                                                  self.highlights, self.max_height)
            strips.append(self._cache[key])
        return strips

    def image(self, history: str, cf: float = 1.0) -> Image.Image:
        return compress(stack(self._strips(history), self.width), cf, self.padding)

    def size(self, history: str, cf: float = 1.0) -> tuple[int, int]:
        """(width, height) of `image(history, cf)`, without stacking or resizing."""
        strips = self._strips(history)
        w, h = ((self.width, sum(s.height for s in strips)) if strips
                else (MIN_SIDE, MIN_SIDE))
        w, h = _shrunk(w, h, cf)
        return w + 2 * self.padding, h + 2 * self.padding
