"""Could any fit of a 20-step trial's signals forecast late failure better than the rules? Judged as the rules are.

    python -m bench.horizon.horizon_fit bench/recorded/horizon-seed*.json.gz bench/recorded/horizon-pretrained-seed*.json.gz

The forecast's rules (tuner/verdicts/forecast.py) were written by hand, one per signal, and on held-out sets they
stay under the issue's 0.8 for recall or precision (bench/RESULTS.md, "Stable for how long"). This asks whether the
signals hold more than the rules read: two classifiers are fitted on the recorded short histories of every other
set (both models), with the long run's outcome as the label, and judged on each held-out set in turn (leave one set
out), beside today's rules on the same runs:

- a logistic regression (balanced classes), the linear boundary a rule with thresholds approximates;
- gradient-boosted trees (depth 2), which can combine signals as no single-signal rule does; their subsampling draws
  vary with the seed, so they are fitted with 5 seeds and reported as the range.

Each one's decision threshold is the one that maximizes F1 on its own training sets, never on the set it judges. The
features (``features``) are read off the short run alone, its params and its per-step rows as a trial records
them: the trainer, the precision, LoRA or not, the float16 share of the trainable weights, learned at the trial
length, the schedule, the log learning rate, and per signal its level and its growth over the trial (the loss's
largest spike over its median and its last over its first, the grad norm's largest and last over its first and
median, the headroom's largest and its growth, the weight norm's growth, the update ratio and the share of updates
lost). Only sets drawn over the whole spaces on a CPU are used (a GPU's or a precision-only draw is pooled apart by
bench.horizon.horizon too). Nothing is re-run: it reads the recorded sets.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

from bench.horizon.horizon import (  # noqa: E402
    FAILED,
    TRAINERS,
    _by_model,
    _ratio,
    _risks,
    classify,
    load,
    with_fp16_share,
)

PRECISIONS = ("fp32", "bf16-mixed", "bf16-pure", "fp16-pure", "fp16-mixed")
FLOOR = 1e-30  # log10 of a zero or a missing reading


def _log(value: float) -> float:
    return math.log10(max(abs(value), FLOOR))


def _readings(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [row[key] for row in rows if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])]


def features(run: dict[str, Any]) -> list[float]:
    """One recorded run's short trial as numbers: its params and its per-step rows, nothing of its long run."""
    params, short = run["params"], run["short"]
    rows = with_fp16_share(short["history"], params)
    loss, grad, head, norm = (_readings(rows, k) for k in ("loss", "grad_norm", "headroom", "weight_norm"))
    ratio, lost, fp16 = (_readings(rows, k) for k in ("update_ratio", "update_lost", "weights_fp16"))
    schedule = params.get("lr_scheduler_type", "linear")
    scale = statistics.median(abs(x) for x in loss) if loss else 1.0
    return [
        *(float(run["trainer"] == name) for name in TRAINERS),
        *(float(params.get("precision", "fp32") == name) for name in PRECISIONS),
        float(bool(params.get("use_peft"))), max(fp16, default=0.0), float(bool(short.get("learned"))),
        float(schedule == "constant"), float(schedule == "cosine"), _log(params.get("learning_rate", 1e-4)),
        _log(max(abs(x) for x in loss) / max(scale, FLOOR)) if loss else 0.0,
        _log(loss[-1] / loss[0]) if loss and loss[0] else 0.0,
        _log(max(grad) / grad[0]) if grad and grad[0] else 0.0,
        _log(grad[-1] / statistics.median(grad)) if grad and statistics.median(grad) else 0.0,
        _log(max(head)) if head else _log(0.0),
        _log(head[-1] / head[0]) if head and head[0] else 0.0,
        _log(norm[-1] / norm[0]) if norm and norm[0] else 0.0,
        _log(statistics.median(ratio)) if ratio else _log(0.0),
        statistics.median(lost) if lost else 0.0,
    ]


def labelled(data: dict[str, Any]) -> tuple[list[list[float]], list[int], list[int]]:
    """A recorded set's runs ok at the trial length that have a long run: features, failed in the long run (1) or
    held (0), and flagged by today's rules (1) or not."""
    x, y, flagged = [], [], []
    for run in data["runs"]:
        if run["long"] is None or run["short"]["status"] != "ok":
            continue
        x.append(features(run))
        y.append(int(classify(run["short"], run["long"]) in FAILED))
        flagged.append(int(bool(_risks(run))))
    return x, y, flagged


def counts(truth: list[int], said: list[int]) -> dict[str, Any]:
    tp = sum(1 for t, s in zip(truth, said) if t and s)
    failures, flags = sum(truth), sum(said)
    return {"failures": failures, "flags": flags, "true": tp, "recall": tp / failures if failures else None,
            "precision": tp / flags if flags else None}


SEEDS = range(5)  # the boosted trees' seeds: the figures' range over them is reported


def _model(kind: str, seed: int = 0):
    from sklearn.ensemble import GradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression

    if kind == "logistic":
        return LogisticRegression(C=0.3, max_iter=5000, class_weight="balanced")
    return GradientBoostingClassifier(n_estimators=150, max_depth=2, learning_rate=0.05, subsample=0.8,
                                      random_state=seed)


