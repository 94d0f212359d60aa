"""Search spaces: the shipped files, sampling with conditions, the grid, and errors that name file and key."""

from __future__ import annotations

import optuna
import pytest
import yaml
from helpers import USE_PEFT_LINE, VALID_SPACE

from tuner.config.space import check_param_names, load_space, parse_space
from tuner.config.trainers import adapter
from tuner.config.trainers import names as trainer_names
from tuner.errors import TunerError

optuna.logging.set_verbosity(optuna.logging.WARNING)

LORA = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")

# A small space with a condition: 2 precisions x (LoRA off, or LoRA on with 2 ranks) = 6 grid points.
SMALL = {
    "trainer": "reward",
    "fixed": {"max_length": 64},
    "params": {
        "precision": {"type": "categorical", "choices": ["fp32", "bf16-mixed"]},
        "use_peft": {"type": "categorical", "choices": [True, False]},
        "lora_r": {"type": "categorical", "choices": [4, 8], "when": {"use_peft": True}},
        "max_grad_norm": {"type": "fixed", "value": 1.0},
    },
}


def samples(space, sampler, n: int = 24) -> list[dict]:
    """n define-by-run samples; each trial is told a value so TPE gets past its random start-up trials."""
    study = optuna.create_study(sampler=sampler, direction="maximize")
    drawn = []
    for _ in range(n):
        trial = study.ask()
        params = space.suggest(trial)
        drawn.append(params)
        study.tell(trial, float(params.get("learning_rate", 0.0)))
    return drawn


def tpe(seed: int):
    # as in a search: multivariate TPE, with the conditional LoRA params modelled as their own group
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=4, multivariate=True, group=True)


def random_sampler(seed: int):
    return optuna.samplers.RandomSampler(seed=seed)


# -- the shipped spaces ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("trainer", trainer_names())
def test_shipped_space_loads_and_names_only_real_config_fields(trainer):
    space = load_space(None, trainer)
    assert space.trainer == trainer
    assert space.source.endswith(f"search_spaces/{trainer}.yaml")
    # Every name is tuner's own or a field of the trainer's TRL config: nothing the config would reject.
    check_param_names(space, adapter(trainer).config_fields())
    # The shipped spaces search precision, the dimension most failures hang on.
    assert "precision" in space.searched_names()


@pytest.mark.parametrize("make_sampler", [random_sampler, tpe], ids=["random", "tpe"])
@pytest.mark.parametrize("trainer", ["grpo", "reward"])
def test_sampling_respects_conditions_and_bounds(trainer, make_sampler):
    space = load_space(None, trainer)
    drawn = samples(space, make_sampler(0))
    lr = space.params["learning_rate"]
    for params in drawn:
        lora_present = [name for name in LORA if name in params]
        # LoRA settings exist only in trials that use LoRA
        if params["use_peft"]:
            assert set(lora_present) == {n for n in LORA if n in space.params}
        else:
            assert lora_present == []
        assert lr.low <= params["learning_rate"] <= lr.high
        assert params["precision"] in space.params["precision"].choices
        # fixed values ride along with every trial
        assert all(params[name] == value for name, value in space.fixed.items())
    # 24 draws see both sides of the condition
    assert {p["use_peft"] for p in drawn} == {True, False}


@pytest.mark.parametrize("make_sampler", [random_sampler, tpe], ids=["random", "tpe"])
def test_sampling_is_reproducible_for_a_seed(make_sampler):
    space = load_space(None, "grpo")
    first, again = samples(space, make_sampler(7)), samples(space, make_sampler(7))
    assert first == again
    # another seed gives other configs (guards against a sampler that ignores its seed)
    assert samples(space, make_sampler(8)) != first


def test_list_choices_come_back_as_lists():
    # Optuna only stores scalars, so list choices travel as "q_proj,v_proj" and must be turned back.
    space = load_space(None, "grpo")
    targets = {tuple(v) if isinstance(v, list) else v
               for p in samples(space, random_sampler(0), n=40) for k, v in p.items() if k == "lora_target_modules"}
    assert targets == {"all-linear", ("q_proj", "v_proj")}


