"""tuner's command line: parse, call one function, print. TunerError -> one line, exit code 2.

Heavy libraries are imported by the commands that need them, so ``tuner --help`` is instant.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from tuner import __version__
from tuner.config.options import (
    AT_LEAST_1,
    SUBMITTED_JOB_ENV,
    Rule,
    env_default,
    flag,
    help_text,
    option_fields,
    value_type,
)
from tuner.config.trainers import ADAPTERS
from tuner.errors import TunerError
from tuner.records import SearchSummary, Status, TrialRecord
from tuner.stores import interrupts

# Exit codes, for scripts (README "Exit codes"): 0 only when the command did what it says.
EXIT_OK = 0  # search: a config is recommended; trial: the trial is ok; export/report/ui/sync: done
EXIT_PENDING = 1  # sync: some kept writes could not be sent yet
EXIT_USAGE = 2  # bad input: one line on stderr, nothing run or written
EXIT_NOTHING_RECOMMENDED = 3  # search: it ran and some trial was ok, but none learned on every seed
EXIT_NO_TRIAL_OK = 4  # search: every trial failed (diverged, collapsed, crashed, oom, invalid); trial: not ok
EXIT_INTERRUPTED = interrupts.EXIT_INTERRUPTED  # 130: Ctrl-C or SIGTERM (a search is left resumable)

SEARCH_EXAMPLES = """examples:
  tuner search                                         # embedded default: tiny local model, grpo, 12 trials
  tuner search --model Qwen2.5-0.5B --trainer grpo     # alias for Qwen/Qwen2.5-0.5B
  tuner search --trainer reward --sampler grid --search-space my_space.yaml
  tuner search --trainer dpo --dataset prefs.jsonl --trials 40 --max-steps 30
  tuner search --from my_dpo.yaml                      # your `trl dpo --config` file: trial 0 runs it, the export fixes it
  tuner search --model Qwen2.5-0.5B --budget 2000       # longer rungs (60, 180 steps) if 20 show no learning
  tuner search --ray-address 10.0.0.1:6379 --gpus-per-trial 1 --tracking-uri http://mlflow:5000
  tuner search --model Qwen2.5-7B --trainer dpo --gpus-per-trial 4   # a trial on 4 GPUs, one process each
  tuner search --processes-per-trial 2                 # each trial 2 gloo processes on this CPU (data parallel)
"""

SUBMIT_EXAMPLES = """examples:
  tuner submit --cluster http://10.0.0.1:8265 --trainer dpo --dataset prefs.jsonl --trials 40
  tuner submit --cluster http://10.0.0.1:8265 --from my_grpo.yaml --max-gpus 4
  tuner submit --cluster http://10.0.0.1:8265 --include keys/reward_api.key   # a file that looks like a secret, sent
  tuner jobs --cluster http://10.0.0.1:8265                 # every search on the cluster
  tuner logs JOB --follow --cluster http://10.0.0.1:8265
  tuner stop JOB --cluster http://10.0.0.1:8265             # its runs KILLED, resumable:
  tuner submit --resume JOB --cluster http://10.0.0.1:8265
  export TUNER_CLUSTER=http://10.0.0.1:8265                 # then --cluster can be left out

the team's set-up (once): docs/distributed.md, "A shared cluster"
"""

MAIN_EXAMPLES = """examples:
  tuner search                                         # tiny local model, grpo: a first search in minutes on a CPU
  tuner search --model Qwen2.5-0.5B --trainer dpo --dataset prefs.jsonl
  tuner ui                                             # review the trials in MLflow on http://127.0.0.1:5000
  tuner export --experiment grpo-tiny -o recommended.yaml
  tuner verify recommended.yaml --steps 500            # how far it holds, before the long run
  trl grpo --config recommended.yaml --dataset_name YOUR_DATASET
  tuner trial --config trial.yaml                      # reproduce one trial in this process
  tuner submit --cluster http://HEAD:8265 --trainer dpo # a search as a job on a team's Ray cluster (tuner jobs)

run `tuner COMMAND --help` for a command's options
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit code 2 like every other bad input."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"tuner: error: {message} (see {self.prog} --help)\n")


