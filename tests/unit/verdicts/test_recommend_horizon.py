"""The horizon line every recommendation carries (tuner.verdicts.recommend.horizon): the steps and seeds its verdict
covers, and the `tuner verify` command that extends it to a long run's length."""

from __future__ import annotations

from tuner.verdicts.recommend import VERIFY_FACTOR, horizon


def test_the_horizon_names_the_steps_and_every_seed_it_held_on():
    best = {"steps_run": 60, "max_steps": 60, "seed": 7, "confirmation": {"seeds": [7, 8, 9]}}
    line = horizon(best)
    assert line.startswith("horizon: held 60 steps on seeds 7, 8, 9; forecast: no risk signal projects a failure through step "
                           f"{VERIFY_FACTOR * 60}; nothing is measured beyond step 60")
    assert line.endswith(f"tuner verify recommended.yaml --steps {VERIFY_FACTOR * 60} before a long run")


def test_a_trial_stopped_short_or_without_confirmation_says_what_it_ran():
    # a guard note (reward saturated) can end an ok trial early: the horizon is the steps it ran, on its one seed
    line = horizon({"steps_run": 12, "max_steps": 20, "seed": 0}, "THIS_FILE")
    assert "held 12 steps on seed 0;" in line and "tuner verify THIS_FILE --steps 300" in line
    # no seed recorded: the line does not invent one
    assert "seed" not in horizon({"max_steps": 8}).split(";")[0]


def test_a_risk_the_forecast_found_is_in_the_horizon_line_as_a_risk():
    # a trial records the forecast's message alone (TrialResult.risk = str(risks[0])), as the search's pick carries it
    risk = "activations in decoder layer 1 at 0.4% of float16's range, growing 28% a step: overflow expected near step 62"
    line = horizon({"steps_run": 40, "seed": 0, "risk": risk})
    assert f"forecast: at risk: {risk}; nothing is measured beyond step 40" in line
    assert horizon({"steps_run": 40, "seed": 0, "risk": "at risk: " + risk}) == line


def test_a_risk_rung_recommended_says_the_run_whose_first_steps_it_held():
    # a risk rung (tuner.search._extend) ran the first 124 steps of the 500-step run its trial's forecast looked to
    best = {"steps_run": 124, "max_steps": 124, "schedule_steps": 500, "seed": 0, "confirmation": {"seeds": [0, 1, 2]}}
    line = horizon(best)
    assert line.startswith("horizon: held 124 steps of a 500-step run's schedule on seeds 0, 1, 2; forecast: no risk "
                           "signal projects a failure through step 500;")
    assert line.endswith("tuner verify recommended.yaml --steps 500 before a long run")


def test_every_line_that_shows_a_trials_risk_says_at_risk():
    from tuner.report.progress import Progress, results_table
    from tuner.verdicts.forecast import said

    risk = "groups without reward spread rose from 0.24 to 0.85 over 180 steps while the reward held"
    assert said(risk) == "at risk: " + risk and said(said(risk)) == said(risk) and said("") == ""
    record = {"number": 5, "status": "ok", "params": {"precision": "fp32", "learning_rate": 4e-5}, "max_steps": 180,
              "steps_run": 180, "tokens_per_second": 6595.0, "progress": 0.2, "learned": True, "reason": "",
              "risk": risk, "seed": 0}
    assert "at risk: groups without reward spread" in results_table([record])
    lines = []
    Progress(1, lines.append).finished(record)
    assert any(line.strip().startswith("at risk: groups without reward spread") for line in lines), lines


def test_tuner_verify_s_verdict_says_a_recorded_risk_as_a_risk():
    from tuner.records import Status, TrialResult
    from tuner.trial import TrialSpec
    from tuner.trial.verify import verdict_lines

    spec = TrialSpec(trainer="reward", params={"precision": "fp16-pure"}, model="tiny", max_steps=40, seed=3)
    result = TrialResult(status=Status.OK)
    result.steps_run, result.risk = 40, "activations in decoder layer 1 at 3% of float16's range"
    result.history = [{"step": s, "loss": 0.7 - 0.01 * s} for s in range(1, 41)]
    lines = verdict_lines(spec, result)
    assert lines[0] == "held 40 steps: ok"
    assert "forecast: at risk: activations in decoder layer 1 at 3% of float16's range" in lines
