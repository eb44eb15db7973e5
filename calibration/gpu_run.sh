#!/usr/bin/env bash
# One calibration run on one GPU: torch sweeps -> raw CSVs -> fitted profile.
#
# Run from the repo root with an output folder in $OUT (nothing needs installing beyond
# python3 with torch, numpy, pandas, scipy, pyyaml, pydantic, pyarrow):
#     OUT=/some/dir bash calibration/gpu_run.sh
# Writes (6 files, at most 2 folders deep):
#     $OUT/run.log                                   progress and fit summary
#     $OUT/h200-raw/{gemm,decode_attention,prefill_attention,copy}.csv   raw rows
#     $OUT/h200_sxm.json                             the fitted profile
# The sweep stops itself by per-op time budgets (~4 min in all) and is also cut by
# `timeout`, so the fit always runs on whatever was measured. GPU id and device can be
# overridden: CAL_GPU=h100-sxm CAL_DEVICE=cpu (cpu: tiny sizes, a few seconds; used to
# test this script without a GPU).
set -u
: "${OUT:?set OUT to an output folder}"
GPU="${CAL_GPU:-h200-sxm}"
DEVICE="${CAL_DEVICE:-cuda}"
RAW="$OUT/${GPU%%-*}-raw"
PROFILE="$OUT/$(echo "$GPU" | tr '-' '_').json"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}."
mkdir -p "$RAW"
LOG="$OUT/run.log"
{
  echo "== calibration/gpu_run.sh gpu=$GPU device=$DEVICE $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  if [ "$DEVICE" = cuda ]; then nvidia-smi 2>&1 | head -20; fi
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "== sweep"
  timeout --signal=INT --kill-after=15 300 python3 -m calibration --device "$DEVICE" --out "$RAW"
  echo "sweep exit code $?"
  echo "== fit"
  timeout 150 python3 -m calibration fit "$RAW" --gpu "$GPU" --out "$PROFILE"
  echo "fit exit code $?"
  ls -l "$RAW" "$PROFILE"
} 2>&1 | tee "$LOG"
