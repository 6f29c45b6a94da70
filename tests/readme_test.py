"""The README's "Add your own environment" example works as written: its env file, played with
the expert and a random policy, and trained end to end by the command it shows. Every command in
the README and in docs/*.md parses, and their links stay inside the repository."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


@pytest.mark.slow  # in `bash run.sh test-slow`: trains the example env
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


def _pages() -> list:
    """The README and every page under docs/ (the README's reference material lives there)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands() -> list[list[str]]:
    """Every command line of the bash blocks of the README and docs/*.md (continuations joined,
    comments and trailing `&` dropped)."""
    out = []
    for page in _pages():
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip().rstrip("&").strip()
                if line and not line.startswith("#"):
                    out.append(shlex.split(line))
    return out


def _config_spec(argv: list[str]) -> str | None:
    """The config a command trains with: `--config SPEC`, or the launch scripts' CONFIG argument
    (`gpu.sh CONFIG WORKDIR`, `tpu.sh run|local CONFIG WORKDIR`), after any VAR=value prefix."""
    if "--config" in argv:
        return argv[argv.index("--config") + 1]
    while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
        argv = argv[1:]
    if argv[:2] == ["bash", "launch/gpu.sh"]:
        return argv[2]
    if argv[:2] == ["bash", "launch/tpu.sh"] and argv[2] in ("run", "local"):
        return argv[3]
    return None


def test_every_readme_command_parses_and_explains_itself(capsys):
    """Each `python -m` tool in the README and docs/*.md answers --help; each `--config` (with the
    overrides on its line) loads; each launch script parses. The cheap runs themselves are in
    other tests (runlocal trainers, play, the environment example above)."""
    import importlib

    import pytest
    from skilljax import config as config_lib
    commands = _commands()
    modules = sorted({argv[argv.index("-m") + 1] for argv in commands if "-m" in argv})
    assert "skilljax.train" in modules and len(modules) >= 15
    for name in modules:
        with pytest.raises(SystemExit) as e:
            importlib.import_module(name).main(["--help"])
        assert e.value.code == 0, name
        assert "usage:" in capsys.readouterr().out, name
    specs = 0
    for argv in commands:
        overrides = [a for a in argv if a.startswith("--config.")]
        spec = _config_spec(argv)
        if spec is not None:
            config_lib.load_config(str(ROOT / spec), overrides)
            specs += 1
    assert specs >= 20
    for argv in commands:
        for arg in argv:
            if arg.endswith(".sh"):
                subprocess.run(["bash", "-n", str(ROOT / arg)], check=True)
            elif arg.startswith("launch/") and arg.endswith(".py"):
                subprocess.run([sys.executable, str(ROOT / arg), "--help"], check=True,
                               capture_output=True)


def test_readme_is_a_front_page_and_links_stay_in_the_repository():
    """The README stays short (reference material goes to docs/), and every relative link of the
    README and docs/*.md names a file or folder of the repository."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    for page in _pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(ROOT.resolve()) and path.exists(), (page.name, target)