def test_condition_on_one_of_several_values():
    space = parse_space({"trainer": "sft", "params": {
        "precision": {"type": "categorical", "choices": ["fp32", "bf16-mixed", "fp16-pure"]},
        "max_grad_norm": {"type": "categorical", "choices": [0.3, 1.0], "when": {"precision": ["fp16-pure"]}},
    }}, "x.yaml")
    assert space.active("max_grad_norm", {"precision": "fp16-pure"})
    assert not space.active("max_grad_norm", {"precision": "fp32"})
    assert not space.active("max_grad_norm", {})


# -- the grid ----------------------------------------------------------------------------------------------------


def test_grid_enumerates_every_combination_once_without_inactive_params():
    grid = parse_space(SMALL, "small.yaml").grid()
    expected = [
        {"precision": "fp32", "use_peft": True, "lora_r": 4, "max_grad_norm": 1.0},
        {"precision": "fp32", "use_peft": True, "lora_r": 8, "max_grad_norm": 1.0},
        {"precision": "fp32", "use_peft": False, "max_grad_norm": 1.0},
        {"precision": "bf16-mixed", "use_peft": True, "lora_r": 4, "max_grad_norm": 1.0},
        {"precision": "bf16-mixed", "use_peft": True, "lora_r": 8, "max_grad_norm": 1.0},
        {"precision": "bf16-mixed", "use_peft": False, "max_grad_norm": 1.0},
    ]
    # 2 x (2 + 1) = 6: LoRA off is one point, not one per lora_r
    assert grid == expected


def test_grid_points_are_valid_enqueued_trials():
    # The grid sampler enqueues each point; suggest() must then return exactly that point (plus fixed values).
    space = parse_space(SMALL, "small.yaml")
    study = optuna.create_study(sampler=random_sampler(0))
    for point in space.grid():
        study.enqueue_trial(point)
    for point in space.grid():
        trial = study.ask()
        assert space.suggest(trial) == {**space.fixed, **point}
        study.tell(trial, 0.0)


@pytest.mark.parametrize("kind", ["float", "int"])
def test_grid_on_a_numeric_range_is_an_error(kind):
    raw = {**SMALL, "params": {**SMALL["params"], "learning_rate": {"type": kind, "low": 1, "high": 3}}}
    with pytest.raises(TunerError, match=r"^small\.yaml: params\.learning_rate: the grid sampler needs every param "
                       rf"categorical or fixed, but 'learning_rate' is {kind}; use --sampler tpe or random"):
        parse_space(raw, "small.yaml").grid()


def test_shipped_spaces_are_not_grids():
    # learning_rate is a float range in every shipped space: --sampler grid needs a space of the user's
    with pytest.raises(TunerError, match="grpo.yaml: params.learning_rate: the grid sampler"):
        load_space(None, "grpo").grid()


# -- dropping precisions the hardware cannot run ------------------------------------------------------------------


def test_without_precisions_drops_and_keeps_the_rest():
    space = parse_space(SMALL, "small.yaml")
    kept = space.without_precisions(["bf16-mixed"])
    assert kept.precisions() == ["fp32"]
    assert kept.source == "small.yaml"
    assert space.precisions() == ["fp32", "bf16-mixed"]  # the original is untouched
    assert len(kept.grid()) == 3
    assert space.without_precisions([]) is space


def test_without_precisions_errors_when_nothing_is_left():
    space = parse_space(SMALL, "small.yaml")
    with pytest.raises(TunerError, match=r"^small\.yaml: params\.precision: none of fp32, bf16-mixed can run on this "
                       r"machine \(fp32, bf16-mixed need a GPU\)"):
        space.without_precisions(["fp32", "bf16-mixed"])


