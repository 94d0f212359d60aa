"""Pure judgement over numbers: a trial's rows in, a verdict out. Tested on recorded rows.

    guard.py      the first step a trial broke (non-finite, exploded, collapsed), or none
    learning.py   did it learn, how far and how early, from where it started (effect and test)
    diagnose.py   failures that do not depend on the config: the user's to fix
    recommend.py  the rule that picks the recommended config, and its TRL config

May import: tuner.config, tuner.errors, tuner.records.
"""

from typing import TYPE_CHECKING

from tuner._exports import lazy_exports

# The same names for type checkers and editors (``X as X``: a public name of this package); at run time each
# is imported when first used.
if TYPE_CHECKING:
    from tuner.verdicts.guard import Guard as Guard
    from tuner.verdicts.guard import GuardSettings as GuardSettings
    from tuner.verdicts.guard import Verdict as Verdict
    from tuner.verdicts.guard import first_verdict as first_verdict
    from tuner.verdicts.learning import Learning as Learning
    from tuner.verdicts.learning import judge_learning as judge_learning
    from tuner.verdicts.recommend import objective as objective

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
