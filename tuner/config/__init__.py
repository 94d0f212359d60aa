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

from tuner._exports import lazy_exports

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
