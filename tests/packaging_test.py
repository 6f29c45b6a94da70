"""Installing skilljax as a package: its ranges (requirements.txt) accept other JAX/Flax versions
than the tested pins (constraints.txt), so it installs next to Tunix or MaxText."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_constraints_pin_every_runtime_requirement_within_its_range():
    from packaging.requirements import Requirement
    ranges = {Requirement(l).name.lower(): Requirement(l) for l in
              (ROOT / "requirements.txt").read_text().splitlines()
              if l.strip() and not l.startswith("#")}
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower()] = version
    assert set(ranges) - {"ml-dtypes"} == set(pins)   # ml-dtypes: whatever jax pulls
    for name, version in pins.items():
        assert ranges[name].specifier.contains(version), (name, version)
        assert ranges[name].specifier != "", f"{name} has no range"
    assert "-c constraints.txt" in (ROOT / "run.sh").read_text()


@pytest.mark.slow
def test_pip_install_next_to_other_jax_and_flax_versions(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip, py = str(venv / "bin" / "pip"), str(venv / "bin" / "python")
    subprocess.run([pip, "install", "-q", "jax==0.10.0", "jaxlib==0.10.0", "flax==0.12.6"],
                   check=True)
    subprocess.run([pip, "install", "-q", "-e", str(ROOT)], check=True)
    out = subprocess.run([py, "-c", "import jax, flax; print(jax.__version__, flax.__version__)"],
                         check=True, capture_output=True, text=True).stdout.split()
    assert out == ["0.10.0", "0.12.6"]        # kept, not replaced by the pins
    proc = subprocess.run([py, "-m", "skilljax.tools.logits", "--checkpoint", "tiny",
                           "--token-ids", "1,2,3", "--out", str(tmp_path / "l.npy")],
                          check=True, capture_output=True, text=True, cwd=tmp_path)
    assert json.loads(proc.stdout.strip().splitlines()[-1])
