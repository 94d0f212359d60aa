"""The prepared run for a lent GPU machine (``python -m bench.gpu.gpu``; ``--dry`` on a CPU): GRPO and DPO searches on
the Qwen2.5-0.5B shape, their picks against TRL's defaults, the signals' cost, fp16-mixed's GradScaler, written to
bench/recorded/gpu.json and the RESULTS section "On a GPU"; and its shell helpers: ``gpu_run.sh`` runs it there,
``gpu_horizon.sh`` the forecast's ground truth on CUDA, ``gpu_env.sh`` unpacks the packages the bare image lacks
from .gpu/, which ``gpu_carry.sh`` builds."""
