"""tuner.verdicts.diagnose: a crash every config shares stops the search; anything a config could change does not."""

from tuner.verdicts.diagnose import MIN_TRIALS, systematic_failure


def crashed(number: int, reason: str = "ValueError: bad row 7 (my_rewards.py:4 in score)", **extra) -> dict:
    return {"number": number, "status": "crashed", "reason": reason, "params": {"learning_rate": 10.0 ** -number},
            **extra}


def test_identical_crashes_of_different_configs_stop_the_search():
    reason = systematic_failure([crashed(n) for n in range(MIN_TRIALS)])
    assert reason is not None and "ValueError: bad row 7 (my_rewards.py:4 in score)" in reason
    assert "fix it" in reason


def test_the_same_error_at_other_numbers_is_the_same_error():
    records = [crashed(n, f"ValueError: bad row {7 + n} (my_rewards.py:4 in score)") for n in range(MIN_TRIALS)]
    assert systematic_failure(records) is not None


def test_fewer_trials_different_errors_or_one_trial_that_ran_do_not_stop_it():
    assert systematic_failure([crashed(n) for n in range(MIN_TRIALS - 1)]) is None
    assert systematic_failure([crashed(0), crashed(1, "KeyError: 'answer'"), crashed(2)]) is None
    assert systematic_failure([crashed(0), {"number": 1, "status": "ok", "params": {}}, crashed(2)]) is None
    # the first trials decide: a later identical crash does not outvote an early trial that ran
    assert systematic_failure([{"number": 0, "status": "ok", "params": {}}, *[crashed(n) for n in range(1, 5)]]) is None


def test_a_process_killed_by_a_signal_or_the_clock_can_depend_on_the_config():
    records = [crashed(n, "process killed by SIGKILL", guard_signal="process_died") for n in range(MIN_TRIALS)]
    assert systematic_failure(records) is None


def test_the_same_config_crashing_again_says_nothing_about_other_configs():
    records = [{**crashed(n), "params": {"learning_rate": 1e-3}} for n in range(MIN_TRIALS)]
    assert systematic_failure(records) is None


def test_confirmation_reruns_are_not_search_trials():
    records = [crashed(n, confirms=0) for n in range(MIN_TRIALS)]
    assert systematic_failure(records) is None
