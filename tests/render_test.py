"""The visual history renderer against the released settings' measured numbers."""

import numpy as np
import pytest
from PIL import Image

from skilljax import render


def test_font_metrics_and_line_width_at_both_settings():
    # DejaVu Sans Mono: 6.01 px a character and 12 px lines at size 10, 7.22 px / 15 px at 12.
    assert render.metrics(10)[0] == pytest.approx(6.01, abs=0.005) and render.metrics(10)[1] == 12
    assert render.metrics(12)[0] == pytest.approx(7.22, abs=0.005) and render.metrics(12)[1] == 15
    assert render.chars_per_line(392, 10) == 65  # ALFWorld
    assert render.chars_per_line(560, 12) == 77  # Search
    for width, size, n in ((392, 10, 65), (560, 12, 77)):
        line_h = render.metrics(size)[1]
        fits = render.render_segment("x" * (n - 6) + " abcde", width, size)
        assert fits.size == (width, line_h)
        assert render.render_segment("x" * (n - 5) + " abcde", width, size).size == (width, 2 * line_h)


def test_wrap_packs_words_and_splits_long_ones():
    assert render.wrap("aa bb cc dd", 5) == ["aa bb", "cc dd"]
    assert render.wrap("a  bcdefghijk l", 4) == ["a", "bcde", "fghi", "jk l"]
    assert render.wrap("   ", 4) == []


def test_segments_stack_and_the_blank_first_image():
    assert render.segments('  one \\"two\\"\n\n three ') == ['one "two"', "three"]
    first = render.compress(render.render_text(""), 1.0)
    assert first.size == (38, 38) and np.asarray(first).min() == 255  # 28 x 28 white + 5 px border
    two = render.render_text("[Observation]: a [Action]: b\n[Observation]: c [Action]: d")
    assert two.size == (392, 24)  # one 12-px line per step, full width


def test_compression_shrinks_the_area_by_cf_and_pads_after():
    image = render.render_text("\n".join(f"[Observation]: step {i} " + "word " * 40
                                         for i in range(30)))
    w, h = image.size
    assert render.compress(image, 1.0, padding=0).size == (w, h)
    for cf in (2.0, 4.0):
        small = render.compress(image, cf, padding=0)
        assert small.size == (int(w / cf ** 0.5), int(h / cf ** 0.5))
        assert w * h / (small.width * small.height) == pytest.approx(cf, rel=0.01)
        padded = render.compress(image, cf)
        assert padded.size == (small.width + 10, small.height + 10)
        assert np.asarray(padded)[:5].min() == 255 and np.asarray(padded)[:, -5:].min() == 255
    tiny = render.compress(Image.new("RGB", (40, 30), render.WHITE), 5.0, padding=0)
    assert tiny.size == (28, 28)  # never below the 28-px unit
    for bad in (0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="compression factor"):
            render.compress(image, bad)


def test_markers_are_drawn_in_their_colours():
    line = "[Observation]: the drawer is open. [Action]: take key"
    pixels = np.asarray(render.render_segment(line, highlights=render.ALFWORLD_HIGHLIGHTS))
    font_w = render.metrics(10)[0]

    def colours(start, stop):  # the distinct non-grey colours drawn over those characters
        block = pixels[:, int(start * font_w):int(stop * font_w)].reshape(-1, 3).astype(int)
        inked = block[block.min(1) < 200]
        return inked.argmax(1)[inked.max(1) - inked.min(1) > 60], inked

    blue, _ = colours(0, 13)
    red, _ = colours(line.index("[Action]"), line.index("[Action]") + 8)
    assert len(blue) and (blue == 2).all() and len(red) and (red == 0).all()
    _, plain = colours(16, 30)  # "the drawer is" stays black
    assert (plain.max(1) - plain.min(1) < 30).all()
    # A marker split by the line wrap (a word longer than the line, cut at 65) is not highlighted.
    cut = "x" * 60 + "[Observation]:"
    assert render.wrap(cut, 65) == ["x" * 60 + "[Obse", "rvation]:"]
    px = np.asarray(render.render_segment(cut, highlights=render.ALFWORLD_HIGHLIGHTS)).astype(int)
    assert px.shape[0] == 24 and (px.max(2) - px.min(2) < 30).all()


def test_history_renderer_caches_segments_per_episode():
    r = render.HistoryRenderer.for_env("search_qa")
    assert (r.width, r.font_size) == (560, 12) and "<information>" in r.highlights
    steps = [f"<search> query {i} </search> <information> result {i} </information>"
             for i in range(3)]
    first = r.image("", 1.0)
    assert first.size == (38, 38) and (r.hits, r.misses) == (0, 0)
    r.image(steps[0], 1.0)
    r.image("\n".join(steps[:2]), 1.0)
    img = r.image("\n".join(steps), 2.0)
    assert (r.hits, r.misses) == (3, 3)  # each step's segment drawn once
    fresh = render.compress(render.render_text("\n".join(steps), 560, 12,
                                               render.SEARCH_HIGHLIGHTS), 2.0)
    assert np.array_equal(np.asarray(img), np.asarray(fresh))
    r.reset()
    r.image(steps[0])
    assert r.misses == 4


def test_size_without_drawing():
    """`HistoryRenderer.size` gives the size `image` draws (the learner's M-RoPE positions need
    only the size), for the blank, one and many lines, and factors that shrink or hit the floor."""
    r = render.HistoryRenderer()
    lines = "\n".join(f"[Observation]: step {i} of a long history [Action]: go to desk {i}"
                      for i in range(12))
    for history in ("", "[Observation]: hi [Action]: look", lines):
        for cf in (1.0, 1.3, 2.0, 4.0, 5.0):
            assert r.size(history, cf) == r.image(history, cf).size
