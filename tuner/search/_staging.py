"""How the search spends its trials: speed knobs first, then learning knobs on the fastest stable system configs.

    stages = Stages.for_space(space, n_trials)
    stages.pinned(finished)    # the params the next trial fixes, or {} (sample everything)

Tokens/s depends on the system config only: precision, batch size, gradient accumulation, LoRA and its rank
and targets, activation checkpointing, lengths (``SPEED_PARAMS``), and GRPO's beta when it may be 0 (no
reference model). The learning rate, clipping, warm-up,
scheduler, LoRA's alpha and dropout and the trainers' own knobs (beta, loss_type, epsilon, ...) decide whether a
trial stays stable and learns, and change tokens/s not at all. One sampler told progress x tokens/s for all of
them spends trials re-measuring the speed of learning-rate changes. So:

- the speed stage (the first ``speed_trials``, 40% of the budget): the system knobs are sampled and the learning
  knobs pinned to safe values (TRL's default where the space allows it, else the middle of the range), so
  nearly every trial is a stable, learning measurement of one system config's speed. Its first trial does not
  sample the knobs whose effect on speed is known in advance (``expected_fastest``): activation checkpointing
  off (it recomputes activations: memory for time), the largest batch and gradient accumulation, the device's
  fast precision (bf16 on a GPU that has it, fp32 on a CPU), GRPO without a reference model (beta 0), and its
  second trial is the same with LoRA flipped (``first_systems``: faster on a large model, slower on a tiny
  one). A space of 100+ system configs and a speed stage of a few trials: a random start rarely lands near
  the fastest; this one starts there, and the sampler measures the rest (LoRA's rank, lengths);
- a warm start's earlier trials on the same model, data and hardware (tuner.search._warm) measured speeds here
  already: with at least MIN_SPEED_TRIALS of them stable (``speed_known``), the search has no speed stage, and
  its learning stage ranks their system configs with its own from its first trial;
- the learning stage (the rest): the system knobs are pinned to the fastest stable system configs measured so
  far (the top ``TOP_SYSTEMS``, taken in turn) and the sampler searches the learning knobs, where they change
  the answer. Successive halving (tuner.search._execution.Halving) stops trials of either stage that fall behind
  (a stopped speed-stage trial's tokens/s still ranks its system config).

Until one speed-stage trial has finished stable, trials sample everything. The grid and random samplers are
not staged: random is the baseline the staging is measured against (bench/).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.config.trainers import Adapter
from tuner.records import Status, TrialRecord

if TYPE_CHECKING:
    from tuner.config.space import Param, SearchSpace

# The knobs that change tokens/s: what a trial computes per step, and how.
SPEED_PARAMS = frozenset({
    "precision", "per_device_train_batch_size", "gradient_accumulation_steps", "activation_checkpointing",
    "gradient_checkpointing", "use_peft", "lora_r", "lora_target_modules", "max_length", "max_prompt_length",
    "max_completion_length", "num_generations", "generation_batch_size", "steps_per_generation", "optim",
    "padding_free", "packing", "torch_compile",
})
SPEED_SHARE = 0.4  # of the trial budget spent in the speed stage
MIN_SPEED_TRIALS = 3
TOP_SYSTEMS = 2  # system configs the learning stage searches on
# tuner's own learning knobs and their defaults (tuner.config.trainers.lora_config_kwargs, TRL's ModelConfig).
TUNER_DEFAULTS = {"lora_alpha": 32, "lora_dropout": 0.05}
STABLE = (Status.OK, Status.PRUNED)  # ran without a failure: its tokens/s is a speed measurement


def is_speed_knob(name: str, param: Param) -> bool:
    """A SPEED_PARAMS knob, or a KL weight ``beta`` that may be 0: GRPO with beta 0 loads and runs no reference
    model (beta > 0 scores every batch with one too), while DPO's and KTO's beta only scale the loss."""
    if name in SPEED_PARAMS:
        return True
    return name == "beta" and 0 in (getattr(param, "choices", None) or [getattr(param, "low", None)])


# The precisions a trial on each device is expected to train fastest in, fastest first. A GPU with bfloat16
# (Ampere and later) runs its matmuls in half precision at several times the fp32 rate, and bf16 weights
# without autocast skip the casts and the fp32 copy; a GPU without it drops bf16 (tuner.search.driver), so fp16 comes
# next. A CPU's half-precision matmuls are emulated or narrow on most CPUs: fp32 is its fast mode.
FAST_PRECISIONS = {
    "cuda": ("bf16-pure", "bf16-mixed", "fp16-mixed", "fp16-pure", "fp32"),
    "cpu": ("fp32", "bf16-mixed", "bf16-pure"),
}
CHECKPOINTING = ("activation_checkpointing", "gradient_checkpointing")


def expected_fastest(space: SearchSpace, device: str) -> dict[str, Any]:
    """The values of the speed knobs whose effect on tokens/s is known before anything runs, for a trial on
    ``device`` ("cuda" or "cpu"): checkpointing off, the largest batch and accumulation, the device's fast
    precision, beta 0 (GRPO: no reference model). Knobs whose effect depends on the model and the machine
    (LoRA: slower on a tiny model, faster on a large one; lengths, which also change the task) are left out:
    the sampler measures them."""
    from tuner.config.space import CategoricalParam, FixedParam, IntParam

    pins: dict[str, Any] = {}
    for name, param in space.params.items():
        if isinstance(param, FixedParam) or not is_speed_knob(name, param):
            continue
        choices = list(param.choices) if isinstance(param, CategoricalParam) else None
        if name in CHECKPOINTING and choices and False in choices:
            pins[name] = False
        elif name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
            # A larger batch keeps the device busier; more accumulation pays the per-step costs (the optimizer
            # step, logging, the guard; GRPO: one generation per accumulated batch) once for more micro-batches.
            sizes = [c for c in choices or [] if isinstance(c, int) and not isinstance(c, bool)]
            pins[name] = max(sizes) if sizes else param.high if isinstance(param, IntParam) else None
        elif name == "precision" and choices:
            pins[name] = next((p for p in FAST_PRECISIONS.get(device, ()) if p in choices), None)
        elif name == "beta" and choices and 0 in choices:
            pins[name] = choices[choices.index(0)]  # the space's own value (0.0 in a YAML list of floats)
    return {n: v for n, v in pins.items() if v is not None}


def first_systems(space: SearchSpace, fastest: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The first speed-stage trials' system pins: ``fastest``, once with LoRA off and once on when the space
    searches ``use_peft``. LoRA is the one speed knob whose direction depends on the model: it skips the frozen
    weights' gradients and optimizer state (faster on a large model) and adds its adapters' matmuls (slower on
    a tiny one). One trial would leave it to a coin flip; the pair measures both sides at the same system."""
    from tuner.config.space import CategoricalParam

    if not fastest:
        return ()
    peft = space.params.get("use_peft")
    if isinstance(peft, CategoricalParam) and {False, True} <= set(peft.choices):
        return ({**fastest, "use_peft": False}, {**fastest, "use_peft": True})
    return (fastest,)