def _number(kind, rule: Rule, noun: str = "number"):
    """An argparse type: parse with ``kind`` and keep values ``rule`` allows (nan and inf never)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {noun}, got {text!r}") from None
        if not rule.allows(value):
            raise argparse.ArgumentTypeError(f"{rule.text}, got {text}")
        return value
    return parse


_positive_int = _number(int, AT_LEAST_1, "whole number")
_port = _number(int, Rule("must be between 1 and 65535", lambda v: 1 <= v <= 65535), "port number")


def _add_options(p: argparse.ArgumentParser, *names: str, given_only: bool = False) -> None:
    """One argument per SearchOptions field (all of them, or ``names``), generated from its declaration in
    tuner.config.options: flag, type and rule, default (or its environment variable's value), choices, metavar,
    and help with "(default: X)". ``given_only``: an option left out is absent from the parsed namespace (tuner
    submit passes on what was typed, and the cluster's own defaults apply to the rest)."""
    for f in option_fields():
        if names and f.name not in names:
            continue
        meta = f.metadata
        kind = value_type(f)
        kwargs: dict[str, Any] = {"dest": f.name, "help": help_text(f).replace("%", "%%")}
        if given_only:
            kwargs["default"] = argparse.SUPPRESS
        if kind is bool:
            kwargs.update(action=argparse.BooleanOptionalAction)
            kwargs.setdefault("default", f.default)
            p.add_argument(flag(f), **kwargs)
            continue
        if meta.get("action"):
            kwargs["action"] = meta["action"]
        else:
            kwargs.setdefault("default", env_default(f))
        if meta.get("rule") is not None:
            kwargs["type"] = _number(kind, meta["rule"], "whole number" if kind is int else "number")
        elif kind is not str:
            kwargs["type"] = kind  # argparse's own "invalid int value: 'x'"
        for key in ("choices", "metavar"):
            if meta.get(key) is not None:
                kwargs[key] = meta[key]
        p.add_argument(flag(f), **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tuner", description="Find TRL training configs that are stable and fast: many short real "
                     "trials (Ray Tune + Optuna), a guard that stops every trial the moment it goes non-finite or "
                     "collapses, everything logged to MLflow, and a config TRL's CLI runs unchanged.",
                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=MAIN_EXAMPLES)
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    s = commands.add_parser("search", help="search for a stable and fast config",
                            formatter_class=argparse.RawDescriptionHelpFormatter, epilog=SEARCH_EXAMPLES,
                            description="Run many short real trials, stop each one that goes unstable, and "
                            "recommend the fastest stable config that learns.")
    _add_options(s)
    s.add_argument("-o", "--output", metavar="FILE", help="also write the recommended TRL config to FILE")

    t = commands.add_parser("trial", help="run one trial in this process, without Ray",
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            description="Reproduce a single trial by hand: prints its per-step metrics and verdict.",
                            epilog="example trial.yaml:\n  trainer: reward\n  max_steps: 20\n  params:\n"
                            "    precision: fp16-pure\n    learning_rate: 0.3\n    per_device_train_batch_size: 8\n")
    t.add_argument("--config", required=True, metavar="FILE", help="trial YAML: trainer, params, and optionally "
                   "model, dataset, reward_funcs, max_steps, seed")

    v = commands.add_parser("verify", help="run a TRL config for N steps as one guarded trial: how far it holds",
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            description="Run a `trl <trainer> --config` file (tuner's export, or your own) for --steps "
                            "steps in this process, under the guard that stops it at the first non-finite or "
                            "collapsed step; print the lengths it runs, a line per tenth of the run (and at least "
                            "every 30 s) with steps/s and the time left, an estimate after the first steps, then how "
                            "far it held (or the step and cause it failed at), whether it learned, and what that does "
                            "not cover. A search's verdicts cover its trials' steps and seeds only: verify the length "
                            "you will run. A length the file leaves to TRL's default runs as the search's trials ran "
                            "it, where the file's header (tuner export's) says so.",
                            epilog="examples:\n"
                            "  tuner verify recommended.yaml --steps 500          # the export, 25x a 20-step trial\n"
                            "  tuner verify my_dpo.yaml --steps 200 --model tiny --dataset builtin\n"
                            "  tuner verify recommended.yaml --steps 500 --seed 1  # another seed\n"
                            "exit codes: 0 held every step, 4 stopped (diverged, collapsed, crashed, oom, invalid), "
                            "2 bad input")
    v.add_argument("config", metavar="CONFIG.yaml", help="a `trl <trainer> --config` file")
    v.add_argument("--steps", type=_positive_int, required=True, metavar="N", help="optimizer steps to run")
    v.add_argument("--seed", type=int, help="training seed (default: the file's seed, else TRL's default 42)")
    v.add_argument("--trainer", choices=list(ADAPTERS), help="the TRL trainer (default: the file's comment "
                   "`# trl <trainer> ...`, else the one trainer whose parser takes every key)")
    v.add_argument("--model", help="replaces the file's model_name_or_path: a local directory, hub id, alias or tiny")
    v.add_argument("--dataset", help="replaces the file's dataset_name: a local file, hub id, or builtin")
    v.add_argument("--reward-func", dest="reward_funcs", action="append", metavar="NAME",
                   help="grpo: replaces the file's reward_funcs (repeat for several)")
    v.add_argument("--trl-default-lengths", action="store_true",
                   help="lengths the file leaves out run TRL's defaults (e.g. max_completion_length 512), not the "
                   "search's trials' lengths that an export's header records (e.g. 12)")

    e = commands.add_parser("export", help="write a search's recommended config for TRL's CLI",
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="example:\n  tuner export --experiment grpo-tiny -o recommended.yaml\n"
                            "  trl grpo --config recommended.yaml --dataset_name YOUR_DATASET")
    e.add_argument("--experiment", required=True, help="MLflow experiment of the search")
    e.add_argument("--run-id", help="a specific search run (default: the latest search in the experiment)")
    e.add_argument("-o", "--output", metavar="FILE", help="write here (default: print)")
    e.add_argument("--format", default="yaml", choices=["yaml", "json"], help="yaml (default, for trl --config) or json")
    e.add_argument("--max-length", type=_positive_int, metavar="N", help="max_length for your data (default: measured "
                   "on the search's --dataset with the model's tokenizer, else TRL's default; the file says which)")
    e.add_argument("--max-completion-length", type=_positive_int, metavar="N",
                   help="grpo: tokens a completion may have (default: TRL's default)")
    _store_args(e)

    r = commands.add_parser("report", help="failures, what drives them, plots and hints for a finished search",
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            description="Print a search's failure breakdown per parameter value, parameter "
                            "importances for stability and speed, and hints; log report.md and plots/*.png on the "
                            "search's MLflow run.",
                            epilog="example:\n  tuner report --experiment reward-tiny --out report/")
    r.add_argument("--experiment", required=True, help="MLflow experiment of the search")
    r.add_argument("--run-id", help="a specific search run (default: the latest search in the experiment)")
    r.add_argument("--out", metavar="DIR", help="also keep report.md and plots/*.png in DIR")
    _store_args(r)

    y = commands.add_parser("sync", help="send results kept on disk while the MLflow server was away")
    _store_args(y)

    b = commands.add_parser("submit", help="send a search to a shared Ray cluster as a job",
                            formatter_class=argparse.RawDescriptionHelpFormatter, epilog=SUBMIT_EXAMPLES,
                            description="Run `tuner search` on a Ray cluster as a Ray job: this folder (your jsonl, "
                            "reward module, --from file) travels as the job's working directory, the search joins "
                            "the cluster, logs to the cluster's MLflow store (TUNER_TRACKING_URI and TUNER_STORE, "
                            "set where `ray start` runs) under an experiment of its own, and holds half the "
                            "cluster unless asked for more. The search options are tuner search's.")
    _cluster_arg(b)
    b.add_argument("--resume", dest="resume_job", metavar="JOB", help="resume the stopped (or failed) search of "
                   "job JOB as a new job, keeping its finished trials; run from the same folder")
    b.add_argument("--include", action="append", default=[], metavar="PATH", help="send this file of the folder "
                   "although it looks like a secret (.env*, *.pem, *.key, .netrc, .git-credentials, token and "
                   "credentials files, ~/.ssh-style folders: left out unless named here); repeat for several")
    _add_options(b, *[f.name for f in option_fields() if f.name not in ("ray_address", "resume")], given_only=True)

    j = commands.add_parser("jobs", help="the searches on a shared Ray cluster, one line each",
                            description="Every search sent with tuner submit: job id, user, trainer and model, "
                            "status, trials done and the best so far (from the search's log), and its experiment.")
    _cluster_arg(j)
    lg = commands.add_parser("logs", help="a submitted search's output", description="Print a job's log: the "
                             "search's progress lines, results table and recommendation.")
    lg.add_argument("job", metavar="JOB", help="job id, as tuner submit and tuner jobs print it")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    _cluster_arg(lg)
    st = commands.add_parser("stop", help="stop a submitted search (resumable)", description="Stop a job: Ray sends "
                             "the search SIGTERM, it ends its trials, marks its MLflow runs KILLED and stays resumable "
                             "with tuner submit --resume JOB.")
    st.add_argument("job", metavar="JOB", help="job id, as tuner submit and tuner jobs print it")
    _cluster_arg(st)

    u = commands.add_parser("ui", help="serve the MLflow UI for the store on 127.0.0.1")
    u.add_argument("--port", type=_port, default=5000, help="port (default: 5000)")
    _add_options(u, "store")
    return parser


def _cluster_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", metavar="URL", help="the Ray head node's job server, e.g. http://10.0.0.1:8265 "
                   "(default: $TUNER_CLUSTER)")


def _store_args(p: argparse.ArgumentParser) -> None:
    _add_options(p, "store", "tracking_uri")


def _check_output(path: str | None) -> None:
    """-o FILE: refuse a place that cannot be written now, not after the search has run."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise TunerError(f"-o {path}: is a directory; pass a file name such as {target / 'recommended.yaml'}")
    if not target.parent.is_dir():
        raise TunerError(f"-o {path}: folder {target.parent} does not exist; create it or pass another path")
    if not os.access(target.parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise TunerError(f"-o {path}: not writable (permission denied); pass a writable path")


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise TunerError(f"-o {path}: cannot write it ({e.strerror or e}); pass a writable path") from None


# -- commands ---------------------------------------------------------------------------------


def cmd_search(args) -> int:
    from tuner.report import results_table, summary_text
    from tuner.search import driver as search

    _check_output(args.output)
    options = search.options_from(**vars(args))
    prepared = search.prepare_resume(options) if args.resume else search.prepare(options)
    outcome = search.run_search(prepared)
    print(results_table([*outcome.records, *outcome.search.get("extensions", [])]))
    print(summary_text(outcome))
    if args.output and outcome.trl_config:
        for path in _write_export(args.output, outcome.search, outcome.experiment, outcome.parent_run_id):
            print(_wrote(path, args.output, outcome.search, outcome.parent_run_id))
    return search_exit_code(outcome.records, outcome.recommended)


def search_exit_code(records: list[TrialRecord], recommended: TrialRecord | None) -> int:
    """0: recommended; EXIT_NO_TRIAL_OK: no trial ended ok; EXIT_NOTHING_RECOMMENDED: some did, none qualified."""
    if recommended is not None:
        return EXIT_OK
    return EXIT_NOTHING_RECOMMENDED if any(r.get("status") == Status.OK for r in records) else EXIT_NO_TRIAL_OK


def cmd_trial(args) -> int:
    import json
    import sys

    from tuner.trial import format_result, prepare_trial_spec, run_followed
    from tuner.trial.verify import verdict_lines

    spec = prepare_trial_spec(args.config)  # names, types, paths, and a probe of model, data and rewards
    # progress on stderr: stdout stays the rows and the verdict, for scripts that read them
    result = run_followed(spec, echo=lambda line: print(line, file=sys.stderr, flush=True),
                          shorter="lower max_steps in the trial's YAML for a shorter run")
    for row in result.history:
        print(json.dumps(row))
    print(format_result(result))
    for line in verdict_lines(spec, result)[1:]:  # learned or not, and the horizon it held (tokens/s is above)
        if line.startswith("speed:"):
            continue
        print(line)
    return EXIT_OK if result.status == Status.OK else EXIT_NO_TRIAL_OK


def cmd_verify(args) -> int:
    from tuner.trial.verify import prepare_verify, run_verify, verdict_lines

    spec, lines = prepare_verify(args.config, args.steps, model=args.model, dataset=args.dataset,
                                 reward_funcs=args.reward_funcs, seed=args.seed, trainer=args.trainer,
                                 trl_default_lengths=args.trl_default_lengths)
    for line in lines:
        print(line)
    # flushed line by line: a run piped to a file or `tee` shows its progress as it comes
    result = run_verify(spec, echo=lambda line: print(line, flush=True))
    for line in verdict_lines(spec, result):
        print(line)
    return EXIT_OK if result.status == Status.OK else EXIT_NO_TRIAL_OK


def cmd_export(args) -> int:
    from tuner.report import export
    from tuner.stores import mlflow_store, run_reader

    _check_output(args.output)
    uri = args.tracking_uri or mlflow_store.default_tracking_uri(Path(args.store))
    if not args.tracking_uri and not (Path(args.store) / "mlflow.db").exists():
        raise TunerError(f"no MLflow store at {args.store}/mlflow.db; run tuner search first or pass --store/--tracking-uri")
    if mlflow_store.is_server(uri):
        mlflow_store.check_tracking(uri, Path(args.store))  # MLflow's client would retry for minutes
    from mlflow.exceptions import MlflowException

    try:
        run, search = run_reader.load_search(uri, args.experiment, args.run_id)
    except MlflowException as e:  # e.g. a --run-id that is not in this store
        where = f"--run-id {args.run_id}" if args.run_id else f"--experiment {args.experiment}"
        cause = " ".join(str(e.message).split())[:200]
        raise TunerError(f"{where}: MLflow at {uri} says: {cause}; check the value, or leave --run-id out to "
                         "export the latest search") from None
    if search["trl_config"] is None:
        raise TunerError(f"search {run.info.run_id} recommended nothing: no trial was stable and learning; "
                         "see its results.md in tuner ui")
    search = export.with_overrides(search, {"max_length": args.max_length,
                                            "max_completion_length": args.max_completion_length})
    if args.output:
        for path in _write_export(args.output, search, args.experiment, run.info.run_id, args.format):
            print(_wrote(path, args.output, search, run.info.run_id), file=sys.stderr)
    else:
        sys.stdout.write(export.render_export(search, args.experiment, run.info.run_id, args.format))
    return 0


def _wrote(path: str, output: str, search: SearchSummary, run_id: str) -> str:
    """What an export says it wrote: a --from search's own file as it is, or with which changes; else the trial."""
    from tuner.report import fix

    fixed = search.get("fix")
    if fixed and path == output:
        return fix.export_line(fix.Fix.from_dict(fixed), path, run_id)
    best = search.get("recommended")
    return f"wrote {path} (trial {best.get('number') if best else None} of run {run_id})"


def _write_export(output: str, search: SearchSummary, experiment: str, run_id: str, fmt: str = "yaml") -> list[str]:
    """The exported TRL config, and beside it the accelerate config of a search whose trials had several ranks."""
    from tuner.report import export

    launch = export.render_launch(search)
    beside = export.launch_path(output) if launch is not None else None
    _write(output, export.render_export(search, experiment, run_id, fmt, beside.name if beside else None))
    if beside is None or launch is None:
        return [output]
    _write(str(beside), launch)
    return [output, str(beside)]


def cmd_ui(args) -> int:
    import subprocess

    from tuner.stores import mlflow_store

    store = Path(args.store)
    if not (store / "mlflow.db").exists():
        raise TunerError(f"no MLflow store at {store}/mlflow.db; run tuner search first or pass --store")
    uri = mlflow_store.default_tracking_uri(store)
    print(f"MLflow UI for {uri} on http://127.0.0.1:{args.port} (Ctrl-C to stop)", flush=True)
    # Its own process group, and the whole group stopped however tuner ui ends (Ctrl-C, SIGTERM, an error):
    # the server's workers would otherwise keep running and keep the port.
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                               "--host", "127.0.0.1", "--port", str(args.port),
                               "--workers", "1"],  # one reviewer: one worker starts in seconds, four take a minute
                              start_new_session=True)
    try:
        return server.wait()
    finally:
        _stop_group(server)


