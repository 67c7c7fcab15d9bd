#!/usr/bin/env bash
# One GPU check, <= 10 minutes on one modern GPU (H100/H200 class); prints the versions it found, then one table.
#
#   bash benchmarks/gpu_check.sh            # on a machine with CUDA, from the repository root (a copy of it is enough)
#   CPU_ONLY=1 bash benchmarks/gpu_check.sh # the parts that run without a GPU, at toy sizes (what CI can do)
#
# It installs nothing and checks no pins: it runs on whatever Python it is given (PYTHON, else this repo's .venv, else
# python3) with the repository on PYTHONPATH — a bare, offline GPU machine with its own torch / Lightning / timm works.
# Pure-Python packages that machine lacks (jsonargparse for the CLI) travel as wheels: `bash benchmarks/gpu_wheels.sh`
# here fills .whl/, and this script installs .whl/*.whl into a temp folder (--no-index --no-deps) when it exists.
# Rows whose packages are missing are skipped with a one-line note (FFCV: the loader row; jsonargparse: the tests).
#
# Rows:
#   1. pytest -m gpu          the tests marked `gpu` (skipped without CUDA), e.g. the CUDA sync-debug check of a
#                             steady-state training step (tests/training/test_sync_free.py)
#   2. ViT-B/16 bf16 img/s and MFU: a plain timm loop vs `impulsevit fit` (ImageClassifier + every default callback)
#      on the same synthetic batch (benchmarks/gpu_throughput.py; ratio = fit / timm)
#   3. FSDP2 on one GPU (`fit_fsdp2`, same benchmark)
#   4. FFCV loader img/s at 224 px (benchmarks/loader_speed.py, short256 preset vs torchvision ImageFolder, and its
#      share of the decode limit)
#   5. DeviceAugment (RandAugment + erasing) µs per image on the GPU at 224 and 32 px vs timm's PIL chain per image on
#      one CPU thread (benchmarks/augment_cost.py)
#   6. the device resample of data.resample_on=device, µs per image on the GPU at 224 and 32 px vs the workers' numba
#      resample per image on one core, same boxes, bytes checked equal (benchmarks/device_resample_speed.py); row 4's
#      notes add ffcv:short256+device's share of the decode limit (its workers decode and copy only)
# CPU_ONLY=1 runs rows 2-5 at toy sizes (ViT-Ti, 64 px, 5 steps; 400 images; 28 px augmentation) so the script
# itself is tested
# (tests/house/test_gpu_check.py); its numbers mean nothing for a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$OUT/site" .whl/*.whl \
    || { echo "gpu_check: installing .whl/*.whl failed" >&2; exit 2; }
  export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
rows=()
add() { rows+=("$1|$2|$3|$4"); }

# versions found (no pin check here: this machine's own packages are what is measured)
$PY - > "$OUT/versions.txt" <<'PYEOF'
import importlib, platform
print(f"python {platform.python_version()}")
for name in ("torch", "lightning", "timm", "torchmetrics", "tensorboard", "numba", "jsonargparse", "ffcv"):
    try:
        mod = importlib.import_module(name)
        print(f"{name} {getattr(mod, '__version__', '?')}")
    except Exception as exc:  # absent, or broken on this machine: the row that needs it is skipped
        print(f"{name} absent ({type(exc).__name__})")
import torch
print(f"cuda {torch.version.cuda} device {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
PYEOF
echo "gpu_check: found $(paste -sd ',' "$OUT/versions.txt" | sed 's/,/, /g')"
has() { ! grep -q "^$1 absent" "$OUT/versions.txt"; }

if [ -z "${CPU_ONLY:-}" ] && ! $PY -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: no CUDA device visible (set CPU_ONLY=1 for the CPU-possible parts)" >&2
  exit 2
fi

if [ -z "${CPU_ONLY:-}" ]; then
  if has jsonargparse; then
    mapfile -t gpu_files < <(grep -rl --include='test_*.py' "mark.gpu" tests)
    timeout 150 $PY -m pytest -q -p no:cacheprovider -m gpu "${gpu_files[@]}" > "$OUT/pytest.txt" 2>&1
    rc=$?
    summary=$(tail -n 1 "$OUT/pytest.txt")
    case $rc in 0) status=ok ;; 5) status="none selected" ;; *) status="FAILED (rc $rc)" ;; esac
    add "pytest -m gpu" "$status" "-" "$summary"
  else
    add "pytest -m gpu" "skipped" "-" "jsonargparse absent (bash benchmarks/gpu_wheels.sh, then carry .whl/)"
  fi
  bench=(--model vit_base_patch16_224 --image-size 224 --batch 128 --steps 40 --warmup 10 --device cuda)
  t_bench=240 t_loader=150 t_aug=90
  augment=(--device cuda --sizes 224 32 --batch-size 128 256 --batches 4 --rounds 3)
  resample=(--device cuda --sizes 224 32 --batch-size 256 --rounds 5) t_resample=120
  loader=(--num-images 3000 --sizes 224 --presets short256 --loader-presets short256 --rounds 2 --no-capped
          --workers "$(( $(nproc) > 12 ? 12 : $(nproc) ))" --batch-size 128)
