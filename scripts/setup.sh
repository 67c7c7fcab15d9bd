#!/usr/bin/env bash
# Sets up (or updates) the project's virtual environment on a fresh machine; safe to run again (idempotent).
#   - system packages (when root and apt-get exists): FFCV's build deps (OpenCV, libjpeg-turbo, pkg-config),
#     Debian's Fashion-MNIST, and SLURM + munge for the cluster tests;
#   - .venv with the package and its extras (ffcv, dev) at the exact versions CI tests: constraints/ci.txt (torch
#     2.14.1, torchvision 0.29.1, timm, Lightning, ...); setup.cfg holds the ranges users get.
# Env: IMPULSEVIT_VENV (default .venv), IMPULSEVIT_NO_APT=1 to skip apt, IMPULSEVIT_NO_FFCV=1 to skip FFCV.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${IMPULSEVIT_VENV:-.venv}
APT_PKGS="libopencv-dev libturbojpeg0-dev pkg-config dataset-fashion-mnist slurmctld slurmd slurm-client munge"

if [[ "${IMPULSEVIT_NO_APT:-0}" != 1 && $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  missing=""
  for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [[ -n "$missing" ]]; then
    echo "[setup] apt-get install:$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends $missing >/dev/null
  fi
fi

[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
CONSTRAINTS=constraints/ci.txt
torch_pin=$(sed -n 's/^torch==//p' "$CONSTRAINTS")
vision_pin=$(sed -n 's/^torchvision==//p' "$CONSTRAINTS")
if ! "$PY" -c "import torch, torchvision, sys; sys.exit(not (torch.__version__.startswith('$torch_pin') and torchvision.__version__.startswith('$vision_pin')))" 2>/dev/null; then
  echo "[setup] installing torch $torch_pin + torchvision $vision_pin"
  "$PY" -m pip install -q --upgrade pip wheel setuptools
  "$PY" -m pip install -q -c "$CONSTRAINTS" torch torchvision
fi
extras="dev"
if [[ "${IMPULSEVIT_NO_FFCV:-0}" != 1 ]] && pkg-config --exists opencv4 2>/dev/null; then extras="dev,ffcv"; fi
stamp="$VENV/.impulsevit-setup-$(cat setup.cfg pyproject.toml "$CONSTRAINTS" | sha1sum | cut -c1-12)-$extras"
if [[ ! -f "$stamp" ]]; then
  echo "[setup] pip install -c $CONSTRAINTS -e .[$extras]"
  "$PY" -m pip install -q -c "$CONSTRAINTS" -e ".[$extras]"
  touch "$stamp"
fi
echo "[setup] ready: $VENV ($("$PY" -c 'import torch, timm, lightning; print(f"torch {torch.__version__}, timm {timm.__version__}, lightning {lightning.__version__}")'))"