def test_without_precisions_on_a_space_without_precision():
    raw = {"trainer": "sft", "params": {"learning_rate": {"type": "float", "low": 1e-4, "high": 1e-2}}}
    space = parse_space(raw, "x.yaml")
    assert space.precisions() == ["fp32"]
    assert space.without_precisions(["fp16-mixed"]) is space


# -- errors name the file and the key path ------------------------------------------------------------------------

BROKEN = [
    ("malformed-yaml", "trainer: grpo\nparams: {a: [1\n", "malformed YAML at line 3, column 1"),
    ("duplicate-key", VALID_SPACE + "  learning_rate: {type: float, low: 0.1, high: 0.2}\n",
     "duplicate key 'learning_rate' at line 9, column 3; keep only one of them"),
    ("not-a-mapping", "- grpo\n", "a search space must be a YAML mapping"),
    ("unknown-top-level-key", VALID_SPACE.replace("fixed:", "fixd:"),
     "fixd: unknown key; remove it or check its spelling (did you mean 'fixed'?)"),
    ("unknown-param-key", VALID_SPACE.replace("low: 1.0e-5", "lowx: 1.0e-5"),
     "params.learning_rate.lowx: unknown key; remove it or check its spelling (did you mean 'low'?)"),
    ("unknown-type", VALID_SPACE.replace("type: float", "type: real"),
     "params.learning_rate: type must be one of float, int, categorical, fixed"),
    ("missing-trainer", VALID_SPACE.replace("trainer: grpo\n", ""), "trainer: required key is missing"),
    ("missing-bound", VALID_SPACE.replace("high: 1.0e-2, ", ""), "params.learning_rate.high: required key is missing"),
    ("wrong-type", VALID_SPACE.replace("low: 1.0e-5", 'low: "abc"'),
     "params.learning_rate.low: Input should be a valid number, unable to parse string as a number (got 'abc')"),
    ("low-above-high", VALID_SPACE.replace("low: 1.0e-5", "low: 0.1"),
     "params.learning_rate: low must not exceed high, but got low=0.1, high=0.01"),
    ("infinite-bound", VALID_SPACE.replace("high: 1.0e-2", "high: .inf"),
     "params.learning_rate: low and high must be finite numbers"),
    ("log-needs-positive-low", VALID_SPACE.replace("low: 1.0e-5", "low: 0"),
     "params.learning_rate: log scale needs low > 0, but got low=0.0"),
    ("int-step", VALID_SPACE + "  per_device_train_batch_size: {type: int, low: 2, high: 8, step: 0}\n",
     "params.per_device_train_batch_size: step must be at least 1, but got step=0"),
    ("empty-choices", VALID_SPACE.replace("choices: [4, 8]", "choices: []"), "params.lora_r.choices: must not be empty"),
    ("choice-not-a-scalar", VALID_SPACE.replace("choices: [4, 8]", "choices: [{r: 4}]"),
     "params.lora_r.choices.0: must be a number, string, true/false, null or a list of strings (got {'r': 4})"),
    ("param-not-a-mapping", VALID_SPACE + "  beta: 0.1\n", "params.beta: must be a mapping of names to values (got 0.1)"),
    ("no-params", "trainer: grpo\nparams: {}\n", "params: must not be empty"),
    ("condition-on-unknown-param", VALID_SPACE.replace("{use_peft: true}", "{use_lora: true}"),
     "params.lora_r.when: condition on unknown parameter 'use_lora'"),
    ("condition-before-dependency", VALID_SPACE.replace(USE_PEFT_LINE, "") + USE_PEFT_LINE,
     "params.lora_r.when: 'use_peft' must be declared before 'lora_r'"),
    ("unknown-trainer", VALID_SPACE.replace("trainer: grpo", "trainer: ppo"),
     "trainer: unknown trainer 'ppo'; choose one of grpo, dpo, kto, reward, sft"),
    ("unknown-precision", VALID_SPACE.replace("bf16-mixed]", "fp8]"), "params.precision: unknown precision 'fp8'"),
    ("fixed-and-searched", VALID_SPACE.replace("max_completion_length: 8", "max_completion_length: 8\n  learning_rate: 0.1"),
     "fixed.learning_rate: also declared under params; keep one"),
]


