"""The user's inputs and tuner's built-in ones: models (the embedded tiny ones), data, reward functions, and the
probe that checks them before any trial starts.

    models.py     --model: a folder, hub id or alias; the tiny model and tiny-pretrained, built here
    data.py       --dataset: the built-in data of a trainer, or the user's, its columns checked
    tasks.py      exact-answer questions for a pretrained model, and their reward
    rewards.py    --reward-func: the built-in reward, TRL's, or the user's module:function
    probe.py      the user's rows, tokenizer and rewards tried before any trial starts
    quiet.py      transformers' and datasets' progress bars and load reports kept off stderr

May import: tuner.config, tuner.stores (the cache folder), tuner.errors.
"""

from tuner._exports import lazy_exports

# Each public name and the module it lives in.
__all__, __getattr__ = lazy_exports(__name__, {
    "UserInputs": "tuner.inputs.probe",
    "builtin_dataset": "tuner.inputs.data",
    "check_user_inputs": "tuner.inputs.probe",
    "exact_answer_reward": "tuner.inputs.tasks",
    "is_tiny": "tuner.inputs.models",
    "load_dataset_spec": "tuner.inputs.data",
    "quiet_libraries": "tuner.inputs.quiet",
    "resolve_model": "tuner.inputs.models",
    "resolve_reward_funcs": "tuner.inputs.rewards",
    "tiny_model_dir": "tuner.inputs.models",
})
