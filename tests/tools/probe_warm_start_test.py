"""The warm-start probe on the default config's runlocal variant (seconds)."""

import json

import pytest

from skilljax.tools import probe_warm_start


@pytest.mark.slow  # in `bash run.sh test-slow`: a warm start
def test_probe_splits_heldout_nll_by_action_kind(tmp_path, capsys):
    probe_warm_start.main(["--config", "configs/default.py:runlocal", "--workdir",
                           str(tmp_path), "--config.sft.steps=6", "--config.sft.check_every=3"])
    curve = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["curve"]
    assert [r["step"] for r in curve] == [3, 6]
    for row in curve:
        # chores episodes start by taking the object; the shares add up to the total.
        assert "take@0" in row["share"] and any(k.startswith("use@") for k in row["share"])
        assert abs(sum(row["share"].values()) - row["heldout_nll"]) < 1e-3
        assert row["heldout_nll"] > 0
    assert (tmp_path / "tokenizer" / "tokenizer.json").exists()