else
  add "pytest -m gpu" "skipped" "-" "CPU_ONLY"
  bench=(--model vit_tiny_patch16_224 --image-size 64 --batch 16 --steps 5 --warmup 2 --device cpu)
  t_bench=1200 t_loader=1200 t_aug=600  # a shared CPU may be very slow; this mode checks the script, not the numbers
  augment=(--device cpu --sizes 28 --batch-size 16 --batches 1 --rounds 1)
  resample=(--device cpu --sizes 32 --batch-size 4 --rounds 1) t_resample=600
  loader=(--num-images 400 --sizes 224 --presets short256 --loader-presets short256 --rounds 1 --no-capped
          --workers 2 --batch-size 32)
fi

timeout "$t_bench" $PY benchmarks/gpu_throughput.py "${bench[@]}" > "$OUT/bench.txt" 2>&1
rc=$?
while read -r _ name rate mfu; do
  add "$name" "ok" "$rate img/s" "MFU $mfu"
done < <(grep '^row ' "$OUT/bench.txt")
ratio=$(grep '^ratio:' "$OUT/bench.txt" | tail -n 1)
[ $rc -eq 0 ] || add "gpu_throughput.py" "FAILED (rc $rc)" "-" "$(tail -n 1 "$OUT/bench.txt")"
[ -n "$ratio" ] && add "fit vs timm loop" "ok" "${ratio#ratio: }" "img/s ratio (1 = no overhead)"

if has ffcv; then
  timeout "$t_loader" $PY benchmarks/loader_speed.py "${loader[@]}" > "$OUT/loader.txt" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    add "FFCV loader short256@224" "ok" "$(awk '$2 == "ffcv:short256" {v = $3} END {print v}' "$OUT/loader.txt") img/s" \
        "vs torchvision ImageFolder: $(grep '^ratio:' "$OUT/loader.txt" | tail -n 1); of the decode limit: $(
        awk '$2 == "ratio" && $3 == "ffcv:short256" {v = $6} END {print v}' "$OUT/loader.txt"); +device (workers' side): $(
        awk '$2 == "ratio" && $3 == "ffcv:short256+device" {v = $6} END {print v}' "$OUT/loader.txt")"
  else
    add "FFCV loader" "FAILED (rc $rc)" "-" "$(tail -n 1 "$OUT/loader.txt")"
  fi
else
  add "FFCV loader" "skipped" "-" "ffcv not importable on this machine"
fi

timeout "$t_aug" $PY benchmarks/augment_cost.py "${augment[@]}" > "$OUT/augment.txt" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  while read -r size batch dev whole timm ratio; do
    add "DeviceAugment ${size} px" "ok" "$dev µs/img" \
        "batch $batch; whole-batch strategy $whole µs/img; timm PIL chain $timm µs/img (1 CPU thread), ratio $ratio"
  done < <(awk 'NF == 6 && $1 ~ /^[0-9]+$/' "$OUT/augment.txt")
else
  add "augment_cost.py" "FAILED (rc $rc)" "-" "$(tail -n 1 "$OUT/augment.txt")"
fi

timeout "$t_resample" $PY benchmarks/device_resample_speed.py "${resample[@]}" > "$OUT/resample.txt" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  while read -r size batch dev numba ratio; do
    add "device resample ${size} px" "ok" "$dev µs/img" "batch $batch; workers' numba resample $numba µs/img (1 core), ratio $ratio"
  done < <(awk 'NF == 5 && $1 ~ /^[0-9]+$/' "$OUT/resample.txt")
else
  add "device_resample_speed.py" "FAILED (rc $rc)" "-" "$(tail -n 1 "$OUT/resample.txt")"
fi

echo
if command -v column > /dev/null; then
  printf '%s\n' "check|status|value|notes" "${rows[@]}" | column -t -s '|'
else
  printf '%s\n' "check|status|value|notes" "${rows[@]}" | tr '|' '\t'
fi
if printf '%s\n' "${rows[@]}" | grep -q FAILED; then
  echo; echo "logs:"; tail -n 20 "$OUT"/*.txt
  exit 1
fi
