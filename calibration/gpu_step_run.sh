#!/usr/bin/env bash
# Whole-layer validation on one GPU: time real transformer-layer forward passes (eager and
# CUDA graphs) and compare them with the step model. About 1-2 min on one H200; no
# internet; needs python3 with torch (2.11+), numpy, pandas, scipy, pyyaml, pydantic.
#
# Run from the repo root with an output folder in $OUT:
#     OUT=/some/dir bash calibration/gpu_step_run.sh
# Writes 3 files (4 on a GPU):
#     $OUT/steps_run.log             progress, environment, the comparison table and the fit
#     $OUT/steps-raw/steps.csv       one row per (shape, mode, prefill/decode point)
#     $OUT/validate_steps.txt        disaggsim calibrate validate-steps output
#     $OUT/steps-raw/<gpu>.json      (GPU only) the profile with engines.cuda-graphs.per_layer_s
#                                    fitted to the graph passes (calibrate fit-steps)
# (and steps-raw/.disaggsim-result.json, the marker listing the files disaggsim wrote there)
# STEPS_GPU (profile to compare with, default h200-sxm) and STEPS_DEVICE (cuda; cpu runs
# tiny sizes in a few seconds, used to test this script without a GPU) can be overridden.
set -u
: "${OUT:?set OUT to an output folder}"
GPU="${STEPS_GPU:-h200-sxm}"
DEVICE="${STEPS_DEVICE:-cuda}"
RAW="$OUT/steps-raw"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}."
mkdir -p "$RAW"
{
  echo "== calibration/gpu_step_run.sh gpu=$GPU device=$DEVICE $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  if [ "$DEVICE" = cuda ]; then nvidia-smi 2>&1 | head -15; fi
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "== layer passes"
  timeout --signal=INT --kill-after=10 170 python3 -m calibration.steps --device "$DEVICE" --out "$RAW" --budget-s 140
  echo "steps exit code $?"
  echo "== validate-steps"
  timeout 60 python3 -m calibration validate-steps "$RAW" --gpu "$GPU" > "$OUT/validate_steps.txt" 2>&1
  echo "validate-steps exit code $?"
  cat "$OUT/validate_steps.txt"
  if [ "$DEVICE" = cuda ]; then
    echo "== fit-steps"
    timeout 60 python3 -m calibration fit-steps "$RAW" --gpu "$GPU"
    echo "fit-steps exit code $?"
  else
    echo "fit-steps: skipped (graph passes run on a GPU only)"
  fi
} 2>&1 | tee "$OUT/steps_run.log"
