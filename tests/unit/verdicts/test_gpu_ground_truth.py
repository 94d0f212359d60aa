"""The forecast on ground truth recorded on a GPU (bench/recorded/horizon-gpu-seed107.json.gz: an H100, the tiny model's
trials on CUDA, configs drawn only in fp16-mixed and fp16-pure, 20 steps and 500; recorded with the rules frozen).
The forecast is re-run offline on each 20-step history with today's rules, as on the CPU's sets."""

import pytest
from helpers import BENCH_RECORDED

from bench.horizon.horizon import FAILED, judged_again, load

GPU_SET = BENCH_RECORDED / "horizon-gpu-seed107.json.gz"


@pytest.fixture(scope="module")
def recorded():
    return load(GPU_SET)


def test_the_set_ran_on_cuda_in_the_gpus_own_precisions(recorded):
    assert recorded["devices"] == ["cuda"] and recorded["long"] == 25 * recorded["short"]
    precisions = {run["params"]["precision"] for run in recorded["runs"]}
    assert precisions == {"fp16-mixed", "fp16-pure"}
    # fp16-mixed's GradScaler is real there: every such trial logged its scale each step
    mixed = [run for run in recorded["runs"] if run["params"]["precision"] == "fp16-mixed"]
    assert mixed and all(all("loss_scale" in row for row in run["short"]["history"]) for run in mixed)


def test_every_late_failure_on_the_gpu_is_flagged_at_the_trial_length(recorded):
    # 3 late failures among 15 runs ok at 20 steps: GRPO config 2 (fp16-pure LoRA, lr 0.063) on both seeds, sampling
    # from non-finite probabilities at step 61, flagged by headroom; KTO config 1 (fp16-mixed, lr 0.1) on seed 4,
    # step 264, flagged by headroom on both seeds (seed 3 held 500 steps: the one false flag).
    rows = [row for row in judged_again(recorded) if row["long"] is not None]
    failed = [row for row in rows if row["outcome"] in FAILED]
    flagged = [row for row in rows if row["short"]["risk"]]
    assert len(failed) == 3 and all(row["short"]["risk"] for row in failed)
    false = [(row["trainer"], row["config"], row["seed"]) for row in flagged if row["outcome"] not in FAILED]
    assert false == [("kto", 1, 3)]


def test_sampling_from_a_broken_policy_on_cuda_is_a_divergence_not_a_crash(recorded):
    # On CUDA torch.multinomial's check is a device-side assert: recorded after the fix as the trial diverging.
    grpo = [run for run in recorded["runs"] if run["trainer"] == "grpo"]
    assert all(run["short"]["status"] != "crashed" and (run["long"] is None or run["long"]["status"] != "crashed")
               for run in grpo)
    assert any(run["short"]["reason"].startswith("sampling from the policy hit non-finite probabilities")
               for run in grpo)
