"""bench/studies/real_model.py's search on a real pretrained model on the CPU runner: 2 GRPO trials of 1 step on
SmolLM2-135M-Instruct (the packaged copy, tuner.inputs.packaged) complete within the search's memory plan, and every
trial records tuner.trial.memory's estimate beside its measured peak.

One run of ``bench.studies.real_model.run`` (the bench script's own code) serves every slow test here: the model
converted into this module's own folder (~30 s; tests/e2e/inputs/test_packaged.py times two builders at once in the
session's cache), then the search, about a minute on 2 cores. The bench's default model, the Qwen2.5-0.5B shape
(bench/studies/shapes.py, random weights, 494M parameters), took 3 minutes of a worker here for the same claims
(until 2026-12-06); its size is checked from its config on the meta device, and its figures come from
``python -m bench.studies.real_model`` (bench/recorded/real_model.json). One step per trial (the bench runs 2): a
trial sets up, generates, steps and holds its whole training state (weights, gradients, AdamW's moments, allocated
in the first optimizer step) within it, so the peak is reached in step 1. No timing is asserted. The pure pieces
(overlap, step timings, the RESULTS.md section, its GPU table included) are tested on made-up figures, fast.
"""

from __future__ import annotations

import pytest

from tuner.records import Status

pytestmark = pytest.mark.filterwarnings("ignore")
slow = pytest.mark.slow

MAX_STEPS = 1
# Measured peak / estimate on the 2-core runner, SmolLM2-135M-Instruct in fp32, 1 step (4 trials, 2026-12-06, 4
# processes on the 2 cores): 0.35-0.38 (LoRA, no checkpointing: GRPO's estimate assumes 512-token prompts, the built-in
# ones are ~50 tokens), 0.45 (full fine-tuning, no checkpointing), 0.89 (LoRA with checkpointing). The bounds leave a
# factor of 1.75 below the lowest and 3.4 above the highest; the lowest would need a LoRA trial to peak under ~1.05 GB,
# less than its fp32 weights (0.54 GB) and the process with torch and TRL loaded take.
RATIO_LOW, RATIO_HIGH = 1 / 5, 3.0


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    if _cuda():
        pytest.skip("the CPU runner's test; on a GPU run `python -m bench.studies.real_model` (its space and figures differ)")
    from bench.studies.real_model import run
    from tuner.inputs.packaged import PACKAGED, gguf_path, packaged_folder

    smollm2 = PACKAGED["SmolLM2-135M-Instruct"]
    if gguf_path(smollm2) is None:
        pytest.fail(f"the real-model tests need the packaged SmolLM2 copy: {smollm2.install}")
    model = packaged_folder(smollm2, tmp_path_factory.mktemp("smollm2"))
    return run(trainer="grpo", trials=2, max_steps=MAX_STEPS, model=str(model),
               store=tmp_path_factory.mktemp("real-model"), compare="off", time_build=False, echo=lambda line: None)


def _ran(figures):
    return [t for t in figures["trials"] if (t["steps_run"] or 0) > 0]


def test_the_benchs_default_shape_is_qwen25_05b_sized():
    from transformers import AutoConfig

    from bench.studies.shapes import QWEN25_05B
    from tuner.trial import memory

    numbers = {k: v for k, v in QWEN25_05B.items() if k not in ("name", "model_type", "dtype")}
    config = AutoConfig.for_model(QWEN25_05B["model_type"], **numbers)
    assert 490e6 < memory.count_parameters(config) < 500e6  # Qwen2.5-0.5B: 494M with tied embeddings


@slow
def test_the_search_ran_the_real_model(figures):
    assert 130e6 < figures["model"]["parameters"] < 140e6  # SmolLM2-135M: 134.5M
    assert figures["model"]["name"].endswith("SmolLM2-135M-Instruct")


@slow
def test_both_trials_finish_with_a_status_and_none_crashed(figures):
    trials = figures["trials"]
    assert len(trials) == 2
    known = {s.value for s in Status}
    for t in trials:
        assert t["status"] in known, t
        # a crash or an out-of-memory here is the harness or the plan failing, not the config
        assert t["status"] not in (Status.CRASHED, Status.OOM), f"trial {t['number']}: {t['status']}: {t['reason']}"
        if t["status"] == Status.TOO_BIG:
            assert t["reason"] and not t["steps_run"], t  # refused by the plan, with its numbers, never run
        if t["status"] == Status.OK:
            assert t["steps_run"] == MAX_STEPS, t
            assert t["device"] == "cpu"
    assert _ran(figures), "no trial trained a step: nothing was measured"
    assert figures["gpu"]["measured"] is False


@slow
def test_trials_ran_within_the_memory_plan(figures):
    import psutil

    search = figures["search"]
    plan = search.get("plan")
    assert plan, f"search.json has no memory plan: {search.get('plan_note')}"
    assert _ran(figures), "no trial trained a step: nothing to hold to the plan"
    assert plan["device"] == "cpu"
    assert plan["concurrent"] >= 1
    # the trials that really overlapped (their MLflow runs' start and end) and the concurrency the search used
    assert search["max_overlap"] is not None and 1 <= search["max_overlap"] <= plan["concurrent"], (search, plan)
    assert search["concurrency"] <= plan["concurrent"]
    # the plan's own promise: its trials at once, each at the space's largest estimate, fit in the host's memory
    assert plan["concurrent"] * plan["per_trial_mb"] <= psutil.virtual_memory().total / 2**20
    for t in _ran(figures):
        # every config run was within the per-trial budget by its estimate, and measured within it too
        assert t["memory_estimate_mb"] <= plan["budget_mb"], (t, plan)
        assert t["peak_memory_mb"] <= plan["budget_mb"], (t, plan)
        assert t["peak_memory_mb"] <= 2 * plan["per_trial_mb"], (t, plan)


