"""tuner.inputs' built-in data and rewards for a model other than the tiny one, told apart on copies of the tiny model
built for real (the rest of tuner.inputs.data and rewards, which needs no model, is tests/unit/inputs/test_data.py)."""

from tuner.config.trainers import adapter


def test_a_real_model_gets_the_chat_sums_and_tiny_pretrained_the_exact_answer_reward(tiny_model, tmp_path):
    """A copy of the tiny model without its build marker stands for any other local model (a real one); with the tiny
    pretrained model's marker, for that one."""
    import shutil

    from tuner.inputs import models, probe

    other = tmp_path / "other-model"
    shutil.copytree(tiny_model, other, ignore=shutil.ignore_patterns("tuner-tiny-model.complete"))
    assert models.is_tiny(tiny_model) and models.is_tiny("tiny") and not models.is_tiny(other)
    inputs = probe.check_user_inputs(adapter("grpo"), str(other), None, None, missing_reward="unused")
    assert inputs.reward_funcs == ["tuner.inputs.sums.bare_sum_reward"]
    pretrained = tmp_path / "tiny-pretrained-like"
    shutil.copytree(other, pretrained)
    (pretrained / "tuner-tiny-pretrained.complete").write_text("test\n")
    inputs = probe.check_user_inputs(adapter("grpo"), str(pretrained), None, None, missing_reward="unused")
    # tuner's own pretrained tiny model keeps the questions its ranges and figures were measured on
    assert inputs.reward_funcs == ["tuner.inputs.tasks.exact_answer_reward"]
    assert probe.check_user_inputs(adapter("grpo"), "tiny", None, None, missing_reward="unused").reward_funcs is None
