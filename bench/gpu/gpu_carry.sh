#!/usr/bin/env bash
# Build .gpu/site312.tar.xz: the packages the lent GPU machines' image lacks (Python 3.12; torch, transformers,
# accelerate, numpy, pandas, pyarrow ... are there), pruned to fit the 64 MiB the device tool carries, for
# bench/gpu/gpu_env.sh to unpack there. Needs pip access to a package index.
#
#     bash bench/gpu/gpu_carry.sh          # -> .gpu/site312.tar.xz (~34 MiB); .gpu/ is ignored by git
set -euo pipefail
cd "$(dirname "$0")/../.."
# One version each, the versions tuner is tested with (pyproject.toml, the CI's venv); the image's own
# packages (KINDS.md of the device tool) are left out.
WHEELS="$(cat <<'LIST'
alembic==1.20.1 annotated_types==0.8.0 blinker==1.9.0 cachetools==7.3.3 cffi==2.1.1 colorlog==6.12.0
cryptography==50.0.2 databricks_sdk==0.162.0 datasets==5.2.0 dill==0.4.1 docker==7.2.0 fastapi==0.165.0
flask==3.1.3 flask_cors==6.0.5 gitdb==4.0.12 gitpython==3.2.1 google_auth==2.63.0 graphene==3.4.3
graphql_core==3.2.14 graphql_relay==3.2.0 gunicorn==26.2.0 huey==3.5.4 importlib_metadata==9.1.0
itsdangerous==2.2.0 jsonschema==4.26.0 jsonschema_specifications==2025.9.1 mako==1.4.3 mlflow==3.17.2
mlflow_skinny==3.17.2 mlflow_tracing==3.17.2 multiprocess==0.70.19 opentelemetry_api==1.45.2
opentelemetry_proto==1.45.2 opentelemetry_sdk==1.45.2 opentelemetry_semantic_conventions==0.66b2 optuna==5.0.0
peft==0.21.2 prettytable==3.18.0 pyasn1==0.6.5 pyasn1_modules==0.4.2 pycparser==3.12 pydantic==2.14.4
pydantic_core==2.50.5 python_dotenv==1.2.4 ray==2.60.0 referencing==0.37.0 rpds_py==2026.9.1 skops==0.16.0
smmap==5.0.3 sqlalchemy==2.1.9 sqlparse==0.6.1 starlette==1.10.0 tensorboardx==2.6.5 transformers==5.24.0
trl==1.16.0 typing_inspection==0.4.5 uvicorn==0.54.0 wcwidth==0.9.4
LIST
)"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# installed for the image's Python (3.12, x86-64 Linux) into one folder, whatever this machine runs
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --target "$work/site" $WHEELS
cd "$work/site"
rm -rf bin  # console scripts: use python3 -m ray, python3 -m mlflow there
# what a local ray.init() + Ray Tune + MLflow's SQLite store do not use: Java, the dashboard's and MLflow's UIs,
# RLlib, Serve, tests; symbols stripped (Ray's crash backtraces lose names)
rm -rf ray/jars ray/dashboard/client/build ray/rllib ray/serve ray/llm ray/tune/examples mlflow/server/js
find . -name '*.js.map' -delete
find . -type d \( -name tests -o -name __pycache__ \) -prune -exec rm -rf {} +
find . -name '*.so' -print0 | xargs -0 strip --strip-unneeded
strip --strip-unneeded ray/core/src/ray/gcs/gcs_server ray/core/src/ray/raylet/raylet
cd - >/dev/null
mkdir -p .gpu
tar -C "$work/site" --owner=0 --group=0 --sort=name -cf - . | xz -9 -T0 > .gpu/site312.tar.xz.tmp
mv .gpu/site312.tar.xz.tmp .gpu/site312.tar.xz
ls -l .gpu/site312.tar.xz
