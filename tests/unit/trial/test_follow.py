"""What a person watching `tuner verify` or `tuner trial` sees (tuner.trial._follow.RunProgress): a line per tenth of
the run and at least every 30 s, with steps done, steps/s and the time left, and an estimate after the first steps
that says plainly when the run is long. Pure logic on a fake clock and made-up rows; the real run's lines are
checked in tests/training/trial/test_verify_training.py.
"""

from __future__ import annotations

from tuner.trial._follow import EVERY, RunProgress, duration

SHORTER = "pass --steps N for a shorter check"


def rows(steps, pace: float, first_end: float) -> list[dict]:
    """Rows as the monitor writes them: step k ends ``first_end + (k - 1) * pace`` s after training began."""
    return [{"step": k, "loss": 1.0 / k, "grad_norm": 0.5, "train_seconds": first_end + (k - 1) * pace} for k in steps]


def test_a_line_per_tenth_of_the_run_with_steps_per_second_and_time_left():
    progress = RunProgress(total=100, started=0.0)
    lines = progress.add(rows(range(1, 11), pace=0.5, first_end=4.0), now=10.0)
    # the pace is from the end of step 1 on (the model's loading and step 1's warm-up are not in it): 0.5 s a step
    assert lines == ["estimate: ~50 s for 100 steps at 0.5 s a step",
                     "  steps 1-10 | 10/100 steps, 2 steps/s, ~45 s left"]
    assert progress.add(rows(range(11, 20), pace=0.5, first_end=4.0), now=14.5) == []  # 9 steps: not a tenth yet
    assert progress.add(rows([20], pace=0.5, first_end=4.0), now=15.0) == ["  steps 11-20 | 20/100 steps, 2 steps/s, "
                                                                           "~40 s left"]


def test_a_slow_run_gets_a_line_every_30_s_and_an_estimate_that_says_it_is_long():
    # The run: 500 GRPO steps at 22.8 s a step, a tenth every 19 minutes.
    progress = RunProgress(total=500, started=0.0, shorter=SHORTER)
    assert progress.tick(EVERY - 1) == []
    assert progress.tick(EVERY) == ["  waiting for step 1 of 500 (30 s since the start)"]
    assert progress.add(rows([1], pace=22.8, first_end=40.0), now=40.0) == []
    assert progress.tick(EVERY + 29) == []  # 30 s after the last line, not after the last row
    assert progress.tick(2 * EVERY) == ["  step 1/500: no pace yet (1 min since the start)"]
    assert progress.add(rows([2], pace=22.8, first_end=40.0), now=62.8) == []
    (estimate,) = progress.add(rows([3], pace=22.8, first_end=40.0), now=85.6)
    assert estimate == ("estimate: ~3 h 10 min for 500 steps at 22.8 s a step (more than 10 minutes); stop with "
                        "Ctrl-C and pass --steps N for a shorter check")
    assert progress.tick(85.6 + EVERY - 1) == []  # the estimate was a line
    assert progress.tick(85.6 + EVERY) == ["  step 3/500: 0.0439 steps/s, ~3 h 9 min left (1 min 56 s since the start)"]


def test_a_short_run_gets_its_estimate_without_a_warning_and_its_last_part_of_a_tenth():
    progress = RunProgress(total=25, started=0.0, shorter=SHORTER)
    lines = progress.add(rows(range(1, 26), pace=0.25, first_end=2.0), now=9.0)
    assert lines[0] == "estimate: ~6 s for 25 steps at 0.25 s a step"
    assert len(lines) == 1 + 8  # blocks of 3 steps (a tenth, rounded up): 8 whole ones
    assert progress.end(now=9.5) == ["  step 25 | 25/25 steps, 4 steps/s"]  # done: no time left to say
    assert progress.end(now=10.0) == []


def test_rows_without_step_times_are_timed_by_when_they_arrive():
    progress = RunProgress(total=10, started=100.0)
    untimed = [{"step": k, "loss": 1.0} for k in (1, 2, 3)]
    assert progress.add(untimed[:1], now=110.0) == ["  step 1 | 1/10 steps"]  # a block of 1 step; no pace from one
    assert progress.add(untimed[1:2], now=112.0) == ["  step 2 | 2/10 steps, 0.5 steps/s, ~16 s left"]
    assert progress.add(untimed[2:], now=114.0) == ["estimate: ~20 s for 10 steps at 2 s a step",
                                                    "  step 3 | 3/10 steps, 0.5 steps/s, ~14 s left"]


def test_durations_read_as_a_person_waiting_needs():
    assert [duration(s) for s in (0.4, 35, 60, 260, 1500, 3600, 11400)] == [
        "0 s", "35 s", "1 min", "4 min 20 s", "25 min", "1 h", "3 h 10 min"]


def test_a_run_in_this_process_has_one_cpu_thread_as_a_searchs_trial_unless_omp_num_threads_says(monkeypatch):
    import torch

    from tuner.trial import TrialSpec
    from tuner.trial._follow import _trial_threads

    spec = TrialSpec(trainer="sft", params={})
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # torch's choice on a 2-core CPU, where nothing set OMP_NUM_THREADS
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        with _trial_threads(spec):
            assert torch.get_num_threads() == (2 if torch.cuda.is_available() else 1)
        assert torch.get_num_threads() == 2  # torch's choice is back for whatever runs next
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's count is kept
        with _trial_threads(spec):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
