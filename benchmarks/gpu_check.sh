#!/usr/bin/env bash
# One GPU check, <= 10 minutes on one modern GPU (H100/H200 class); prints one table at the end.
#
#   bash benchmarks/gpu_check.sh            # on a machine with CUDA, from the repository root
#   CPU_ONLY=1 bash benchmarks/gpu_check.sh # the parts that run without a GPU, at toy sizes (what CI can do)
#
# Rows:
#   1. pytest -m gpu          the tests marked `gpu` (skipped without CUDA), e.g. the CUDA sync-debug check of a
#                             steady-state training step (tests/test_sync_free.py)
#   2. ViT-B/16 bf16 img/s and MFU: a plain timm loop vs `impulsevit fit` (ImageClassifier + every default callback)
#      on the same synthetic batch (benchmarks/gpu_throughput.py; ratio = fit / timm)
#   3. FSDP2 on one GPU (`fit_fsdp2`, same benchmark)
#   4. FFCV loader img/s at 224 px (benchmarks/loader_speed.py, res256 preset vs torchvision ImageFolder)
# CPU_ONLY=1 runs rows 2-4 at toy sizes (ViT-Ti, 64 px, 8 steps; 400 images) so the script itself is tested; its
# numbers mean nothing for a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
rows=()
add() { rows+=("$1|$2|$3|$4"); }

if [ -z "${CPU_ONLY:-}" ] && ! $PY -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: no CUDA device visible (set CPU_ONLY=1 for the CPU-possible parts)" >&2
  exit 2
fi

if [ -z "${CPU_ONLY:-}" ]; then
  timeout 240 $PY -m pytest -q -p no:cacheprovider -m gpu tests > "$OUT/pytest.txt" 2>&1
  rc=$?
  summary=$(tail -n 1 "$OUT/pytest.txt")
  case $rc in 0) status=ok ;; 5) status="none selected" ;; *) status="FAILED (rc $rc)" ;; esac
  add "pytest -m gpu" "$status" "-" "$summary"
  bench=(--model vit_base_patch16_224 --image-size 224 --batch 128 --steps 40 --warmup 10 --device cuda)
  t_bench=300 t_loader=240
  loader=(--num-images 4000 --sizes 224 --presets res256 --loader-presets res256 --rounds 2 --no-capped
          --workers "$(( $(nproc) > 12 ? 12 : $(nproc) ))" --batch-size 128)
else
  add "pytest -m gpu" "skipped" "-" "CPU_ONLY"
  bench=(--model vit_tiny_patch16_224 --image-size 64 --batch 16 --steps 5 --warmup 2 --device cpu)
  t_bench=1800 t_loader=1200  # a shared CPU may be very slow; this mode checks the script, not the numbers
  loader=(--num-images 400 --sizes 224 --presets res256 --loader-presets res256 --rounds 1 --no-capped
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

timeout "$t_loader" $PY benchmarks/loader_speed.py "${loader[@]}" > "$OUT/loader.txt" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  add "FFCV loader res256@224" "ok" "$(awk '$2 == "ffcv:res256" {v = $3} END {print v}' "$OUT/loader.txt") img/s" \
      "vs torchvision ImageFolder: $(grep '^ratio:' "$OUT/loader.txt" | tail -n 1)"
else
  add "FFCV loader" "FAILED (rc $rc)" "-" "$(tail -n 1 "$OUT/loader.txt")"
fi

echo
printf '%s\n' "check|status|value|notes" "${rows[@]}" | column -t -s '|'
if printf '%s\n' "${rows[@]}" | grep -q FAILED; then
  echo; echo "logs:"; tail -n 20 "$OUT"/*.txt
  exit 1
fi
