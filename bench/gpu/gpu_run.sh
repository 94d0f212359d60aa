#!/usr/bin/env bash
# The GPU check (issue 37) in one go, on a lent GPU machine: no network, a bare image with torch and
# transformers, ~15 minutes of device time in all. Run from the repo root, with .gpu carried:
#
#     bash bench/gpu/gpu_run.sh              # -> bench/recorded/gpu.json and $OUT/gpu.json, $OUT/gpu.log
#     BUDGET=200 bash bench/gpu/gpu_run.sh   # a shorter budget for a rerun
#     REUSE=bench/recorded/gpu.json BUDGET=150 bash bench/gpu/gpu_run.sh   # the later stages again, on an earlier run's searches
#     REUSE=bench/recorded/gpu.json STAGES=signals bash bench/gpu/gpu_run.sh   # the signals' cost alone, on its picks
#
# What it runs and why each size: bench/gpu/gpu.py. The packages the image lacks: bench/gpu/gpu_env.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/gpu_env.sh || exit 3
export TUNER_CACHE_DIR=/tmp/tuner-cache HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 \
    TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
log=${OUT:-/tmp}/gpu.log
# the whole log comes back in $OUT; the terminal gets it without the libraries' warnings
python3 -m bench.gpu.gpu --budget-seconds "${BUDGET:-300}" ${REUSE:+--reuse "$REUSE"} ${STAGES:+--stages "$STAGES"} 2>&1 | tee "$log" | grep --line-buffered -v -E "warnings.warn|Warning:"
