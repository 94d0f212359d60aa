"""Pure judgement over numbers: a trial's rows in, a verdict out. Tested on recorded rows.

    guard.py      the first step a trial broke (non-finite, exploded, collapsed), or none
    learning.py   did it learn, how far and how early, from where it started (effect and test)
    diagnose.py   failures that do not depend on the config: the user's to fix
    recommend.py  the rule that picks the recommended config, and its TRL config

May import: tuner.config, tuner.errors, tuner.records.
"""

from tuner._exports import lazy_exports

# Each public name and the module it lives in.
__all__, __getattr__ = lazy_exports(__name__, {
    "Guard": "tuner.verdicts.guard",
    "GuardSettings": "tuner.verdicts.guard",
    "Learning": "tuner.verdicts.learning",
    "Verdict": "tuner.verdicts.guard",
    "first_verdict": "tuner.verdicts.guard",
    "judge_learning": "tuner.verdicts.learning",
    "objective": "tuner.verdicts.recommend",
})