def _stop_group(leader, grace: float = 10.0) -> None:
    """SIGTERM every process of ``leader``'s process group, then SIGKILL whatever is left after ``grace`` s."""
    import time

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(leader.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            leader.poll()  # reap the leader, our child, so that the group can empty
            try:
                os.killpg(leader.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def cmd_report(args) -> int:
    from tuner.report import document as report
    from tuner.stores import mlflow_store

    uri = args.tracking_uri or mlflow_store.default_tracking_uri(Path(args.store))
    if not args.tracking_uri and not (Path(args.store) / "mlflow.db").exists():
        raise TunerError(f"no MLflow store at {args.store}/mlflow.db; run tuner search first or pass --store/--tracking-uri")
    rendered = report.report_search(uri, args.experiment, args.run_id, args.out)
    print(rendered.report.text())
    where = f"{rendered.folder} and " if args.out else ""
    print(f"wrote report.md and plots/ to {where}the artifacts of run {rendered.run_id}")
    return 0


def cmd_sync(args) -> int:
    from tuner.stores import run_writer

    if not args.tracking_uri:
        raise TunerError("tuner sync needs --tracking-uri: the server the search was logging to")
    from tuner.stores import mlflow_store

    mlflow_store.check_credentials(args.tracking_uri)  # a server with users that refuses them: one line, nothing sent
    sent, left = run_writer.sync_pending(args.tracking_uri, Path(args.store))
    print(f"sent {sent} kept writes to {args.tracking_uri}" + (f"; {left} still pending" if left else ""))
    return EXIT_OK if not left else EXIT_PENDING


def cmd_submit(args) -> int:
    from tuner.jobs import cluster, send

    given = {f.name: getattr(args, f.name) for f in option_fields() if hasattr(args, f.name)}
    if args.resume_job and given:
        raise TunerError(f"--resume {args.resume_job}: a resumed search keeps its own options; leave out "
                         + " ".join(flag(f) for f in option_fields() if f.name in given))
    url = cluster.address(args.cluster)
    send.check_given(given, Path.cwd())
    # what travels, and whether it may: before the cluster
    folder = send.working_folder(Path.cwd(), given.get("store"), include=args.include)
    client = cluster.connect(url)
    if args.resume_job:
        sent = send.resume(client, url, cluster.job(client, args.resume_job), folder)
    else:
        sent = send.submit(client, url, given, folder)
    for line in sent.lines():
        print(line)
    return EXIT_OK


def cmd_jobs(args) -> int:
    from tuner.jobs import cluster, listing

    print(listing.jobs_table(cluster.connect(args.cluster)))
    return EXIT_OK


def cmd_logs(args) -> int:
    from tuner.jobs import cluster, listing

    client = cluster.connect(args.cluster)
    status = listing.follow(client, args.job, print, keep_following=args.follow)
    if args.follow:
        print(f"tuner: job {args.job} {status}", file=sys.stderr)
    return EXIT_OK


def cmd_stop(args) -> int:
    from tuner.jobs import cluster, listing

    client = cluster.connect(args.cluster)
    status = listing.stop(client, args.job)
    url = cluster.address(args.cluster)
    print(f"job {args.job}: {status}; its finished trials are kept. Resume with: tuner submit --resume {args.job} "
          f"--cluster {url}")
    return EXIT_OK


COMMANDS = {"sync": cmd_sync, "search": cmd_search, "trial": cmd_trial, "verify": cmd_verify, "export": cmd_export, "report": cmd_report,
            "ui": cmd_ui, "submit": cmd_submit, "jobs": cmd_jobs, "logs": cmd_logs, "stop": cmd_stop}


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`tuner jobs | head`): what it did not read is not an error. No traceback, and none
        # from Python flushing the closed stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error(f"choose a command: {', '.join(COMMANDS)}")
    # SIGTERM ends a command like Ctrl-C: its cleanup runs (Ray stopped, the search run marked KILLED and left
    # resumable, tuner ui's server stopped) instead of the process vanishing mid-write.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = COMMANDS[args.command](args)
    except TunerError as e:
        if args.debug:
            raise
        print(f"tuner: error: {e}", file=sys.stderr)
        code = EXIT_USAGE
    except KeyboardInterrupt as interrupt:
        # a search says what it kept and how to resume it (tuner.report.progress.SearchInterrupted); else just this
        print(f"tuner: {interrupt}" if str(interrupt) else "tuner: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.command == "search" and os.environ.get(SUBMITTED_JOB_ENV):
        # a search sent with tuner submit: its exit code in the job's log (tuner jobs reads it; Ray says only
        # STOPPED or FAILED)
        print(f"tuner: exit code {code}", file=sys.stderr, flush=True)
    if args.command == "search" and interrupts.signalled():
        # A signal came while the search ran: its Ray was killed, not shut down (tuner.search._execution.shutdown_ray), and
        # Python's exit would run Ray's own teardown, which waits on and can crash against a GCS that is gone.
        interrupts.exit_now(code)
    return code


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
