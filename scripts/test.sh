#!/usr/bin/env bash
# Sets up the environment (scripts/setup.sh, at constraints/ci.txt's exact versions), checks the installed versions
# against setup.cfg's ranges and the compat table (scripts/check_pins.py), lints with ruff, and runs the whole test
# suite; extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the installed versions must lie inside setup.cfg's ranges, and the libraries whose private API is used inside the
# versions impulsevit._compat.CHECKED_ON was checked on: fail loudly
.venv/bin/python scripts/check_pins.py --strict
# lint (pyproject.toml's ruff rules) before the suite: a style error fails fast, naming file and line
.venv/bin/ruff check impulsevit tests benchmarks scripts
# two workers (IMPULSEVIT_TEST_WORKERS): each test file runs on one of them (tests/conftest.py, --dist loadgroup);
# the 20 slowest tests are listed at the end (the suite's time budget is ~20 min on 2 cores)
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=20 --timeout 900 -n "${IMPULSEVIT_TEST_WORKERS:-2}" --dist loadgroup "$@"
