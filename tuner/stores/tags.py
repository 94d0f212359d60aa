"""The MLflow tags and params tuner writes on its runs, one name each: what every writer sets and every reader
(export, report, resume, the tests) reads back.

A search is a parent run tagged ``KIND_TAG = "search"``; each trial, confirmation re-run and longer rung is a nested
run tagged ``KIND_TAG = "trial"``.
"""

KIND_TAG = "tuner.kind"  # "search" on parent runs, "trial" on nested runs
# -- on a trial run
TRIAL_KEY_TAG = "tuner.trial_key"  # the driver's key of a trial run: kept writes find their run by it
TRIAL_NUMBER_TAG = "tuner.trial_number"  # the trial's number in the search (a re-run has the number it re-runs)
OPTUNA_NUMBER_TAG = "tuner.optuna_number"  # a search trial's number in the Optuna study (redraws and priors count there)
RUN_NAME_TAG = "tuner.run_name"  # the run's name: trial-007, confirm-007-seed1, extend-007-60steps
STATUS_TAG = "tuner.status"  # its status (tuner.records.Status), "running" until its verdict, or "interrupted"
REASON_TAG = "tuner.reason"  # why it stopped, in one line
STOPPED_AT_STEP_TAG = "tuner.stopped_at_step"  # the step the guard stopped it at ("None": it ran to the end)
RISK_TAG = "tuner.risk"  # the late-failure forecast in one line ("at risk: ..."), set only on a trial at risk
CONFIRMATION_TAG = "tuner.confirmation"  # "true" on a confirmation re-run
CONFIRMS_TAG = "tuner.confirms"  # the trial number a confirmation re-run confirms
EXTENSION_TAG = "tuner.extension"  # "true" on a longer rung's re-run
EXTENDS_TAG = "tuner.extends"  # the trial number a longer rung re-runs
REMEASURE_TAG = "tuner.remeasure"  # "true" on a speed re-run of a --from search (tuner.search._remeasure)
REMEASURES_TAG = "tuner.remeasures"  # the trial number a speed re-run measures again
ANCHORED_TAG = "tuner.anchored"  # "true" on a GRPO trial's anchored twin (tuner.search._anchor)
ANCHORS_TAG = "tuner.anchors"  # the trial number whose config the twin runs with the KL penalty on
PARAM_PREFIX = "tuner."  # a trial run's own settings as MLflow params: tuner.max_steps, tuner.seed, ...
# -- on a search run
STUDY_TAG = "tuner.study"  # the Optuna study's name
STUDY_STORAGE_TAG = "tuner.study_storage"  # the Optuna storage URL, where one is kept (resume, optuna-dashboard)
PLAN_TAG = "tuner.plan"  # the memory plan: trials at once and what each asks of Ray
STOPPED_BECAUSE_TAG = "tuner.stopped_because"  # why the search handed out no more trials, when it stopped early
RECOMMENDED_TRIAL_TAG = "tuner.recommended_trial"  # the recommended trial's number
RECOMMENDED_RUN_ID_TAG = "tuner.recommended_run_id"  # its MLflow run
COUNT_TAG_PREFIX = "tuner.count."  # tuner.count.<status>: how many trials ended so
# -- on a search run: what a later search's warm start matches it by (tuner.search._warm)
HARDWARE_TAG = "tuner.hardware"  # where its trials ran: "cpu", the GPU's name, or "Ray cluster ADDRESS"
PRECISIONS_TAG = "tuner.precisions"  # the precisions that hardware can run, comma-joined in the table's order
DATA_TAG = "tuner.data"  # the dataset's fingerprint: builtin:TRAINER, sha256:DIGEST of a local file, hub:ID
LENGTHS_TAG = "tuner.data_lengths"  # its rows' token lengths: "p10=6,p50=7,p90=8,n=256" (tuner.inputs.lengths)
WARM_START_TAG = "tuner.warm_start"  # the search runs it warm-started from, comma-joined ("" or absent: none)
WARM_FALLBACK_TAG = "tuner.warm_fallback"  # the trials a warm search runs after its earlier picks failed here
WARM_BUDGET_TAG = "tuner.warm_budget"  # "4/12": a warm search's trials and the default they replaced (its budget cut)
