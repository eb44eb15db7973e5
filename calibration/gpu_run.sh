#!/usr/bin/env bash
# One calibration run on one GPU (about 6-7 minutes on an H200, no internet):
#   1. the kernel sweep, graph-timed: every measured op captured in a CUDA graph and the
#      replays timed (many calls per replay for short ops), so no launch time enters a
#      kernel row; every attention kernel the device runs (SDPA flash / cuDNN / efficient,
#      FlexAttention with a paged block mask for decode), FP8 GEMMs with precomputed scales,
#      the FP8 quantisation kernel as an element-wise op;
#   2. whole-layer passes, eager and replayed as CUDA graphs (python -m calibration.steps);
#   3. the fit: a measured profile over the GPU's prior (calibration/priors/<gpu>.json,
#      else the shipped profile), then graph_replay.per_layer_s from the graph passes.
#
# Run from the repo root with an output folder in $OUT (python3 with torch, numpy, pandas,
# scipy, pyyaml, pydantic, pyarrow):
#     OUT=/some/dir bash calibration/gpu_run.sh
# Writes (at most 13 files, at most 2 folders deep; each folder also holds disaggsim's
# .disaggsim-result.json marker):
#     $OUT/run.log                       progress, environment, fit summaries
#     $OUT/raw/<op>.csv                  raw rows (gemm, decode_attention, prefill_attention,
#                                        elementwise, copy, allreduce with 2+ GPUs); every row
#                                        names its kernel (backend) and timing (graph | eager)
#     $OUT/steps/steps.csv               whole-layer passes
#     $OUT/<gpu_id>.json                 the fitted profile with provenance
#     $OUT/validate_steps.txt            step model vs the layer passes
# Every stage is cut by `timeout`, so the fit always runs on whatever was measured. Override
# the GPU id or device: CAL_GPU=h100-sxm CAL_DEVICE=cpu (cpu: tiny sizes, no graphs, about
# a minute; the path CI runs), or run some sweeps only: CAL_OPS=gemm,copy.
set -u
: "${OUT:?set OUT to an output folder}"
GPU="${CAL_GPU:-h200-sxm}"
DEVICE="${CAL_DEVICE:-cuda}"
RAW="$OUT/raw"
STEPS="$OUT/steps"
PROFILE="$OUT/$(echo "$GPU" | tr '-' '_').json"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}."
mkdir -p "$OUT"
LOG="$OUT/run.log"
{
  echo "== calibration/gpu_run.sh gpu=$GPU device=$DEVICE $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  if [ "$DEVICE" = cuda ]; then nvidia-smi 2>&1 | head -20; fi
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "== kernel sweep (graph-timed)"
  timeout --signal=INT --kill-after=15 330 python3 -m calibration --device "$DEVICE" --out "$RAW" ${CAL_OPS:+--ops "$CAL_OPS"}
  echo "sweep exit code $?"
  echo "== whole-layer passes"
  timeout --signal=INT --kill-after=10 130 python3 -m calibration.steps --device "$DEVICE" --out "$STEPS" --budget-s 100
  echo "steps exit code $?"
  echo "== fit"
  timeout 200 python3 -m calibration fit "$RAW" --gpu "$GPU" --out "$PROFILE"
  echo "fit exit code $?"
  if [ -f "$STEPS/steps.csv" ]; then
    timeout 60 python3 -m calibration validate-steps "$STEPS" --gpu "$GPU" --profile "$PROFILE" > "$OUT/validate_steps.txt" 2>&1
    echo "validate-steps exit code $?"
    if [ "$DEVICE" = cuda ]; then
      timeout 60 python3 -m calibration fit-steps "$STEPS" --gpu "$GPU" --profile "$PROFILE" --out "$PROFILE"
      echo "fit-steps exit code $?"
    else
      echo "fit-steps: skipped (graph passes run on a GPU only)"
    fi
  fi
  ls -l "$RAW" "$STEPS" "$PROFILE"
} 2>&1 | tee "$LOG"
