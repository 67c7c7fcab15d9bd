#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the pure-Python wheels a bare GPU machine lacks for benchmarks/gpu_check.sh (the
# CLI's jsonargparse and its `signatures` extra), for that machine's Python 3.12, into .whl/ (git-ignored).
# gpu_check.sh installs .whl/*.whl into a temp folder with --no-index --no-deps when the folder exists.
# The versions are the ones this repo's .venv runs (one version each: two would stop the install).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p .whl
for name in jsonargparse docstring-parser typeshed-client; do
  version=$("$PY" -c "import importlib.metadata as m; print(m.version('$name'))")
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
    --platform any -d .whl "$name==$version"
done
ls -1 .whl
