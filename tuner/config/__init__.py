"""What the user writes and tuner's tables: the search's options, search spaces, typed parameter values, the
trainer table and the precision modes.

    options.py    SearchOptions: every ``tuner search`` flag, its default, help and rule
    space.py      SearchSpace: a space YAML validated, sampled and gridded
    values.py     every value a user writes, typed against its TRL config field
    trainers.py   the trainer table: one Adapter per TRL trainer
    precision.py  the precision table: one row per mode

May import: tuner.errors, tuner.records. Imported by every other subsystem.
"""

import importlib

# Each public name and the module it lives in, imported when first asked for: ``import tuner.config`` stays cheap
# (``tuner --help`` answers without pydantic, Ray or torch).
_HOMES = {
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
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