@pytest.mark.parametrize("text, message", [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_errors_name_the_file_and_key_path(tmp_path, text, message):
    path = tmp_path / "x.yaml"
    path.write_text(text)
    with pytest.raises(TunerError) as error:
        load_space(path)
    assert str(error.value).startswith(f"{path}: {message}")
    assert "\n" not in str(error.value)  # the CLI prints it as one line


def test_trainer_mismatch_names_both(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(VALID_SPACE)
    with pytest.raises(TunerError, match=r"x\.yaml: trainer: the space is for 'grpo' but --trainer is 'dpo'; pass "
                       "--trainer grpo"):
        load_space(path, "dpo")


def test_missing_file(tmp_path):
    with pytest.raises(TunerError, match=r"nope\.yaml: search space file not found"):
        load_space(tmp_path / "nope.yaml")


def test_unknown_trainer_without_a_file():
    with pytest.raises(TunerError, match="unknown trainer 'ppo'"):
        load_space(None, "ppo")


@pytest.mark.parametrize("section, name, suggestion", [
    ("params", "learning_rte", "learning_rate"),
    ("fixed", "max_completion_len", "max_completion_length"),
])
def test_unknown_names_suggest_the_closest_field(section, name, suggestion):
    space = parse_space(yaml.safe_load(VALID_SPACE.replace(suggestion + ":", name + ":")), "x.yaml")
    with pytest.raises(TunerError, match=rf"^x\.yaml: {section}\.{name}: unknown parameter for grpo; did you mean "
                       rf"'{suggestion}'\?$"):
        check_param_names(space, adapter("grpo").config_fields())


def test_pretrained_block_replaces_ranges_only_for_a_pretrained_model():
    space = parse_space({"trainer": "dpo", "params": {
        "learning_rate": {"type": "float", "low": 1e-3, "high": 0.3, "log": True},
        "use_peft": {"type": "categorical", "choices": [True, False]},
        "lora_r": {"type": "categorical", "choices": [4, 8], "when": {"use_peft": True}}},
        "pretrained": {"learning_rate": {"type": "float", "low": 3e-7, "high": 1e-4, "log": True},
                       "lora_r": {"type": "categorical", "choices": [16, 32]}}})
    # The tiny demo model keeps the space as written; a pretrained model gets the replacements.
    assert space.for_model(pretrained=False).params["learning_rate"].low == 1e-3
    real = space.for_model(pretrained=True)
    assert (real.params["learning_rate"].low, real.params["learning_rate"].high) == (3e-7, 1e-4)
    # A replacement keeps the condition of the parameter it replaces.
    assert real.params["lora_r"].choices == [16, 32] and real.params["lora_r"].when == {"use_peft": True}


def test_pretrained_block_must_replace_a_declared_parameter():
    with pytest.raises(TunerError, match=r"pretrained.beta: replaces a parameter that params does not declare"):
        parse_space({"trainer": "dpo", "params": {"learning_rate": {"type": "float", "low": 1e-3, "high": 0.3}},
                     "pretrained": {"beta": {"type": "fixed", "value": 0.1}}})


@pytest.mark.parametrize("trainer", ["grpo", "dpo", "kto", "reward", "sft"])
def test_shipped_spaces_search_below_trls_default_learning_rate_for_a_pretrained_model(trainer):
    import dataclasses

    default = next(f.default for f in dataclasses.fields(adapter(trainer).config_type()) if f.name == "learning_rate")
    learning_rate = load_space(None, trainer).for_model(pretrained=True).params["learning_rate"]
    # TRL's own default sits inside the range, and the range reaches LoRA's ~10x higher rates.
    assert learning_rate.low < default < learning_rate.high and learning_rate.high >= 10 * default
