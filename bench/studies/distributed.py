"""A trial of several ranks against one process, side by side on this machine: tokens/s and peak memory per rank.

    python -m bench.studies.distributed                          # -> bench/recorded/distributed.json
    python -m bench.studies.distributed --model shape --steps 20 # the Qwen2.5-0.5B shape (bench/studies/shapes.py), 20 SFT steps

What runs, by what the machine has (the same SFT trial each time, the same data and seed, one after the other):

- 2 or more GPUs: the trial on 1 GPU (one process), then on 2 GPUs (2 ranks, DDP), then on 2 GPUs with
  ``sharding: fsdp``; the figure is tokens/s of 2 GPUs over 1;
- 1 GPU: the one-process trial, then the same trial through the distributed path with 1 rank (torch's elastic
  launcher, NCCL, and FSDP2 with ``sharding: fsdp``): what the path costs, and that it runs on a GPU; no 2-GPU
  figure can be had;
- no GPU: 1 process against 2 gloo ranks sharing the machine's cores.

Each row: status, tokens/s (all ranks together), peak memory of rank 0 (GPU: max allocated; CPU: resident set),
wall time, and what rank 0 says its job was ("rank 0 of 2: MULTI_GPU, fsdp: False"); every run --repeats times in
turn, the summary their median. Nothing is asserted; the figures go to the JSON and docs/distributed.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

OUTPUT = REPO / "bench" / "recorded" / "distributed.json"
PARAMS = {"learning_rate": 1e-5, "per_device_train_batch_size": 8, "max_length": 256, "lr_scheduler_type": "constant"}


def _run(spec, label: str, distributed: bool) -> dict:
    from tuner.trial import run_trial_isolated
    from tuner.trial.ranks import run_ranks

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tuner-bench-ranks-") as workdir:
        # each in a fresh process (a trial's own, or the ranks'): none starts with a warm CUDA context or allocator
        result = run_ranks(spec, workdir) if distributed else run_trial_isolated(spec, workdir, timeout=1800)
        log = Path(workdir) / "rank0.log"
        # what rank 0 says it was part of: "rank 0 of 2: MULTI_GPU, fsdp: False" (tuner.trial._run)
        job = next((line for line in log.read_text().splitlines() if line.startswith("rank 0 of ")), None) \
            if log.exists() else None
    row = {"run": label, "ranks": spec.ranks, "path": "elastic launcher" if distributed else "one process",
           "sharding": spec.params.get("sharding", "none"), "job": job, "status": str(result.status), "reason": result.reason,
           "tokens_per_second": result.tokens_per_second, "peak_memory_mb_rank0": result.peak_memory_mb,
           "steps": result.steps_run, "wall_seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="shape", help="'shape': the Qwen2.5-0.5B shape; 'tiny'; or a model path")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="each run this many times, in turn")
    parser.add_argument("--output", default=str(OUTPUT))
    args = parser.parse_args(argv)

    import torch

    from tuner.trial import TrialSpec

    model = args.model
    if model == "shape":
        from bench.studies.shapes import QWEN25_05B, build_shaped_model

        model = str(build_shaped_model(QWEN25_05B))
    gpus = torch.cuda.device_count()
    precision = "bf16-mixed" if gpus else "fp32"
    base = {**PARAMS, "precision": precision}

    def spec(ranks: int, **extra) -> TrialSpec:
        return TrialSpec(trainer="sft", params={**base, **extra}, model=model, max_steps=args.steps, ranks=ranks,
                         warmup_steps=3)

    runs = [(spec(1), "1 process", False)]
    if gpus >= 2:
        runs += [(spec(2), "2 GPUs, DDP", True), (spec(2, sharding="fsdp"), "2 GPUs, FSDP2", True)]
    elif gpus == 1:
        runs += [(spec(1), "1 rank via the elastic launcher (NCCL), DDP", True),
                 (spec(1, sharding="fsdp"), "1 rank via the elastic launcher (NCCL), FSDP2", True)]
    else:
        runs += [(spec(2), "2 gloo ranks, DDP", True)]
    # each run --repeats times, in turn (ABCABC): a drift of the machine falls on every run alike
    rows = [_run(s, label, distributed) for _ in range(args.repeats) for s, label, distributed in runs]
    summary = []
    for _, label, _ in runs:
        figures = sorted(r["tokens_per_second"] for r in rows if r["run"] == label and r["tokens_per_second"])
        summary.append({"run": label, "tokens_per_second_median": figures[len(figures) // 2] if figures else None,
                        "tokens_per_second_all": figures})
    first = summary[0]["tokens_per_second_median"]
    for row in summary:
        tps = row["tokens_per_second_median"]
        row["vs_1_process"] = round(tps / first, 3) if tps and first else None
    device = torch.cuda.get_device_name(0) if gpus else "cpu"
    figures = {"device": device, "gpus": gpus, "model": args.model, "trainer": "sft", "steps": args.steps,
               "params": base, "torch": torch.__version__, "summary": summary, "rows": rows,
               "command": "python -m bench.studies.distributed " + " ".join(argv if argv is not None else sys.argv[1:])}
    Path(args.output).write_text(json.dumps(figures, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0 if all(row["status"] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
