# Source from the repo root on the (offline) GPU machine:  source bench/gpu/gpu_env.sh || exit
#
# The image there has torch, transformers, accelerate, numpy, pandas, pyarrow... but not ray, trl, optuna, mlflow,
# datasets, pydantic, SQLAlchemy etc. Those travel, pruned (no Ray Java/dashboard UI/RLlib/Serve, no MLflow UI), as
# .gpu/site312.tar.xz (built by bench/gpu/gpu_carry.sh, ignored by git; name `.gpu` in the device tool's `carry`). This unpacks it
# into /tmp/site, puts it and the repo ahead of the image's packages, and checks the imports: non-zero if any fails.

_gpu_env() {
    local arc=.gpu/site312.tar.xz site=/tmp/site
    [ -f "$arc" ] || { echo "gpu_env: $arc not found (run from the repo root, carry .gpu)" >&2; return 1; }
    # Unpack once per machine (~2 s, 260 MB); again if the archive is newer than the unpacked copy.
    if [ ! -f "$site/.unpacked" ] || [ "$arc" -nt "$site/.unpacked" ]; then
        rm -rf "$site" && mkdir -p "$site" || return 1
        if command -v xz >/dev/null; then tar -xJf "$arc" -C "$site"
        else python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' "$arc" "$site"
        fi || { echo "gpu_env: unpacking $arc failed" >&2; return 1; }
        touch "$site/.unpacked"
    fi
    # Ray's workers and Tune's trial processes inherit PYTHONPATH, so they see the same packages.
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    # No network there: keep Ray's and MLflow's usage reporting from trying.
    export RAY_USAGE_STATS_ENABLED="${RAY_USAGE_STATS_ENABLED:-0}" MLFLOW_DISABLE_TELEMETRY="${MLFLOW_DISABLE_TELEMETRY:-true}"
    python3 - <<'EOF'
import importlib, sys
bad = []
for name in ["torch", "transformers", "trl", "ray", "ray.tune", "optuna", "mlflow", "datasets", "peft", "accelerate",
             "pydantic", "sqlalchemy", "mlflow.store.tracking.sqlalchemy_store", "ray.tune.search.optuna", "tuner"]:
    try:
        m = importlib.import_module(name)
        if "." not in name:
            print(f"{name:13s} {getattr(m, '__version__', '?'):18s} {m.__file__}")
    except Exception as e:  # noqa: BLE001 - report every failing import, then fail once
        bad.append(name)
        print(f"{name:13s} IMPORT FAILED: {type(e).__name__}: {e}", file=sys.stderr)
if "torch" not in bad:
    import torch
    print(f"CUDA available: {torch.cuda.is_available()}"
          + (f" ({torch.cuda.device_count()} x {torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else ""))
sys.exit(f"gpu_env: imports failed: {', '.join(bad)}" if bad else 0)
EOF
}
_gpu_env; _gpu_env_rc=$?; unset -f _gpu_env
[ $_gpu_env_rc -eq 0 ] || echo "gpu_env: FAILED (rc=$_gpu_env_rc)" >&2
return $_gpu_env_rc 2>/dev/null || exit $_gpu_env_rc
