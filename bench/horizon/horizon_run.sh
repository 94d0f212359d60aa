#!/usr/bin/env bash
# Held-out ground truth for the forecast (issue 33) on a lent machine's CPUs: bench/horizon/horizon.py as on this
# project's 2-core runner (trials on the CPU, one thread each), in parallel on the lent machine's cores.
# Run from the repo root with .gpu carried (bench/gpu/gpu_env.sh):
#
#     bash bench/horizon/horizon_run.sh                      # config seeds 31 and 37, seeds 3 and 4 -> $OUT/horizon-seed*.json.gz
#     CONFIG_SEEDS="41" WORKERS=16 bash bench/horizon/horizon_run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/gpu_env.sh || exit 3
export CUDA_VISIBLE_DEVICES="" TUNER_CACHE_DIR=/tmp/tuner-cache HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
out=${OUT:-/tmp}
nproc
python3 -c "from tuner.inputs.models import resolve_model; resolve_model('tiny')"  # built once, before the runs share it
for seed in ${CONFIG_SEEDS:-31 37}; do
    python3 -m bench.horizon.horizon --configs "${CONFIGS:-6}" --config-seed "$seed" --seeds "${SEEDS:-3,4}" \
        --workers "${WORKERS:-8}" --output "$out/horizon-seed$seed.json.gz" >"$out/horizon-$seed.log" 2>&1 &
done
wait
for seed in ${CONFIG_SEEDS:-31 37}; do grep -E "^\[horizon\]" "$out/horizon-$seed.log" | tail -n 3; tail -n 10 "$out/horizon-$seed.log"; done
