"""Export after real searches: `tuner export` (in this process and as a process) on the anchor grid's search, and a
search on the user's own data whose export TRL's parser reads without the harness's settings, its max_length measured
with the model's tokenizer (the export's rules on made-up searches are tests/unit/report/test_export.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from helpers import preference_rows, replay, sampled_params, trl_parse

from tuner import cli
from tuner.config.precision import PRECISIONS as PRECISION_ROWS
from tuner.config.space import load_space
from tuner.config.trainers import adapter

# -- tuner export after a real search ---------------------------------------------------------


@pytest.mark.slow
def test_tuner_export_yaml_and_json_after_a_real_search(anchor, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(anchor.root)  # the default --store ./mlflow is the search's store
    yaml_path, json_path = tmp_path / "recommended.yaml", tmp_path / "recommended.json"
    assert cli.main(["export", "--experiment", anchor.experiment, "-o", str(yaml_path)]) == 0
    assert cli.main(["export", "--experiment", anchor.experiment, "-o", str(json_path), "--format", "json"]) == 0
    assert f"trial {anchor.outcome.recommended['number']}" in capsys.readouterr().err

    exported = yaml.safe_load(yaml_path.read_text())
    # json is valid and says exactly what the YAML says, which is what the search recommended.
    assert json.loads(json_path.read_text()) == exported == anchor.outcome.trl_config
    assert yaml_path.read_text().startswith("# Recommended by tuner")
    assert yaml_path.read_text().endswith("\n") and json_path.read_text().endswith("\n")  # a whole last line

    parsed = trl_parse("reward", yaml_path, tmp_path / "out")
    args, model_args = parsed[1], parsed[2]
    best = anchor.outcome.recommended["params"]
    assert args.learning_rate == best["learning_rate"]
    assert args.per_device_train_batch_size == 8 and args.max_length == 64
    assert model_args.dtype == PRECISION_ROWS[best["precision"]].weight_dtype
    assert args.bf16 is False and args.fp16 is False  # the anchor grid has only fp32 and "-pure" precisions
    assert model_args.model_name_or_path == anchor.prepared.model_path
    # no use_cpu from the CPU the search ran on: the file is for the machine the user trains on
    assert "use_cpu" not in exported and args.use_cpu is False
    # max_length 64 is the anchor's own --search-space fixed value: set by the user, so kept, and the header says so
    assert "# max_length: 64: your search space's fixed value" in yaml_path.read_text()


@pytest.mark.slow
def test_tuner_export_process_prints_yaml_to_stdout(anchor, tmp_path):
    done = subprocess.run([sys.executable, "-m", "tuner.cli", "export", "--experiment", anchor.experiment],
                          cwd=anchor.root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout) == anchor.outcome.trl_config


def token_lengths(rows: list[dict], model: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return sorted(max(len(tokenizer(r["prompt"] + r[side])["input_ids"]) for side in ("chosen", "rejected"))
                  for r in rows)


def test_max_length_is_measured_on_the_users_data_with_the_models_tokenizer(tmp_path, tiny_model):
    from tuner.report import export

    rows = preference_rows(300)
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    space = load_space(None, "reward")
    config, info = export.build(adapter("reward"), sampled_params("reward", False, "fp32", 3), tiny_model, space=space,
                                dataset=str(data))
    lengths = token_lengths(rows[:export.MEASURE_ROWS], tiny_model)
    value = config["max_length"]
    # the rule: a multiple of 8 that fits all but at most 1% of the rows measured, and no longer than needed
    longer = sum(1 for n in lengths if n > value)
    assert value % 8 == 0 and longer <= 0.01 * len(lengths) and value - 8 < lengths[-1 - longer]
    assert value > 64  # the shipped space's trial length would have cut most of these pairs
    (why,) = [x["why"] for x in info["lengths"]]
    assert why.startswith(f"measured on {data} with the model's tokenizer: the 99th percentile")
    assert f"{export.MEASURE_ROWS} rows" in why and "the search's short trials used 64" in why


@pytest.mark.slow
def test_export_of_a_real_cpu_search_on_the_users_data_loads_in_trl_without_harness_settings(tmp_path, tiny_model,
                                                                                              monkeypatch):
    """A real search (Ray, MLflow, the tiny model) with the shipped reward space on the user's own data, on this
    CPU; then `tuner export` and TRL's parser: no use_cpu, no harness max_length 64, a length measured on the data."""
    from tuner.config.space import FloatParam
    from tuner.report import export
    from tuner.search import driver as search

    rows = preference_rows(96)
    (tmp_path / "prefs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    options = search.SearchOptions(trainer="reward", dataset="prefs.jsonl", sampler="random", trials=1, max_steps=20,
                                   confirm_seeds=0, experiment="users-data", store=str(tmp_path / "mlflow"))
    prepared = search.prepare(options)
    assert export.is_shipped(prepared.space) and isinstance(prepared.space.params["learning_rate"], FloatParam)

    def learns(params):  # a config the tiny reward model learns with in 20 steps (the anchor grid's fp32 cell)
        return (params["precision"] == "fp32" and not params["use_peft"] and 3e-4 <= params["learning_rate"] <= 3e-3
                and params["per_device_train_batch_size"] * params["gradient_accumulation_steps"] <= 16)

    seed = next(s for s in range(2000) if learns(replay(prepared.space, "random", s, 1)[0]))
    prepared.options.seed = seed  # the random sampler's first draw for this seed is that config
    outcome = search.run_search(prepared, echo=lambda line: None)
    assert outcome.records[0]["params"] == replay(prepared.space, "random", seed, 1)[0]
    assert outcome.recommended is not None, outcome.records

    out = tmp_path / "recommended.yaml"
    assert cli.main(["export", "--experiment", "users-data", "-o", str(out)]) == 0
    text = out.read_text()
    exported = yaml.safe_load(text)
    assert "use_cpu" not in exported
    args = trl_parse("reward", out, tmp_path / "out")[1]
    assert args.use_cpu is False and args.bf16 is False
    assert args.learning_rate == outcome.recommended["params"]["learning_rate"]
    # max_length measured on prefs.jsonl: fits 99% of its pairs, so it is not the trials' 64
    lengths = token_lengths(rows, tiny_model)
    assert args.max_length == exported["max_length"] and args.max_length >= lengths[int(0.99 * len(lengths)) - 1] > 64
    (line,) = [line for line in text.splitlines() if line.startswith("# max_length: ")]
    assert line.startswith(f"# max_length: {args.max_length}: measured on ") and "prefs.jsonl with the model's " \
        "tokenizer: the 99th percentile" in line and "the search's short trials used 64" in line, line
    assert "# Not set: use_cpu." in text
