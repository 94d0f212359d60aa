"""The user's inputs and tuner's built-in ones: models (the embedded tiny ones), data, reward functions, and the
probe that checks them before any trial starts.

    models.py     --model: a folder, hub id or alias; the tiny model and tiny-pretrained, built here
    packaged.py   real pretrained models shipped in a Python package (SmolLM2-135M-Instruct), converted once
    data.py       --dataset: the built-in data of a trainer, or the user's, its columns checked
    lengths.py    the token lengths of its rows: the export's max_length, the profile a warm start compares
    tasks.py      exact-answer questions for a pretrained model, and their reward
    sums.py       GRPO's chat sums for a real instruct model, and their reward
    rewards.py    --reward-func: the built-in reward, TRL's, or the user's module:function
    probe.py      the user's rows, tokenizer and rewards tried before any trial starts
    quiet.py      transformers' and datasets' progress bars and load reports kept off stderr

May import: tuner.config, tuner.stores (the cache folder), tuner.errors.
"""

from typing import TYPE_CHECKING

from tuner._exports import lazy_exports

# The same names for type checkers and editors (``X as X``: a public name of this package); at run time each
# is imported when first used.
if TYPE_CHECKING:
    from tuner.inputs._tiny_pretrained import RECORD as RECORD
    from tuner.inputs._tiny_pretrained import start_estimates as start_estimates
    from tuner.inputs.data import builtin_dataset as builtin_dataset
    from tuner.inputs.data import load_dataset_spec as load_dataset_spec
    from tuner.inputs.models import is_tiny as is_tiny
    from tuner.inputs.models import resolve_model as resolve_model
    from tuner.inputs.models import tiny_model_dir as tiny_model_dir
    from tuner.inputs.probe import UserInputs as UserInputs
    from tuner.inputs.probe import check_user_inputs as check_user_inputs
    from tuner.inputs.quiet import quiet_libraries as quiet_libraries
    from tuner.inputs.rewards import resolve_reward_funcs as resolve_reward_funcs
    from tuner.inputs.sums import bare_sum_reward as bare_sum_reward
    from tuner.inputs.tasks import exact_answer_reward as exact_answer_reward

# Each public name and the module it lives in.
__all__, __getattr__ = lazy_exports(__name__, {
    "RECORD": "tuner.inputs._tiny_pretrained",
    "UserInputs": "tuner.inputs.probe",
    "bare_sum_reward": "tuner.inputs.sums",
    "builtin_dataset": "tuner.inputs.data",
    "check_user_inputs": "tuner.inputs.probe",
    "exact_answer_reward": "tuner.inputs.tasks",
    "is_tiny": "tuner.inputs.models",
    "load_dataset_spec": "tuner.inputs.data",
    "quiet_libraries": "tuner.inputs.quiet",
    "resolve_model": "tuner.inputs.models",
    "resolve_reward_funcs": "tuner.inputs.rewards",
    "start_estimates": "tuner.inputs._tiny_pretrained",
    "tiny_model_dir": "tuner.inputs.models",
})