def _threshold(truth: list[int], scores: list[float]) -> float:
    """The score threshold with the highest F1 on these (training) runs."""
    best, chosen = -1.0, 0.5
    for step in range(1, 20):
        threshold = step / 20
        c = counts(truth, [int(s >= threshold) for s in scores])
        f1 = 2 * c["true"] / (c["failures"] + c["flags"]) if c["failures"] + c["flags"] else 0.0
        if f1 > best:
            best, chosen = f1, threshold
    return chosen


def leave_one_set_out(sets: list[tuple[str, Any]], judged: list[str], kind: str, seed: int = 0) -> list[int]:
    """The flags a classifier of ``kind`` fitted on every set but one gives that one, for each set named in
    ``judged`` in turn, concatenated in that order. ``sets``: (name, labelled(data)) pairs."""
    said: list[int] = []
    for name in judged:
        train = [s for other, s in sets if other != name]
        x = [row for s in train for row in s[0]]
        y = [label for s in train for label in s[1]]
        model = _model(kind, seed).fit(x, y)
        threshold = _threshold(y, list(model.predict_proba(x)[:, 1]))
        (test,) = [s for other, s in sets if other == name]
        said += [int(p >= threshold) for p in model.predict_proba(test[0])[:, 1]]
    return said


def _whole_spaces(loaded: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """bench.horizon.horizon's groups of sets drawn over the whole spaces on a CPU (a GPU's or a precision-only draw left
    out), each group's sets in a fixed order (the fits' data order)."""
    loaded = sorted(loaded, key=lambda data: (data["model"], data.get("config_seed") or 0))
    return [(name, sets) for name, sets in _by_model(loaded) if "GPU" not in name and "drawn only" not in name]


def _key(data: dict[str, Any]) -> str:
    return f"{data['model']}:{data.get('config_seed')}"


def judge(loaded: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model (sets over the whole spaces on a CPU), on its held-out sets: today's rules, the logistic regression,
    and the boosted trees once per seed in SEEDS (a list)."""
    groups = _whole_spaces(loaded)
    every = [(_key(data), labelled(data)) for _, sets in groups for data in sets]
    by_key = dict(every)
    out = {}
    for name, sets in groups:
        judged = [_key(data) for data in sets if data.get("held_out")]
        if not judged:
            continue
        truth = [label for key in judged for label in by_key[key][1]]
        rules = [flag for key in judged for flag in by_key[key][2]]
        out[name] = {"sets": judged, "runs": len(truth), "rules": counts(truth, rules),
                     "logistic": counts(truth, leave_one_set_out(every, judged, "logistic")),
                     "boosted trees": [counts(truth, leave_one_set_out(every, judged, "boosted trees", seed))
                                       for seed in SEEDS]}
    return out


def in_sample(loaded: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each classifier fitted on every set (the whole spaces on a CPU, both models) and judged on the same runs, its
    threshold chosen there too: how well the signals separate the runs it has seen, an upper bound."""
    sets = [labelled(data) for _, group in _whole_spaces(loaded) for data in group]
    x = [row for s in sets for row in s[0]]
    y = [label for s in sets for label in s[1]]
    out = {}
    for kind in ("logistic", "boosted trees"):
        scores = list(_model(kind).fit(x, y).predict_proba(x)[:, 1])
        threshold = _threshold(y, scores)
        out[kind] = {"runs": len(y), **counts(y, [int(p >= threshold) for p in scores])}
    return out


def _span(values: list) -> str:
    """The range of figures over the seeds: "0.75-0.85", or one figure where they agree."""
    low, high = min(values), max(values)
    shown = [_ratio(v) if isinstance(v, float) or v is None else str(v) for v in (low, high)]
    return shown[0] if shown[0] == shown[1] else f"{shown[0]}-{shown[1]}"


def lines(judged: dict[str, dict[str, Any]]) -> list[str]:
    out = ["| model | held-out sets | runs ok at 20 steps | late failures | forecast | flags | true | recall | precision |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model, j in judged.items():
        seeds = ", ".join(key.split(":")[1] for key in j["sets"])
        for kind, name in (("rules", "today's rules"), ("logistic", "logistic regression, fitted on the other sets"),
                           ("boosted trees", f"boosted trees, fitted on the other sets ({len(SEEDS)} seeds)")):
            runs = j[kind] if isinstance(j[kind], list) else [j[kind]]
            figures = [_span([c[key] if c[key] is not None else 0.0 for c in runs])
                       for key in ("flags", "true", "recall", "precision")]
            out.append(f"| {model} | {seeds} | {j['runs']} | {runs[0]['failures']} | {name} | " + " | ".join(figures)
                       + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.horizon.horizon_fit", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:3]))
    parser.add_argument("sets", nargs="+", metavar="JSON", help="recorded bench.horizon.horizon sets")
    parser.add_argument("--in-sample", action="store_true", help="also fit on every set and judge the same runs (an "
                                                                 "upper bound: what the signals separate when seen)")
    args = parser.parse_args(argv)
    loaded = [load(path) for path in args.sets]
    print("\n".join(lines(judge(loaded))))
    if args.in_sample:
        for kind, c in in_sample(loaded).items():
            print(f"in sample, {kind}: {c['runs']} runs, {c['failures']} failures, {c['flags']} flags, {c['true']} "
                  f"true: recall {_ratio(c['recall'])}, precision {_ratio(c['precision'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