def speed_known(records: Sequence[TrialRecord]) -> bool:
    """Whether earlier trials measured enough speeds to skip a speed stage: at least MIN_SPEED_TRIALS of them ran
    stable with a tokens/s (a warm start's trials on the same model, data and hardware: tuner.search._warm)."""
    return sum(1 for r in records if r.get("status") in STABLE and r.get("tokens_per_second")) >= MIN_SPEED_TRIALS


def _trl_defaults(entry: Adapter) -> dict[str, Any]:
    """TRL's default of every field that has one, a list's too: DPOConfig declares ``loss_type`` (["sigmoid"]) with a
    default_factory, and without it the speed stage pinned the middle choice, ["ipo"] in the shipped DPO space (seen
    on SmolLM2-135M-Instruct, whose DPO searches ran IPO in every first trial)."""
    defaults = {}
    for f in dataclasses.fields(entry.config_type()):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return defaults


def safe_value(name: str, param: Param, default: Any = None) -> Any:
    """The value a learning knob takes while speeds are measured: ``default`` (TRL's) when the space allows
    it, else the middle of the range (geometric for a log range) or the middle choice."""
    from tuner.config.space import CategoricalParam, FixedParam, FloatParam, IntParam

    if isinstance(param, FixedParam):
        return param.value
    if isinstance(param, CategoricalParam):
        if default in param.choices:
            return default
        return param.choices[len(param.choices) // 2]
    low, high = param.low, param.high
    if default is not None and not isinstance(default, bool) and isinstance(default, (int, float)) \
            and low <= default <= high:
        return default
    middle = math.sqrt(low * high) if param.log else (low + high) / 2
    if isinstance(param, IntParam):
        step = param.step or 1
        return int(low + round((middle - low) / step) * step)
    assert isinstance(param, FloatParam)
    return middle


@dataclass(frozen=True)
class Stages:
    speed_trials: int  # the first trials, with the learning knobs pinned
    learning_pins: dict[str, Any]  # learning knob -> its safe value
    speed_names: tuple[str, ...]  # the space's searched speed knobs
    # The first trials' system pins: expected_fastest, with LoRA off then on where the space searches it.
    first_systems: tuple[dict[str, Any], ...] = ()
    # Speeds measured before this search (a warm start's earlier trials on this model, data and hardware): ranked
    # with its own, and with at least MIN_SPEED_TRIALS of them the search has no speed stage of its own.
    known: tuple[TrialRecord, ...] = ()

    @classmethod
    def for_space(cls, space: SearchSpace, n_trials: int, device: str = "cpu", known: Sequence[TrialRecord] = ()
                  ) -> "Stages | None":
        """The staging of ``space`` for a ``n_trials`` search of trials on ``device``; None when one of the two
        sides is empty. ``known``: earlier trials whose speeds count as measured here (``speed_known``)."""
        from tuner.config.space import FixedParam

        searched = {n: p for n, p in space.params.items() if not isinstance(p, FixedParam)}
        speed = tuple(n for n, p in searched.items() if is_speed_knob(n, p))
        learning = {n: p for n, p in searched.items() if n not in speed}
        if not speed or not learning or n_trials < MIN_SPEED_TRIALS + 1:
            return None
        defaults = {**_trl_defaults(space.entry), **TUNER_DEFAULTS}
        pins = {n: safe_value(n, p, defaults.get(n)) for n, p in learning.items()}
        if speed_known(known):  # the earlier search measured the speeds here: every trial searches learning knobs
            return cls(0, pins, speed, (), tuple(known))
        return cls(max(MIN_SPEED_TRIALS, round(SPEED_SHARE * n_trials)), pins, speed,
                   first_systems(space, expected_fastest(space, device)))

    def stage(self, asked: int) -> str:
        """"speed" or "learning": the stage of the ``asked``-th trial (0-based) of the search."""
        return "speed" if asked < self.speed_trials else "learning"

    def starts_here(self, asked: int) -> bool:
        """Whether the ``asked``-th trial is one of the first ones, which run the expected-fastest system config."""
        return asked < len(self.first_systems)

    def systems(self, finished: Sequence[TrialRecord]) -> list[dict[str, Any]]:
        """The fastest stable system configs measured so far (speed knobs only), fastest first, each once."""
        ranked = sorted((r for r in [*self.known, *finished] if r.get("status") in STABLE and r.get("tokens_per_second")),
                        key=lambda r: -(r.get("tokens_per_second") or 0.0))
        seen, systems = set(), []
        for record in ranked:
            system = {n: record["params"][n] for n in self.speed_names if n in record["params"]}
            key = repr(sorted(system.items()))
            if key not in seen:
                seen.add(key)
                systems.append(system)
        return systems[:TOP_SYSTEMS]

    def pinned(self, asked: int, finished: Sequence[TrialRecord]) -> tuple[str, dict[str, Any]]:
        """(stage, the params the ``asked``-th trial fixes); ({}: sample everything)."""
        if self.stage(asked) == "speed":
            return "speed", {**self.learning_pins, **(self.first_systems[asked] if self.starts_here(asked) else {})}
        systems = self.systems(finished)
        if not systems:
            return "learning", {}  # no speed measured yet: nothing to build on
        return "learning", systems[(asked - self.speed_trials) % len(systems)]
