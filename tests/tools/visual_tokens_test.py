"""The visual-token count tool: one expert episode, history tokens as text and as images."""

import json

from tests.conftest import ROOT, run_module


def test_visual_tokens_on_a_chores_episode(tmp_path):
    proc = run_module("skilljax.tools.visual_tokens", "--env", "chores", "--cf", "1,4",
                      "--tokenizer", ROOT / ".cache" / "qwen3_tokenizer", "--out", tmp_path)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = json.loads((tmp_path / "visual_tokens.json").read_text())["steps"]
    assert (tmp_path / "visual_tokens.png").exists() and len(rows) == summary["episode_steps"] + 1
    first, last = rows[0], rows[-1]
    assert first["text"] == 0 and first["cf1_px"] == [38, 38]  # no history: the blank image
    assert [r["text"] for r in rows] == sorted(r["text"] for r in rows)  # history only grows
    assert last["cf4"] < last["cf1"] and last["cf1_px"][0] == 402  # 392 px + the border
    w, h = (v - 10 for v in last["cf1_px"])
    w4, h4 = (v - 10 for v in last["cf4_px"])
    assert abs(w * h / (w4 * h4) - 4) < 0.2  # cf is an area factor
