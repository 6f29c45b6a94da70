"""The README's "Add your own environment" example works as written: its env file, played with
the expert and a random policy, and trained end to end by the command it shows."""

import json
import os
import re
import shlex
import subprocess
import sys

from tests.conftest import ROOT


def _section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_add_your_own_environment_example(tmp_path):
    section = _section("Add your own environment")
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    commands = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    (tmp_path / "my_envs").mkdir()
    (tmp_path / "my_envs" / "__init__.py").write_text("")
    (tmp_path / "my_envs" / "keydoor.py").write_text(code)
    assert len(code.splitlines()) <= 45
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    played, trained = [shlex.split(line) for line in commands.strip().splitlines()]
    assert played[0] == "PYTHONPATH=." and trained[0] == "PYTHONPATH=."

    def run(argv):
        argv = [sys.executable if a == ".venv/bin/python" else a for a in argv[1:]]
        argv = [str(ROOT / a) if a.startswith("configs/") else a for a in argv]
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                              check=True).stdout

    expert = json.loads(run(played).strip().splitlines()[-1])
    assert expert["success_rate"] == 1.0 and expert["mean_steps"] == 2.0
    rand = json.loads(run(played[:-4] + ["--policy", "random", "--episodes", "40"])
                      .strip().splitlines()[-1])
    assert rand["success_rate"] < 0.6 and rand["mean_steps"] <= 6
    trained = [a.replace("/tmp/keydoor", str(tmp_path / "run")) for a in trained]
    run(trained)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["config"]["env"]["name"] == "my_envs.keydoor:KeyDoor"
    assert summary["eval"]["final"]["without_skills"]["episodes"] > 0