@slow
def test_every_trial_records_its_estimate_beside_its_peak(figures):
    assert _ran(figures), "no trial trained a step: no estimate to hold against a peak"
    for t in _ran(figures):
        assert t["peak_memory_mb"] and t["memory_estimate_mb"], t
        ratio = t["peak_memory_mb"] / t["memory_estimate_mb"]
        assert RATIO_LOW <= ratio <= RATIO_HIGH, (
            f"trial {t['number']} ({t['params']}): peak {t['peak_memory_mb']} MB vs estimate "
            f"{t['memory_estimate_mb']} MB = {ratio:.2f}x")


# -- the pure pieces, on made-up figures -----------------------------------------------------------


def test_overlap_counts_runs_open_at_once_and_not_back_to_back_ones():
    from bench.studies.real_model import max_overlap

    assert max_overlap([(0, 10), (1, 5), (6, 9)]) == 2
    assert max_overlap([(0, 5), (5, 9)]) == 1  # one ends as the next starts
    assert max_overlap([(0, 10), (1, 10), (2, 3)]) == 3


def test_step_timings_split_set_up_from_trl_step_times():
    from bench.studies.real_model import timings

    record = {"seconds_to_first_step": 40.0, "wall_seconds": 90.0, "steps_run": 3}
    history = [{"step": 1, "step_time": 30.0}, {"step": 2, "step_time": 20.0}, {"step": 3, "step_time": 22.0}]
    assert timings(record, history) == {"setup_seconds": 10.0, "first_step_seconds": 30.0, "step_seconds": 21.0}
    # without TRL's step_time: the wall time after step 1, spread over the later steps
    assert timings(record, [])["step_seconds"] == 25.0
    assert timings({"seconds_to_first_step": None, "steps_run": 0}, []) == {
        "setup_seconds": None, "first_step_seconds": None, "step_seconds": None}


def _figures(gpu):
    trial = {"number": 0, "params": {"precision": "bf16-pure", "use_peft": True}, "status": "ok", "reason": "",
             "device": "cpu", "steps_run": 2, "seconds_to_first_step": 40.0, "setup_seconds": 5.0,
             "first_step_seconds": 35.0, "step_seconds": 30.0, "wall_seconds": 75.0, "tokens_per_second": 9.5,
             "peak_memory_mb": 3300.0, "memory_estimate_mb": 7400.0, "peak_over_estimate": 0.446}
    return {
        "command": "python -m bench.studies.real_model", "date": "2026-01-01 00:00 UTC", "total_seconds": 140.0,
        "machine": {"cpu": "AMD EPYC", "cpus": 2, "memory": "23.5 GiB", "load_before": "1.00 1.00 1.00",
                    "gpu": "NVIDIA H100" if gpu else None},
        "versions": {"torch": "2.13.0", "tuner": "abc1234"},
        "model": {"name": "qwen2.5-0.5b-shaped", "parameters": 494032768, "dtype": "bfloat16", "build_seconds": 15.0,
                  "reused": False},
        "search": {"trainer": "grpo", "trials": 1, "max_steps": 2, "seed": 4, "space_note": "CPU_SPACE",
                   "space": {"fixed": {"num_generations": 4}, "params": {"use_peft": {}}},
                   "prepare_seconds": 4.0, "run_seconds": 130.0, "concurrency": 2, "max_overlap": 2,
                   "plan": {"device": "cpu", "concurrent": 2, "gpus_per_trial": 0.0, "limit": "host memory",
                            "per_trial_mb": 7849, "budget_mb": 10245},
                   "statuses": {"ok": 1}, "recommended": None, "process_tree_peak_mb": 9000,
                   "machine_in_use_before_mb": 4000, "machine_in_use_peak_mb": 13000},
        "trials": [trial],
        "gpu": ({"measured": True, "pick": "trial 0", "device": "cuda", "pick_over_trl_defaults": 3.2,
                 "runs": [{**trial, "config": "trial 0"},
                          {**trial, "config": "TRL defaults", "params": {"precision": "bf16-mixed"}}]}
                if gpu else {"measured": False, "note": "no GPU: GPU figures not measured"}),
    }


def test_the_results_section_says_plainly_when_no_gpu_was_there():
    from bench.studies.real_model import section

    text = "\n".join(section(_figures(gpu=False)))
    assert "No GPU was available in this session" in text and "no GPU: GPU figures not measured" in text
    assert "| 0 | `precision=bf16-pure lora=True` | ok | 40.0 | 5.0 | 35.0 | 30.0 | 9.5 | 3300 | 7400 | 0.45 |" in text
    assert "2 trial(s) at once on cpu, bounded by host memory" in text and "`python -m bench.studies.real_model`" in text


def test_the_results_section_has_the_gpu_comparison_when_measured():
    from bench.studies.real_model import section

    text = "\n".join(section(_figures(gpu=True)))
    assert "GPU: NVIDIA H100" in text and "whole GPU" in text
    assert "| TRL defaults | `precision=bf16-mixed` | ok |" in text
    assert "tokens/s of the pick / TRL defaults: **3.20**" in text
