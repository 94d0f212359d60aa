"""Confirmation: before a config is called recommended, re-run the best candidates with other seeds.

A candidate is confirmed only if every extra seed is stable (status ok) and the extra seeds learn:
each moved the right way (progress > 0) and together they show it at the recommendation's level (their
learning tests' p-values combined by Stouffer's method, p < ALPHA; one seed alone must pass on its own).
Seeds are judged together because a slow learner's single run is a weak test (a 60-step GRPO run of the
tiny pretrained model at 4e-5 gave p = 0.008, 0.027 and 0.038 on three seeds), and asking each of them to
pass alone rejects real learners as often as not; under no learning at all the combined p-value is
uniform, so the false-alarm rate stays at ALPHA. One that fails is demoted, with the reason shown, and the
next candidate is considered.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from tuner.records import Confirmation, Spread, TrialJob, TrialRecord, is_ok
from tuner.search.ledger import WAIT, Ledger
from tuner.stores.tags import CONFIRMATION_TAG, CONFIRMS_TAG, RUN_NAME_TAG
from tuner.verdicts import recommend as rec
from tuner.verdicts.learning import ALPHA

if TYPE_CHECKING:
    from tuner.trial import TrialSpec

__all__ = ["WAIT", "Schedule", "candidates", "combined_p_value", "confirmation_jobs", "confirms", "judge",
           "with_seen_risk"]


def candidates(records: list[TrialRecord], top: int, confirmations: list[TrialRecord] | tuple = ()
               ) -> list[TrialRecord]:
    """The top trials by the recommendation's objective (learning speed), best first; a trial whose confirmation
    runs put it at risk ranks as at risk (``with_seen_risk``)."""
    return rec.ranked(with_seen_risk(records, confirmations))[:top]


def with_seen_risk(records: list[TrialRecord], confirmations: list[TrialRecord] | tuple = ()) -> list[TrialRecord]:
    """``records``, each one whose own run showed no risk but one of its confirmation runs did (the same config and
    steps on another seed) carrying that risk: a config at risk on any seed it ran on is at risk, and the
    recommendation's rule (tuner.verdicts.recommend) and the anchored twin (tuner.search._anchor) act on it. Seen on
    the tiny pretrained model: a GRPO config's 60-step rung showed no risk on seed 1 and the reward-spread risk on
    confirmation seeds 2 and 3."""
    seen: dict[tuple[Any, Any], TrialRecord] = {}
    for run in confirmations:
        if run.get("risk") and run.get("confirms") is not None:
            seen.setdefault((run["confirms"], run.get("max_steps")), run)
    if not seen:
        return list(records)
    out = []
    for record in records:
        other = seen.get((record.get("number"), record.get("max_steps")))
        out.append(record if other is None or record.get("risk") else cast(TrialRecord, {
            **record, "risk": other["risk"], "risk_signal": other.get("risk_signal"),
            "risk_step": other.get("risk_step")}))
    return out


def confirmation_jobs(cands: list[TrialRecord], base_spec: TrialSpec, seeds: int,
                      timeout: float) -> list[TrialJob]:
    """One job per candidate and extra seed: the same params and steps, seed + 1..seeds."""
    jobs = []
    for c in cands:
        steps = c.get("max_steps") or base_spec.max_steps
        for offset in range(1, seeds + 1):
            seed = base_spec.seed + offset
            jobs.append(TrialJob(
                # at the candidate's own length: a longer re-run (tuner.search._extend) is confirmed at its steps
                spec=base_spec.job_spec(params=c["params"], seed=seed, max_steps=steps,
                                        # a risk rung's: the first steps of a longer run
                                        schedule_steps=c.get("schedule_steps") or 0),
                number=c["number"],
                timeout=timeout * steps / base_spec.max_steps,
                tags={CONFIRMATION_TAG: "true", CONFIRMS_TAG: str(c["number"]),
                      RUN_NAME_TAG: f"confirm-{c['number']:03d}-seed{seed}"},
                extra={"confirms": c["number"]},
            ))
    return jobs


class Schedule:
    """Which confirmation run a free trial slot gets next, in the search's own Ray Tune run.

    Once every search trial has finished (``final``): the top candidates' runs, one candidate at a time, each
    (trial, seed) once. The first candidate confirmed is the recommendation (``judge``), so the next one's runs are
    handed out only once the one before it was demoted (WAIT while its runs are out): a search whose top candidate
    holds ends with its runs, not with every candidate's (bench/studies/warm_start.py: a tiny-model search's last
    confirmation round, a tenth of its wall time). Before that, while the last search trials run, a slot that would
    idle confirms the best trial so far (at most one candidate's runs in all): it is the likeliest to stay a
    candidate, and its runs then count for it; if it does not, they were run in time that was idle anyway. A warm
    search hands out its earlier recommendation's runs, then those of a trial that beats it here, ahead of its other
    trials (``first``, ``ahead`` = 2).
    """

    def __init__(self, base_spec: TrialSpec, seeds: int, top: int, timeout: float,
                 announce: Callable[[str], None] = print, ahead: int = 1) -> None:
        self.base_spec, self.seeds, self.top, self.timeout, self.announce = base_spec, seeds, top, timeout, announce
        self.ahead = ahead  # the most candidates whose runs are handed out early (a warm search's: 2, ``first``)
        self.handed: set[tuple[int, int, int]] = set()  # (trial, seed, steps) of the runs handed out
        self.early = 0  # of those, handed out before every search trial had finished
        self.early_of: set[int] = set()  # the trials those were of
        self.announced: set[tuple[bool, tuple[int, ...]]] = set()

    def first(self, candidate: TrialRecord, why: str) -> TrialJob | None:
        """``candidate``'s next confirmation run (its number and params: it may still be running, and then its runs
        go beside it), handed out ahead of the search's next trials, or None once they are all out or ``ahead``
        other candidates had early runs: a warm search's earlier recommendation (tuner.search._warm.to_confirm_first),
        then the trial that beats it here (``_warm.challenger``). No other trial is confirmed before every search
        trial has finished; ``why`` is said once."""
        if self.seeds <= 0:
            return None
        for job in confirmation_jobs([candidate], self.base_spec, self.seeds, self.timeout):
            key = _key(job)
            if key in self.handed:
                continue
            if candidate["number"] not in self.early_of and len(self.early_of) >= self.ahead:
                return None  # other trials' early runs were handed out first
            if (False, (candidate["number"],)) not in self.announced:
                self.announced.add((False, (candidate["number"],)))
                beside = " beside it" if candidate.get("status") is None else ""  # still running
                self.announce(f"confirming trial {candidate['number']}, {why}, on {self.seeds} more seeds{beside}, "
                              "ahead of the other trials")
            self.handed.add(key)
            self.early += 1
            self.early_of.add(candidate["number"])
            return job
        return None

    def beside(self, rung: TrialRecord) -> TrialJob | None:
        """A confirmation run of ``rung`` (a longer run still under way: its trial's number and params, its steps) for a
        slot that would idle beside it while it runs alone (tuner.search._extend): if it learns, its confirmation is
        under way; if not, the run took time that was idle. Each (trial, seed, steps) once; None when all are out."""
        if self.seeds <= 0:
            return None
        for job in confirmation_jobs([rung], self.base_spec, self.seeds, self.timeout):
            if (key := _key(job)) not in self.handed:
                self.handed.add(key)
                return job
        return None

    @property
    def most_runs(self) -> int:
        """The most runs next() and first() can hand out: every candidate's, and ``ahead`` more candidates' early."""
        return (self.top + self.ahead) * self.seeds if self.seeds > 0 else 0

    def next(self, ledger: Ledger, final: bool) -> TrialJob | str | None:
        """The next confirmation run, WAIT (a candidate's runs are out: its verdict decides whether the next one's
        run), or None (nothing more: the candidates are confirmed or used up). A Phase: it may run before every search
        trial has finished (the best so far in a slot that would idle)."""
        finished, confirmations = ledger.contenders(), ledger.confirmations()
        if self.seeds <= 0 or (not final and self.early >= self.seeds):
            return None
        cands = candidates(finished, self.top if final else 1, confirmations)
        numbers = tuple(c["number"] for c in cands)
        if cands and (final, numbers) not in self.announced:
            self.announced.add((final, numbers))
            if not final:
                line = f"trial {numbers[0]}, the best so far, on {self.seeds} more seeds while the last trials run"
            elif len(cands) == 1:
                line = f"trial {numbers[0]}, the only candidate, on {self.seeds} more seeds"
            else:
                line = (f"the top {len(cands)} candidates (trials {', '.join(map(str, numbers))}) on {self.seeds} more "
                        "seeds, in that order: the next only if the one before it is demoted")
            self.announce(f"confirming {line}")
        for c in cands:
            jobs = confirmation_jobs([c], self.base_spec, self.seeds, self.timeout)
            for job in jobs:
                key = _key(job)
                if key not in self.handed:
                    self.handed.add(key)
                    if not final:
                        self.early += 1
                        self.early_of.add(c["number"])
                    return job
            if not final:
                return None
            done = {r["seed"] for r in confirmations if confirms(r, c)}
            if {job["spec"]["seed"] for job in jobs} - done:
                return WAIT  # its runs are out: confirmed, it is the recommendation and the rest need none
            if judge([c], list(confirmations))[0] is not None:
                return None
        return None


# "on": a rung that runs alone gets its confirmation seeds beside it (Schedule.beside). Off by default: on 2 slots with
# 2 seeds it filled the idle slot (slot time outside trial processes, median of 3 searches, 0.24 against 0.38) but the
# searches took longer (median wall 168 s against 140 s, the same picks; tiny pretrained model, GRPO,
# bench/recorded/slots_beside.json): the second seed still waits for a slot, and when the rung does not learn, its
# seeds run on past it. It may pay with more slots than seeds (not measured).
BESIDE_SWITCH = "TUNER_CONFIRM_BESIDE_RUNGS"


def beside_rungs() -> bool:
    return os.environ.get(BESIDE_SWITCH, "off").lower() in ("on", "1", "true", "yes")


def _key(job: TrialJob) -> tuple[int, int, int]:
    return job["number"], job["spec"]["seed"], job["spec"]["max_steps"]


def confirms(run: TrialRecord, candidate: TrialRecord) -> bool:
    """Whether ``run`` is a confirmation run of ``candidate``: its trial, at its length (a trial's longer rung is
    confirmed at the rung's steps, tuner.search._extend; its shorter runs' seeds do not count for it)."""
    steps = candidate.get("max_steps")
    return run.get("confirms") == candidate["number"] and (steps is None or run.get("max_steps") == steps)


def _why(run: TrialRecord) -> str:
    if is_ok(run):
        progress, p_value = run.get("progress"), run.get("progress_p_value")
        if progress is None or p_value is None:
            return f"seed {run['seed']}: ok, but too few steps to judge learning"
        why = ("last third not significantly better than the start" if p_value >= ALPHA
               else "progress below the smallest that counts")
        return (f"seed {run['seed']}: ok, but no learning shown (progress {progress:+.3f}, p={p_value:.2g}: "
                f"{why})")
    where = f" at step {run['stopped_at_step']}" if run.get("stopped_at_step") else ""
    return f"seed {run['seed']}: {run['status']}{where}" + (f" ({run['reason']})" if run.get("reason") else "")


def _spread(values: list[float | None]) -> Spread | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    return Spread(min(known), statistics.fmean(known), max(known))


def combined_p_value(runs: list[TrialRecord]) -> float | None:
    """The runs' one-sided learning p-values combined by Stouffer's method (None if one has none): the
    chance of evidence this strong for learning across the seeds if none of them learned."""
    p_values = [p for r in runs if (p := r.get("progress_p_value")) is not None]
    if not p_values or len(p_values) < len(runs):
        return None
    normal = statistics.NormalDist()
    z = sum(normal.inv_cdf(min(max(1.0 - float(p), 1e-15), 1.0 - 1e-15)) for p in p_values) / len(p_values) ** 0.5
    return 1.0 - normal.cdf(z)


def _learn_together(reruns: list[TrialRecord]) -> str:
    """Why the stable extra seeds do not show learning together, or "" when they do."""
    if not reruns:
        return ""
    together = combined_p_value(reruns)
    if together is not None and together < ALPHA and all((r.get("progress") or 0.0) > 0 for r in reruns):
        return ""
    weak = [r for r in reruns if not rec.learned(r)] or reruns
    why = "; ".join(_why(r) for r in weak)
    if len(reruns) > 1 and together is not None:
        why += f" (the {len(reruns)} seeds together: p={together:.2g})"
    return why


def judge(cands: list[TrialRecord], confirmations: list[TrialRecord]
          ) -> tuple[TrialRecord | None, list[Confirmation]]:
    """(the recommended record or None, one verdict per candidate in order: those after the recommended one only
    where their runs were made). The recommended record carries its verdict under "confirmation", as a mapping."""
    verdicts: list[Confirmation] = []
    recommended: TrialRecord | None = None
    for c in cands:
        reruns = sorted((r for r in confirmations if confirms(r, c)), key=lambda r: r["seed"])
        if recommended is not None and not reruns:
            continue  # a candidate before it was confirmed: its runs were not needed (Schedule), it has no verdict
        unstable = [r for r in reruns if not is_ok(r)]
        why = "; ".join(_why(r) for r in unstable) if unstable else _learn_together(reruns)
        runs = [c, *reruns]
        verdict = Confirmation(
            number=c["number"],
            confirmed=not why,
            seeds=[r.get("seed") for r in runs],
            statuses=[str(r["status"]) for r in runs],
            tokens_per_second=_spread([r.get("tokens_per_second") for r in runs]),
            progress=_spread([r.get("progress") for r in runs]),
            demoted_because=why,
            risk=next((r["risk"] for r in runs if r.get("risk")), ""),  # the forecast, on any of its seeds
        )
        verdicts.append(verdict)
        if recommended is None and verdict.confirmed:
            chosen: TrialRecord = {**c, "confirmation": verdict.to_dict(), "risk": verdict.risk}
            recommended = chosen
    return recommended, verdicts
