#!/usr/bin/env bash
# Issue 33 on a lent GPU machine, in one go (~8 minutes; run from the repo root with .gpu carried, as
# bench/gpu/gpu_run.sh):
#
#   1. the early-warning signals' cost alone (goal: at most 5% of a step), on the Qwen2.5-0.5B shape's GRPO and DPO
#      picks of the recorded GPU searches (bench/gpu/gpu.py --stages signals --reuse bench/recorded/gpu.json);
#   2. held-out ground truth on the GPU: bench/horizon/horizon.py on the tiny model, configs drawn in the precisions a CPU
#      cannot stand for (fp16-mixed's GradScaler runs on CUDA only; fp16-pure on CUDA's kernels), 20 and 500 steps,
#      two seeds, the forecast's rules as committed.
#
#     bash bench/gpu/gpu_horizon.sh      # -> $OUT/gpu-signals.json, $OUT/horizon-gpu-seed107.json.gz and their logs
#     SKIP_SIGNALS=1 bash bench/gpu/gpu_horizon.sh    # the ground truth alone
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/gpu_env.sh || exit 3
export TUNER_CACHE_DIR=/tmp/tuner-cache HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 \
    TOKENIZERS_PARALLELISM=false
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "from tuner.inputs.models import resolve_model; resolve_model('tiny')"  # built once, before the runs share it
if [ -z "${SKIP_SIGNALS:-}" ]; then
    timeout "${SIGNALS_S:-240}" python3 -m bench.gpu.gpu --reuse bench/recorded/gpu.json --stages signals \
        --budget-seconds "${SIGNALS_BUDGET:-200}" --output "$out/gpu-signals.json" >"$out/gpu-signals.log" 2>&1
    echo "signals rc=$?"
    grep -E "^\[gpu\]|Error|error" "$out/gpu-signals.log" | tail -n 30
fi
seed=${CONFIG_SEED:-107}
timeout "${HORIZON_S:-260}" python3 -m bench.horizon.horizon --precisions "${PRECISIONS:-fp16-mixed,fp16-pure}" \
    --configs "${CONFIGS:-3}" --config-seed "$seed" --seeds "${SEEDS:-3,4}" --workers "${WORKERS:-12}" \
    --output "$out/horizon-gpu-seed$seed.json.gz" --partial "$out/horizon-gpu-seed$seed.partial.json.gz" \
    >"$out/horizon-gpu.log" 2>&1
echo "horizon rc=$?"
grep -E "^\[horizon\]|Error" "$out/horizon-gpu.log" | tail -n 60
tail -n 12 "$out/horizon-gpu.log"
