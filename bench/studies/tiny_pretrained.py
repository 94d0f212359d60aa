"""The tiny pretrained model's real build (``--model tiny-pretrained``), checked: it starts GRPO in its target band
and a GRPO trial through tuner learns from it at a pretrained model's learning rate.

    python -m bench.studies.tiny_pretrained                      # builds it (~4 min on a CPU core), then ~3 min of checks
    python -m bench.studies.tiny_pretrained --cache-dir DIR      # a build already in DIR is reused (the tuner cache layout)

The build is deterministic on one machine (tuner/inputs/_tiny_pretrained.py) and takes minutes, and the GRPO check
needs 120 steps to tell its start from its end; together they were the test suite's longest test (11-15 minutes on
the 2-core runner). So the full check runs here and writes bench/recorded/tiny_pretrained.json: the build's record, the
claims with their bounds and figures, and the fingerprint of the build's recipe (``recipe_fingerprint``: the code
of the build, its tokenizer and its tasks, comments and docstrings aside). The test suite
(tests/training/inputs/test_tiny_pretrained.py) covers the claim in two ways: it fails when the recipe's fingerprint is
not the one this script checked last (a change to the build needs this run again: bump TINY_PRETRAINED_VERSION and
run it), and it runs this script's own ``measure`` end to end on a short build through the alias (the same code
path: build, estimates, a GRPO trial through tuner, tuner's learning judgement), with the short build's figures.
Exit code 1 when a claim fails.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import os
import sys
import tempfile
import time
import tokenize
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # `python bench/studies/tiny_pretrained.py`
    sys.path.insert(0, str(REPO))

OUTPUT = REPO / "bench" / "recorded" / "tiny_pretrained.json"
# The files whose code decides the build's bytes: the build itself, its tokenizer, the tasks it learns.
RECIPE = ("tuner/inputs/_tiny_pretrained.py", "tuner/inputs/_word_tokenizer.py", "tuner/inputs/tasks.py")

# A GRPO trial through tuner at a pretrained model's learning rate: it learns to stop hedging in tens of steps.
# 120 steps, so its start (the first 12) and end are each known to ~0.05: a 60-step run is a weak test on one seed
# (at 4e-5: p 0.008, 0.027, 0.038 on seeds 0-2).
GRPO_PARAMS = {"learning_rate": 3e-5, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2,
               "num_generations": 4, "max_completion_length": 12, "temperature": 1.0, "beta": 0.0,
               "loss_type": "dr_grpo", "lr_scheduler_type": "constant"}
GRPO_STEPS = 120
ESTIMATE_SEEDS = (1, 2)  # other sampling seeds than the build's own estimate
# Some answers right, most wrong (measured 0.230-0.248 over seeds 0-3; 1024 completions each).
REWARD_BAND = (0.18, 0.6)
SPREAD_AT_LEAST = 0.6  # most groups of 4 completions differ in reward, so GRPO has a signal (measured 0.74-0.79)
RESCALED_MORE_THAN = 5  # at a real model's scale: its embeddings were about 25x larger before the build rescaled them
GAIN_AT_LEAST = 0.1  # measured on seeds 0-2: last third +0.29, +0.30, +0.23 above the start, p 7e-5, 6e-5, 0.002


def recipe_fingerprint(root: Path = REPO) -> str:
    """sha256 of the recipe files' code: their text without docstrings, comments and blank lines, so an edit of
    those keeps it. (The text, not ``ast.dump``, whose output differs between Python versions.)"""
    digest = hashlib.sha256()
    for name in RECIPE:
        digest.update(name.encode() + b"\0" + _code_only((root / name).read_text()).encode() + b"\0")
    return digest.hexdigest()


def _code_only(text: str) -> str:
    lines = [line.encode() for line in text.splitlines()]  # ast's columns count UTF-8 bytes
    spans = []  # (first line, its column, last line, its end column): 1-based lines, byte columns
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            doc = body[0]
            spans.append((doc.lineno, doc.col_offset, doc.end_lineno, doc.end_col_offset))
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            (row, col), line = token.start, token.line.splitlines()[0] if token.line else ""
            spans.append((row, len(line[:col].encode()), row, len(lines[row - 1])))
    rows = [bytearray(line) for line in lines]
    for first, start, last, end in spans:
        for number in range(first, last + 1):
            row = rows[number - 1]
            cut_from, cut_to = (start if number == first else 0), (end if number == last else len(row))
            row[cut_from:cut_to] = b" " * (min(cut_to, len(row)) - cut_from)
    kept = (bytes(row).decode().rstrip() for row in rows)
    return "\n".join(line for line in kept if line)


def measure(path: str | os.PathLike, model: str, grpo_steps: int = GRPO_STEPS) -> dict[str, Any]:
    """The figures of the build at ``path`` (its record), its start estimates on ESTIMATE_SEEDS, and a GRPO trial of
    ``grpo_steps`` on ``model`` (the alias, resolved to ``path``) judged by tuner; each claim with its bound and
    whether it held."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tuner.config.trainers import adapter
    from tuner.inputs import RECORD, start_estimates
    from tuner.inputs.tasks import grpo_rows
    from tuner.records import Status
    from tuner.trial import TrialSpec, run_trial
    from tuner.verdicts.learning import judge_learning

    path = Path(path)
    record = json.loads((path / RECORD).read_text())
    claims = [
        {"claim": "the build's own start-reward estimate reaches its target", "figure": record["start_reward"],
         "bound": f">= {record['target_reward']}", "held": record["start_reward"] >= record["target_reward"]},
        {"claim": "rescaled to a real model's scale", "figure": record["rescaled_by"],
         "bound": f"> {RESCALED_MORE_THAN}", "held": record["rescaled_by"] > RESCALED_MORE_THAN},
    ]
    loaded, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    for seed in ESTIMATE_SEEDS:
        reward, spread = start_estimates(loaded, tokenizer, grpo_rows(), seed=seed)
        claims.append({"claim": f"start reward, sampling seed {seed}", "figure": round(reward, 4),
                       "bound": f"{REWARD_BAND[0]}..{REWARD_BAND[1]}", "held": REWARD_BAND[0] <= reward <= REWARD_BAND[1]})
        claims.append({"claim": f"groups with spread, sampling seed {seed}", "figure": round(spread, 4),
                       "bound": f">= {SPREAD_AT_LEAST}", "held": spread >= SPREAD_AT_LEAST})
    started = time.perf_counter()
    result = run_trial(TrialSpec(trainer="grpo", params=GRPO_PARAMS, model=model, max_steps=grpo_steps, seed=0))
    trial = {"steps": grpo_steps, "status": str(result.status), "reason": result.reason,
             "steps_run": result.steps_run, "seconds": round(time.perf_counter() - started, 1)}
    claims.append({"claim": "the GRPO trial runs ok", "figure": trial["status"], "bound": "ok",
                   "held": result.status == Status.OK})
    if result.status == Status.OK:
        judged = judge_learning(adapter("grpo"), result.history)
        trial["judged"] = judged.describe()
        claims.append({"claim": f"the {grpo_steps}-step GRPO trial learned (tuner's judgement)",
                       "figure": judged.describe(), "bound": "learned", "held": bool(judged.learned)})
        gain = None if judged.gain is None else round(judged.gain, 4)  # None: too few steps to tell
        claims.append({"claim": "its gain, last third over the start", "figure": gain,
                       "bound": f">= {GAIN_AT_LEAST}", "held": gain is not None and gain >= GAIN_AT_LEAST})
    return {"record": record, "grpo": trial, "grpo_params": GRPO_PARAMS, "claims": claims,
            "held": all(c["held"] for c in claims)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.tiny_pretrained", description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default=None, help="the tuner cache to build into or reuse (default: a new "
                        "temporary folder: a fresh build)")
    parser.add_argument("--output", default=str(OUTPUT))
    args = parser.parse_args(argv)
    cache = Path(args.cache_dir or tempfile.mkdtemp(prefix="bench-tiny-pretrained-")).resolve()
    os.environ["TUNER_CACHE_DIR"] = str(cache)  # the trial's process resolves the alias here too

    from bench.common import results as common
    from tuner.inputs.models import TINY_PRETRAINED_MODEL, resolve_model

    started = time.perf_counter()
    machine = common.machine()
    path = resolve_model(TINY_PRETRAINED_MODEL)
    figures = measure(path, TINY_PRETRAINED_MODEL)
    figures.update(command=" ".join(["python -m bench.studies.tiny_pretrained", *(argv if argv is not None else sys.argv[1:])]),
                   date=machine["date"], machine=machine, versions=common.versions(),
                   recipe_fingerprint=recipe_fingerprint(), total_seconds=round(time.perf_counter() - started, 1))
    Path(args.output).write_text(json.dumps(figures, indent=1, default=str) + "\n")
    for claim in figures["claims"]:
        print(f"{'ok  ' if claim['held'] else 'FAIL'} {claim['claim']}: {claim['figure']} ({claim['bound']})")
    print(f"wrote {args.output} in {figures['total_seconds']:.0f} s")
    return 0 if figures["held"] else 1


if __name__ == "__main__":
    sys.exit(main())
