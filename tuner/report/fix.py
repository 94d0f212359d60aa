"""The answer to a ``tuner search --from my.yaml``: what became of their config, what to change, and why.

    fix = answer(source, records, best)          # source: tuner.config.trl_config.SourceConfig; records: the trials
    fix.trial0         # "your config diverged at step 4: grad_norm is nan ... (fp16 weights)"
    fix.changes        # [Change(param="precision", key="fp16", old=True, new=False, evidence="fp16-pure diverged ...")]
    fix.text           # their file with those values replaced (new keys appended), every other line as written
    diff_lines(fix)    # "fp16: true -> false    (fp16-pure diverged in 3 of 3 trials at steps 2-4; fp32 was ok in 4 of 4)"
    fix.to_dict()      # what search.json keeps (MLflow); Fix.from_dict(search["fix"]) reads it back, old stores too

Trial 0 of such a search is their config as written. When it was stable and learned, the answer says so and
changes only the speed knobs (tuner.config.trl_config.SPEED_KNOBS) of a trial measured at least SPEEDUP times
faster, in the search and again in every pair of runs side by side with theirs (tuner.search._remeasure);
otherwise the answer is the recommended trial, written as the fewest keys that differ from their file,
each tied to the trials that point to it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from tuner.config import precision as precisions
from tuner.config import trl_config
from tuner.config.trl_config import SourceConfig
from tuner.records import Status, TrialRecord, is_ok

__all__ = ["PAIRS", "SPEEDUP", "Change", "Fix", "answer", "cause_of", "diff_lines", "edit_text", "load_text", "pair_ratios",
           "export_line", "render_fix", "speed_candidate", "speed_of", "trial0_line"]

SPEEDUP = 1.2  # a healthy config is changed for speed only when a trial ran at least this much faster
PAIRS = 2  # ... and again in each of this many pairs of runs side by side with theirs (tuner.search._remeasure)


@dataclass
class Change:
    """One key of their file changed: the search param it stands for, the file's key, its old and new value, and
    the trials that point to the new one."""

    param: str
    key: str
    old: Any
    new: Any
    evidence: str


@dataclass
class Fix:
    """The answer to a --from search, as ``tuner search`` prints it and ``tuner export`` writes it."""

    source: str  # their file, as given to --from
    trial0: str  # what became of their config as written (trial 0)
    healthy: bool  # trial 0 stayed ok and learned
    summary: str = ""  # the answer in one line
    exportable: bool = False  # there is a file to export: theirs as it is (healthy) or with the changes
    changes: list[Change] = field(default_factory=list)
    from_trial: int | None = None  # the trial the changes come from
    notes: list[str] = field(default_factory=list)  # what reading their file noticed (trl_config.SourceConfig)
    inputs: list[str] = field(default_factory=list)  # the model and data the trials ran on, where not theirs
    horizon: str = ""  # what the verdict covers (tuner.verdicts.recommend.horizon): steps, seeds
    text: str | None = None  # their file with the changes, every other line as written; None: nothing to export

    def to_dict(self) -> dict[str, Any]:
        """search.json's ``fix`` (MLflow)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fix:
        """A search.json's ``fix``; one written before a field existed gets its default."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["changes"] = [Change(**c) for c in values.get("changes") or []]
        values["notes"], values["inputs"] = list(values.get("notes") or []), list(values.get("inputs") or [])
        values["horizon"] = values.get("horizon") or ""
        values.setdefault("source", "")
        values.setdefault("trial0", "")
        values.setdefault("healthy", False)
        return cls(**values)


def _precision_words(name: str) -> str:
    row = precisions.precision(name)
    if row.autocast_dtype is None:
        return "fp32" if row.weight_dtype == "float32" else f"{_short(row.weight_dtype)} weights"
    return f"{_short(row.autocast_dtype)} mixed precision"


def _short(dtype: str) -> str:
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype)


def cause_of(record: TrialRecord, params: dict[str, Any]) -> str:
    """What in their config the verdict points to, in their terms ("fp16 weights", "temperature 0.05", ...)."""
    signal = record.get("guard_signal") or ""
    precision = params.get("precision", precisions.DEFAULT)
    half = precision != "fp32"
    lr = params.get("learning_rate")
    if record.get("status") == Status.DIVERGED:
        parts = [_precision_words(precision)] if half else []
        if signal in ("loss_explosion", "grad_explosion") or not half:
            parts.append(f"learning rate {lr:g}" if lr is not None else "the learning rate")
        accumulation = params.get("gradient_accumulation_steps") or 1
        if accumulation >= 16:
            parts.append(f"gradient accumulation {accumulation}")
        return ", ".join(parts)
    if record.get("status") == Status.CRASHED:
        return _precision_words(precision) if half else ""
    if signal == "zero_reward_std":
        temperature = params.get("temperature")
        return (f"temperature {temperature:g}: every completion of a group is the same" if temperature is not None
                and temperature < 0.5 else "no reward spread within a group")
    if signal == "no_update":
        return _precision_words(precision) if half else "LoRA targets" if params.get("use_peft") else "no update"
    if signal == "zero_grad":
        return "LoRA targets" if params.get("use_peft") else "no gradient"
    return ""


def trial0_line(record: TrialRecord | None, params: dict[str, Any], online: bool = False) -> str:
    """Trial 0's verdict in the user's terms."""
    if record is None:
        return "your config was not run (the search stopped before trial 0 finished)"
    status = record.get("status")
    if status == Status.OK:
        how = (f"{record.get('steps_run') or record.get('max_steps')} steps, progress {record.get('progress') or 0:+.3f}, "
               f"{record.get('tokens_per_second') or 0:.0f} tokens/s")
        if record.get("learned"):
            return f"your config is already stable and learning ({how})"
        p = record.get("progress_p_value")
        line = f"your config ran stable but did not learn ({how}{f', p = {p:.2g}' if p is not None else ''})"
        if params.get("learning_rate") is not None:
            line += f": learning rate {params['learning_rate']:g}{' with LoRA' if params.get('use_peft') else ''}"
        if online:  # GRPO: learns from its reward functions, and its loss is 0 by construction at the start
            line += ("; a GRPO loss of 0 is normal (advantages sum to zero within a group): the reward is what "
                     "did not rise")
        return line
    reason = re.sub(r" at step \d+", "", record.get("reason") or "")
    step = record.get("stopped_at_step")
    at = f" at step {step}" if step else ""
    cause = cause_of(record, params)
    return f"your config {status}{at}: {reason}" + (f" ({cause})" if cause else "")


# -- evidence --------------------------------------------------------------------------------------------------


def _tally(records: list[TrialRecord], label: str) -> str:
    """"fp16-pure diverged in 3 of 3 trials at steps 2-4" / "fp32 was ok in 4 of 4 (learned in 3)" / mixed:
    "learning_rate 0.3: diverged in 1 of 2 trials at step 3, ok in 1 (learned in 0)"."""
    n = len(records)
    if n == 0:
        return f"{label}: no trial"
    failed = [r for r in records if not is_ok(r) and r.get("status") != Status.PRUNED]
    ok = [r for r in records if is_ok(r)]
    learned = sum(1 for r in ok if r.get("learned"))
    if not failed:
        return f"{label} was ok in {len(ok)} of {n} (learned in {learned})"
    statuses = "/".join(sorted({str(r["status"]) for r in failed}))
    steps = sorted(r.get("stopped_at_step") or 0 for r in failed)
    at = ""
    if steps and steps[-1]:
        at = f" at step {steps[0]}" if steps[0] == steps[-1] else f" at steps {steps[0]}-{steps[-1]}"
    text = f"{statuses} in {len(failed)} of {n} trial{'s' if n > 1 else ''}{at}"
    if len(failed) == n:
        return f"{label} {text}"
    pruned = n - len(failed) - len(ok)
    return (f"{label}: {text}, ok in {len(ok)} (learned in {learned})"
            + (f", pruned in {pruned}" if pruned else ""))


def _near(value: Any, other: Any) -> bool:
    if isinstance(value, float) or isinstance(other, float):
        try:
            a, b = float(value), float(other)
        except (TypeError, ValueError):
            return False
        if a == b:
            return True
        if a <= 0 or b <= 0:
            return False
        return abs(math.log(a / b)) <= math.log(1.6)  # within a factor of 1.6: the same neighbourhood
    return value == other


def evidence(name: str, old: Any, new: Any, records: list[TrialRecord]) -> str:
    """The trials behind changing ``name`` from ``old`` to ``new``: how those near each value ended."""
    mine = [r for r in records if _near(r["params"].get(name), old)]
    theirs = [r for r in records if _near(r["params"].get(name), new)]
    return f"{_tally(mine, _shown_param(name, old))}; {_tally(theirs, _shown_param(name, new))}"


def _shown_param(name: str, value: Any) -> str:
    if name == "precision":
        return str(value)
    return f"{name} {_scalar(value)}"


def _scalar(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return yaml.safe_dump(value).split("\n")[0]
    if isinstance(value, float):
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        if e and "." not in mantissa:  # 2e-06 would read back as a string in YAML 1.1: write 2.0e-06
            text = f"{mantissa}.0e{exponent}"
        return text
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    return str(value)


# -- the answer ------------------------------------------------------------------------------------------------


def _changed(source: SourceConfig, params: dict[str, Any],
             keys: Sequence[str] | None = None) -> list[tuple[str, str, Any, Any]]:
    """(param, TRL key, their value, new value) for each TRL key the params set differently from their file."""
    entry = source.entry
    mine = trl_config.trl_values(entry, {k: v for k, v in source.params.items()})
    mine.update(_theirs_precision(source))
    out = []
    for name, value in params.items():
        if keys is not None and name not in keys:
            continue
        if name not in source.params and name not in source.effective:
            continue
        if name == "precision":
            if value == source.params.get("precision"):
                continue
            for key, new in trl_config.trl_values(entry, {"precision": value}).items():
                old = mine.get(key)
                if old != new:
                    out.append((name, key, old, new))
            continue
        old = source.params.get(name, source.effective.get(name))
        if isinstance(old, str) and isinstance(value, list) and [old] == value:
            continue
        if old != value and not (isinstance(old, (int, float)) and isinstance(value, (int, float))
                                 and math.isclose(float(old), float(value), rel_tol=1e-9)):
            out.append((name, name, old, value))
    return out


def _theirs_precision(source: SourceConfig) -> dict[str, Any]:
    """dtype, bf16 and fp16 as their file has them (TRL's reading: bf16 left out is on)."""
    effective = source.effective
    dtype = source.raw.get("dtype", source.raw.get("torch_dtype"))
    return {"dtype": dtype if dtype is not None else precisions.precision(source.params["precision"]).weight_dtype,
            "bf16": bool(effective.get("bf16")), "fp16": bool(effective.get("fp16"))}


def changes_count(source: SourceConfig, params: dict[str, Any]) -> int:
    """How many of tuner's params differ from their config (precision is one; the accumulation follows the batch)."""
    return len({name for name, *_ in _changed(source, params) if name != "gradient_accumulation_steps"})


def smallest_fix(source: SourceConfig, records: list[TrialRecord],
                 confirmations: Sequence[TrialRecord] = ()) -> TrialRecord | None:
    """The trial that stayed ok and learned with the fewest changes to their config (then the fastest learner);
    a trial that went unstable or stopped learning on a confirmation seed is not one."""
    from tuner.verdicts import recommend

    failed = {c.get("confirms") for c in confirmations if not is_ok(c) or not c.get("learned")}
    good = [r for r in records if recommend.objective(r) > 0 and r.get("number") not in failed
            and r.get("number") != 0]
    if not good:
        return None
    return min(good, key=lambda r: (changes_count(source, r["params"]), -recommend.objective(r)))


def speed_candidate(first: TrialRecord | None, records: list[TrialRecord]) -> TrialRecord | None:
    """The fastest trial that stayed ok and learned at least SPEEDUP times trial 0's tokens/s, when trial 0 itself
    stayed ok and learned; None otherwise."""
    if first is None or not is_ok(first) or not first.get("learned") or not speed_of(first):
        return None
    fast = [r for r in records if is_ok(r) and r.get("learned") and r is not first
            and speed_of(r) >= SPEEDUP * speed_of(first)]
    return max(fast, key=speed_of) if fast else None


def speed_of(record: TrialRecord) -> float:
    """Its tokens/s; 0 when it measured none."""
    return record.get("tokens_per_second") or 0.0


def pair_ratios(number: int, remeasures: Sequence[TrialRecord]) -> list[float | None]:
    """Per pair of speed re-runs (tuner.search._remeasure): trial ``number``'s tokens/s over trial 0's, None where
    either run was not ok or measured no speed."""
    pairs: dict[int, dict[int, TrialRecord]] = {}
    for run in remeasures:
        pairs.setdefault(run.get("pair", 0), {})[run["remeasures"]] = run
    ratios = []
    for _, runs in sorted(pairs.items()):
        theirs, ours = runs.get(0), runs.get(number)
        ok = (theirs is not None and ours is not None and is_ok(theirs) and is_ok(ours) and speed_of(theirs) > 0
              and speed_of(ours) > 0)
        ratios.append(speed_of(ours) / speed_of(theirs) if ok and ours is not None and theirs is not None else None)

    return ratios


def answer(source: SourceConfig, records: list[TrialRecord], best: TrialRecord | None,
           confirmations: Sequence[TrialRecord] = (), remeasures: Sequence[TrialRecord] = ()) -> Fix:
    """What to change in their file and why (see the module docstring)."""
    first = next((r for r in records if r.get("number") == 0), None)
    healthy = first is not None and is_ok(first) and bool(first.get("learned"))
    base = speed_of(first) if first is not None else 0.0  # trial 0's tokens/s: > 0 wherever a faster trial is found
    fix = Fix(source.path, trial0_line(first, source.params, source.entry.uses_reward_funcs), healthy,
              notes=list(source.notes))
    chosen = None
    keys = None
    unconfirmed = ""
    if healthy:
        faster = speed_candidate(first, records)
        ratios = pair_ratios(faster["number"], remeasures) if faster else []
        if faster and len(ratios) >= PAIRS and all(r is not None and r >= SPEEDUP for r in ratios):
            chosen, keys = faster, trl_config.SPEED_KNOBS
        elif faster:
            said = ", ".join("not measured" if r is None else f"{r:.2f}x" for r in ratios) or "not run"
            looked = speed_of(faster) / base
            unconfirmed = (f"; trial {faster['number']} looked {looked:.1f}x as fast, but not again side by side "
                           f"with yours ({said})")
    else:
        chosen = smallest_fix(source, records, confirmations) or best
    if chosen is not None:
        fix.from_trial = chosen.get("number")
        for name, key, old, new in _changed(source, chosen["params"], keys):
            if healthy:
                why = (f"trial {chosen['number']} ran at {speed_of(chosen):.0f} tokens/s, "
                       f"{speed_of(chosen) / base:.1f}x your config's "
                       f"{base:.0f}, and stayed ok and learning; side by side with yours "
                       f"again: {', '.join(f'{r:.2f}x' for r in ratios)}")
            else:
                why = evidence(name, source.params.get(name, source.effective.get(name)), chosen["params"][name],
                               records)
            fix.changes.append(Change(name, key, old, new, why))
    if healthy and not fix.changes:
        fix.summary = ("already stable: your config stayed ok and learned; no trial was measurably faster "
                       f"(at least {SPEEDUP:g}x its tokens/s) while ok and learning{unconfirmed}: nothing to change")
    elif healthy:
        fix.summary = "already stable: your config stayed ok and learned; changed only what ran measurably faster"
    elif chosen is not None:
        params = list(dict.fromkeys(c.param for c in fix.changes))
        fix.summary = f"change {', '.join(params) or 'nothing'} (trial {chosen['number']})"
    else:
        fix.summary = "no change found that is stable and learning: nothing to export"
    fix.exportable = healthy or chosen is not None
    shown = chosen if chosen is not None else first  # what the export stands on: not None when exportable
    if fix.exportable and shown is not None:
        from tuner.verdicts import recommend

        fix.horizon = recommend.horizon(shown, "THIS_FILE")
    fix.text = edit_text(source.text, source.raw, {c.key: c.new for c in fix.changes}) if fix.exportable else None
    return fix


def edit_text(text: str, raw: dict[str, Any], new: dict[str, Any]) -> str:
    """``text`` with each top-level key of ``new`` given its new value on its own line (a trailing comment kept),
    and keys the file lacks appended at the end: every other line as the user wrote it."""
    lines = text.splitlines()
    done = set()
    out: list[str] = []
    skipping = False
    for line in lines:
        if skipping:
            if line.startswith((" ", "\t", "-")) and line.strip():
                continue  # the old block value of a replaced key
            skipping = False
        found = re.match(r"^([A-Za-z_][\w.-]*)\s*:(.*)$", line)
        if found and found.group(1) in new and found.group(1) not in done:
            key, rest = found.group(1), found.group(2)
            comment = re.search(r"\s+#.*$", rest) if not rest.strip().startswith(("'", '"')) else None
            out.append(f"{key}: {_scalar(new[key])}" + (comment.group(0) if comment else ""))
            done.add(key)
            skipping = not rest.split("#")[0].strip()  # a block value follows on the next lines
            continue
        out.append(line)
    appended = [f"{key}: {_scalar(value)}" for key, value in new.items() if key not in done]
    if appended:
        out += ["# added by tuner:", *appended]
    return "\n".join(out) + "\n"


def diff_lines(fix: Fix) -> list[str]:
    """The printed answer: trial 0's verdict, the summary, and one line per change with its evidence."""
    lines = [fix.trial0, fix.summary]
    for change in fix.changes:
        lines.append(f"  {change.key}: {_scalar(change.old)} -> {_scalar(change.new)}    ({change.evidence})")
    lines += [f"  note: {note}" for note in fix.notes]
    lines += [f"  trials ran on {line}" for line in fix.inputs]
    if fix.horizon:
        lines.append(fix.horizon)
    return lines


def export_line(fix: Fix, path: str, run_id: str) -> str:
    """What ``tuner export`` says it wrote for a --from search: their file as it is, or with which changes."""
    if fix.healthy and not fix.changes:
        return f"wrote {path}: nothing to change: your config as written, with the evidence (run {run_id})"
    keys = ", ".join(dict.fromkeys(c.key for c in fix.changes))
    return f"wrote {path}: your config with {keys} changed (trial {fix.from_trial} of run {run_id})"


def load_text(text: str) -> dict[str, Any]:
    """The edited file as a mapping (what search.json keeps as the exported config)."""
    from tuner.config.user_yaml import load_yaml

    return dict(load_yaml(text))


def render_fix(fix: Fix, experiment: str, run_id: str) -> str:
    """Their file with the fewest changes, a comment on top saying what changed and why."""
    head = [f"tuner search --from {fix.source}: experiment {experiment}, run {run_id}", *diff_lines(fix)]
    return "".join(f"# {line.strip()}\n" for line in head) + (fix.text or "")
