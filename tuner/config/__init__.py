"""What the user writes and tuner's tables: the search's options, search spaces, typed parameter values, the
trainer table and the precision modes.

    options.py    SearchOptions: every ``tuner search`` flag, its default, help and rule
    space.py      SearchSpace: a space YAML validated, sampled and gridded
    user_yaml.py  every YAML file a user writes, read (2e-4 a number, a key twice an error) and validated
    values.py     every value a user writes, typed against its TRL config field
    trainers.py   the trainer table: one Adapter per TRL trainer
    precision.py  the precision table: one row per mode

May import: tuner.errors, tuner.records. Imported by every other subsystem.
"""

from typing import TYPE_CHECKING

from tuner._exports import lazy_exports

# The same names for type checkers and editors (``X as X``: a public name of this package); at run time each
# is imported when first used.
if TYPE_CHECKING:
    from tuner.config.options import SearchOptions as SearchOptions
    from tuner.config.options import check_options as check_options
    from tuner.config.precision import PRECISIONS as PRECISIONS
    from tuner.config.precision import Precision as Precision
    from tuner.config.space import SearchSpace as SearchSpace
    from tuner.config.space import load_space as load_space
    from tuner.config.trainers import ADAPTERS as ADAPTERS
    from tuner.config.trainers import DEFAULT_TRAINER as DEFAULT_TRAINER
    from tuner.config.trainers import Adapter as Adapter
    from tuner.config.trainers import adapter as adapter
    from tuner.config.values import check_params as check_params

# Each public name and the module it lives in.
__all__, __getattr__ = lazy_exports(__name__, {
    "ADAPTERS": "tuner.config.trainers",
    "Adapter": "tuner.config.trainers",
    "DEFAULT_TRAINER": "tuner.config.trainers",
    "PRECISIONS": "tuner.config.precision",
    "Precision": "tuner.config.precision",
    "SearchOptions": "tuner.config.options",
    "SearchSpace": "tuner.config.space",
    "adapter": "tuner.config.trainers",
    "check_options": "tuner.config.options",
    "check_params": "tuner.config.values",
    "load_space": "tuner.config.space",
})
