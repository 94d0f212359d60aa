"""tuner.trial.weights: the shared copy loads the same model as from_pretrained (fp32 and bf16, causal LM and sequence
classifier with the trial's seed), maps it instead of copying it, is built once by concurrent processes, is never
taken half-built or damaged, keeps a trial's training writes to itself, and is removed by release and sweep."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, set_seed  # noqa: E402

from tuner.config.trainers import adapter  # noqa: E402
from tuner.trial import weights  # noqa: E402

CLASSES = {"causal": (AutoModelForCausalLM, {}), "reward": (AutoModelForSequenceClassification, {"num_labels": 1})}


@pytest.fixture
def shared_dir(monkeypatch, tmp_path):
    """A fresh entries folder, in /dev/shm where there is one (what trials use), removed afterwards."""
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tmp_path
    root = base / f"tuner-weights-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(weights.DIR_ENV, str(root))
    monkeypatch.setenv(weights.ENV, "always")  # the tiny checkpoint is fp32: share fp32 trials too
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _load(kind: str, model_path: str, dtype, seed: int, shared: bool, trained: bool = False):
    cls, kwargs = CLASSES[kind]
    set_seed(seed)
    if shared:
        return weights.from_pretrained(cls, model_path, dtype, trained, **kwargs)
    return cls.from_pretrained(model_path, dtype=dtype, **kwargs)


def _same(a, b) -> list[str]:
    """Names of the tensors that differ (value, dtype or shape), or that only one model has."""
    sa, sb = a.state_dict(), b.state_dict()
    differ = sorted(set(sa) ^ set(sb))
    differ += [k for k in sa if k in sb and not (sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]))]
    return differ


def _mapped_files() -> dict[int, str]:
    """Start addresses of this process's file mappings -> file (Linux)."""
    maps = {}
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5].startswith("/"):
            start, end = (int(x, 16) for x in parts[0].split("-"))
            maps[(start, end)] = parts[5]
    return maps


def _file_of(tensor, maps) -> str | None:
    ptr = tensor.data_ptr()
    return next((f for (start, end), f in maps.items() if start <= ptr < end), None)


# -- the same model ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("trained", [False, True], ids=["frozen", "trained"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["causal", "reward"])
def test_shared_load_is_the_same_model_as_from_pretrained(kind, dtype, trained, tiny_model, shared_dir):
    dtype = getattr(torch, dtype)
    expected = _load(kind, tiny_model, dtype, seed=7, shared=False)
    after_expected = torch.rand(4)
    model = _load(kind, tiny_model, dtype, seed=7, shared=True, trained=trained)
    after_shared = torch.rand(4)

    assert Path(model.name_or_path).parent == shared_dir, "not loaded from the shared copy"
    assert _same(expected, model) == []
    assert model.dtype == expected.dtype == dtype
    assert all(p.dtype == dtype for p in model.parameters())
    # the generator is left where from_pretrained leaves it: the trial's later draws are the same too
    assert torch.equal(after_expected, after_shared)
    if model.config.tie_word_embeddings and kind == "causal":
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if kind == "reward":
        # the score head is new, drawn from the trial's seed: another seed draws another head
        other = _load(kind, tiny_model, dtype, seed=8, shared=True)
        assert not torch.equal(other.score.weight, model.score.weight)
        assert torch.equal(expected.score.weight, model.score.weight)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_shared_weights_are_mapped_from_the_shared_file_not_copied(tiny_model, shared_dir):
    model = _load("causal", tiny_model, torch.bfloat16, seed=0, shared=True)
    maps = _mapped_files()
    entry = Path(model.name_or_path)
    files = {_file_of(p, maps) for p in model.parameters()}
    assert files == {str(entry / "model.safetensors")}, files
    # from its own folder, an fp32 checkpoint loaded in bf16 is a private converted copy: no file behind it
    private = _load("causal", tiny_model, torch.bfloat16, seed=0, shared=False)
    assert {_file_of(p, maps) for p in private.parameters()} == {None}


def test_auto_shares_only_a_conversion_and_off_never(tiny_model, shared_dir, monkeypatch):
    monkeypatch.setenv(weights.ENV, "auto")
    # the tiny checkpoint is fp32: an fp32 trial maps it from its own folder (the page cache shares it)
    assert weights.shared_checkpoint(tiny_model, torch.float32, AutoModelForCausalLM) is None
    entry = weights.shared_checkpoint(tiny_model, torch.bfloat16, AutoModelForCausalLM)
    assert entry is not None and entry.parent == shared_dir
    monkeypatch.setenv(weights.ENV, "off")
    assert weights.shared_checkpoint(tiny_model, torch.bfloat16, AutoModelForCausalLM) is None
    model = _load("causal", tiny_model, torch.bfloat16, seed=0, shared=True)
    assert model.name_or_path == tiny_model


# -- the file safetensors writes -----------------------------------------------------------------------------------


def _checkpoint_with_every_kind_of_tensor(tiny_model: str, folder: Path) -> Path:
    """The tiny model beside tensors of other dtypes, a scalar and an empty one: dtypes of one width whose names
    interleave (safetensors orders them by dtype, then name), floats to convert, tensors to copy as they are."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    shutil.copytree(tiny_model, folder)
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        tensors = {k: f.get_tensor(k).clone() for k in f.keys()}
    generator = torch.Generator().manual_seed(0)
    tensors.update({"a.half": torch.randn(5, generator=generator).half(), "b.bf16": torch.randn(3, 2).bfloat16(),
                    "c.double": torch.tensor(2.5, dtype=torch.float64), "d.empty": torch.empty(0, 4),
                    "a.int32": torch.arange(4, dtype=torch.int32), "z.int32": torch.arange(3, dtype=torch.int32),
                    "a.int64": torch.arange(5), "b.bool": torch.tensor([True, False, True]),
                    "a.uint8": torch.arange(3, dtype=torch.uint8), "i.int16": torch.arange(3, dtype=torch.int16)})
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("checkpoint", ["tiny", "every-kind"])
def test_the_shared_copy_is_the_file_safetensors_writes(checkpoint, dtype, tiny_model, shared_dir, tmp_path):
    """Each floating tensor is torch's cast of the checkpoint's, bit for bit, the others as they were, and the file is
    the one safetensors' save_file writes for those tensors (the hand-written writer: see the module doc)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    dtype = getattr(torch, dtype)
    model_path = tiny_model if checkpoint == "tiny" else str(_checkpoint_with_every_kind_of_tensor(
        tiny_model, tmp_path / "every-kind"))
    entry = weights.shared_checkpoint(model_path, dtype, AutoModelForCausalLM)
    with safe_open(Path(model_path) / "model.safetensors", framework="pt") as f:
        metadata = f.metadata()
        expected = {k: f.get_tensor(k) for k in f.keys()}
    expected = {k: t.to(dtype) if t.is_floating_point() else t for k, t in expected.items()}
    with safe_open(entry / "model.safetensors", framework="pt") as f:
        assert f.metadata() == metadata
        shared = {k: f.get_tensor(k) for k in f.keys()}
    assert sorted(shared) == sorted(expected)
    assert [k for k, t in expected.items() if not (shared[k].dtype == t.dtype and shared[k].shape == t.shape
                                                   and torch.equal(shared[k], t))] == []
    save_file(expected, tmp_path / "saved.safetensors", metadata=metadata)
    assert (entry / "model.safetensors").read_bytes() == (tmp_path / "saved.safetensors").read_bytes()


# -- built once --------------------------------------------------------------------------------------------------------


def _build_concurrently(model_path: str, root: str, barrier, results) -> None:
    """One of two processes asking for the same entry at once; each build is slowed so they overlap."""
    os.environ[weights.DIR_ENV] = root
    import tuner.trial.weights as w

    built = []
    original = w._build

    def slow_build(*args, **kwargs):
        built.append(os.getpid())
        time.sleep(1.0)
        return original(*args, **kwargs)

    w._build = slow_build
    barrier.wait()
    entry = w.shared_checkpoint(model_path, torch.bfloat16, AutoModelForCausalLM, mode="always")
    results.put((os.getpid(), str(entry), len(built)))


def test_two_processes_build_the_shared_copy_once(tiny_model, shared_dir):
    from tuner.trial._isolation import process_context

    ctx = process_context()
    barrier, results = ctx.Barrier(2), ctx.Queue()
    processes = [ctx.Process(target=_build_concurrently, args=(tiny_model, str(shared_dir), barrier, results))
                 for _ in range(2)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(120)
    assert [p.exitcode for p in processes] == [0, 0]
    got = [results.get(timeout=5) for _ in processes]
    assert len({entry for _, entry, _ in got}) == 1
    assert sum(builds for _, _, builds in got) == 1, got
    entry = Path(got[0][1])
    manifest = json.loads((entry / weights.MANIFEST).read_text())
    assert manifest["pid"] in {pid for pid, _, _ in got}
    assert [path.name for path in shared_dir.iterdir() if ".building-" in path.name] == []


# -- never a damaged copy ----------------------------------------------------------------------------------------------


def test_a_cut_short_copy_is_rebuilt(tiny_model, shared_dir):
    entry = weights.shared_checkpoint(tiny_model, torch.bfloat16, AutoModelForCausalLM)
    weights_file = entry / "model.safetensors"
    size = weights_file.stat().st_size
    os.truncate(weights_file, size // 2)  # a copy cut short
    again = weights.shared_checkpoint(tiny_model, torch.bfloat16, AutoModelForCausalLM)
    assert again == entry and weights_file.stat().st_size == size
    assert _same(_load("causal", tiny_model, torch.bfloat16, 0, False),
                 _load("causal", tiny_model, torch.bfloat16, 0, True)) == []


def test_a_half_built_folder_is_never_taken(tiny_model, shared_dir):
    entry = weights.shared_checkpoint(tiny_model, torch.bfloat16, AutoModelForCausalLM)
    (entry / weights.MANIFEST).unlink()  # as if the build died before its last write
    (entry / "model.safetensors").write_bytes(b"\0" * 64)
    model = _load("causal", tiny_model, torch.bfloat16, 0, True)
    assert Path(model.name_or_path) == entry and weights._valid(entry)
    assert _same(_load("causal", tiny_model, torch.bfloat16, 0, False), model) == []


@pytest.mark.parametrize("kind", ["causal", "reward"])
def test_a_corrupt_copy_falls_back_to_the_model_folder_with_the_same_seed(kind, tiny_model, shared_dir, capfd):
    entry = weights.shared_checkpoint(tiny_model, torch.bfloat16, AutoModelForCausalLM)
    with open(entry / "model.safetensors", "r+b") as f:
        f.write(b"\xff" * 16)  # the header's length and start: same size, unreadable
    assert weights._valid(entry)  # sizes alone do not tell; loading does
    expected = _load(kind, tiny_model, torch.bfloat16, seed=3, shared=False)
    model = _load(kind, tiny_model, torch.bfloat16, seed=3, shared=True)
    assert model.name_or_path == tiny_model
    assert _same(expected, model) == []  # a reward model's score head too: the generator was rewound
    assert not entry.exists()  # dropped
    assert "failed to load" in capfd.readouterr().err
    # the next trials on the node load from the model's folder too (no build-and-fail per trial) ...
    assert _load(kind, tiny_model, torch.bfloat16, seed=3, shared=True).name_or_path == tiny_model
    assert not entry.exists()
    # ... until the search's release
    weights.release(tiny_model)
    assert Path(_load(kind, tiny_model, torch.bfloat16, seed=3, shared=True).name_or_path) == entry


def test_a_full_fine_tune_never_names_a_corrupt_copy_for_its_reference_model(tiny_model, shared_dir):
    entry = weights.shared_checkpoint(tiny_model, torch.bfloat16, AutoModelForCausalLM)
    with open(entry / "model.safetensors", "r+b") as f:
        f.write(b"\xff" * 16)
    model = _load("causal", tiny_model, torch.bfloat16, seed=0, shared=True, trained=True)
    assert model.name_or_path == model.config.name_or_path == tiny_model  # TRL loads its reference from here
    assert not entry.exists()
    assert _same(_load("causal", tiny_model, torch.bfloat16, 0, False), model) == []


def test_a_load_failing_after_drawing_the_score_head_falls_back_to_the_same_head(tiny_model, shared_dir):
    class FailsLate:  # the shared load draws the new score head, then fails
        _model_mapping = AutoModelForSequenceClassification._model_mapping

        @staticmethod
        def from_pretrained(path, **kwargs):
            model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
            if Path(path).parent == shared_dir:
                raise RuntimeError("failed after the score head was drawn")
            return model

    expected = _load("reward", tiny_model, torch.bfloat16, seed=3, shared=False)
    set_seed(3)
    model = weights.from_pretrained(FailsLate, tiny_model, torch.bfloat16, num_labels=1)
    assert model.name_or_path == tiny_model
    assert torch.equal(model.score.weight, expected.score.weight)


def test_a_copy_that_cannot_be_built_falls_back(tiny_model, shared_dir, monkeypatch):
    monkeypatch.setattr(weights, "_check_room", lambda root, need: (_ for _ in ()).throw(OSError("no room")))
    model = _load("reward", tiny_model, torch.bfloat16, seed=5, shared=True)
    assert model.name_or_path == tiny_model
    assert _same(_load("reward", tiny_model, torch.bfloat16, seed=5, shared=False), model) == []


# -- a trial's writes stay its own -------------------------------------------------------------------------------------


def test_writes_to_mapped_weights_stay_in_the_process(tiny_model, shared_dir):
    from safetensors.torch import load_file

    model = _load("causal", tiny_model, torch.bfloat16, 0, True)
    entry = Path(model.name_or_path)
    stored = load_file(entry / "model.safetensors")
    with torch.no_grad():
        for p in model.parameters():  # what an optimizer step on the mapped weights would do
            p.add_(1.0)
    assert all(torch.equal(t, load_file(entry / "model.safetensors")[k]) for k, t in stored.items())
    assert _same(_load("causal", tiny_model, torch.bfloat16, 0, False),
                 _load("causal", tiny_model, torch.bfloat16, 0, True)) == []


def _build(trainer: str, tiny_model: str, params: dict, tmp_path):
    from tuner.inputs import data, rewards
    from tuner.trial.trainer import build_trainer

    dataset = data.load_dataset_spec(None, adapter(trainer), tiny=True)
    funcs = rewards.resolve_reward_funcs([data.builtin_reward(True)]) if trainer == "grpo" else None
    run = {"max_steps": 2, "seed": 0, "output_dir": str(tmp_path / "out"), "use_cpu": True}
    return build_trainer(adapter(trainer), tiny_model, {"precision": "bf16-pure", **params}, dataset, run,
                                  reward_funcs=funcs)


@pytest.mark.parametrize("use_peft", [True, False], ids=["lora", "full"])
def test_training_leaves_the_shared_copy_as_it_was(use_peft, tiny_model, shared_dir, tmp_path):
    from safetensors.torch import load_file

    entry = weights.shared_checkpoint(tiny_model, torch.bfloat16, AutoModelForCausalLM)
    stored = load_file(entry / "model.safetensors")
    # a large step, so whatever it trains moves: LoRA's adapters over the mapped base, or every weight
    trainer = _build("sft", tiny_model, {"learning_rate": 0.1, "max_length": 32, "per_device_train_batch_size": 4,
                                         "use_peft": use_peft}, tmp_path)
    model = trainer.model
    assert Path(model.name_or_path) == entry
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train()
    assert [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])], "training moved nothing"
    assert all(torch.equal(t, load_file(entry / "model.safetensors")[k]) for k, t in stored.items())
    # the next trial on the node gets the original weights
    assert _same(_load("causal", tiny_model, torch.bfloat16, 0, False),
                 _load("causal", tiny_model, torch.bfloat16, 0, True)) == []


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_a_full_fine_tune_owns_its_weights_and_its_reference_model_maps_the_shared_copy(tiny_model, shared_dir,
                                                                                        tmp_path):
    trainer = _build("grpo", tiny_model, {"use_peft": False, "beta": 0.04, "learning_rate": 1e-3,
                                          "per_device_train_batch_size": 4, "num_generations": 4,
                                          "max_completion_length": 8}, tmp_path)
    entry = Path(trainer.model.name_or_path)
    assert entry.parent == shared_dir and trainer.ref_model is not None
    maps = _mapped_files()
    assert {_file_of(p, maps) for p in trainer.ref_model.parameters()} == {str(entry / "model.safetensors")}
    assert {_file_of(p, maps) for p in trainer.model.parameters()} == {None}  # its own: the optimizer writes it
    assert _same(trainer.ref_model, _load("causal", tiny_model, torch.bfloat16, 0, False)) == []


# -- cleaning up -------------------------------------------------------------------------------------------------------


def test_release_removes_the_models_copies_and_sweep_the_stale_ones(tiny_model, shared_dir, tmp_path):
    bf16 = weights.shared_checkpoint(tiny_model, torch.bfloat16, AutoModelForCausalLM)
    fp16 = weights.shared_checkpoint(tiny_model, torch.float16, AutoModelForCausalLM)
    other_model = tmp_path / "other"
    shutil.copytree(tiny_model, other_model)
    other = weights.shared_checkpoint(str(other_model), torch.bfloat16, AutoModelForCausalLM)
    assert len({bf16, fp16, other}) == 3

    assert weights.release(tiny_model) > 0
    assert not bf16.exists() and not fp16.exists() and other.exists()

    # sweep: an entry no trial loaded for longer than the idle limit, one whose checkpoint is gone, and a dead
    # build's staging folder; a fresh entry stays
    old = time.time() - (weights.IDLE_HOURS + 1) * 3600
    os.utime(other / weights.LAST_USED, (old, old))
    gone_model = tmp_path / "gone"
    shutil.copytree(tiny_model, gone_model)
    gone = weights.shared_checkpoint(str(gone_model), torch.bfloat16, AutoModelForCausalLM)
    shutil.rmtree(gone_model)
    staging = shared_dir / f".x.building-{weights._host_tag(os.uname().nodename)}-999999999-abcd"
    staging.mkdir()
    os.utime(staging, (old, old))
    fresh = weights.shared_checkpoint(tiny_model, torch.bfloat16, AutoModelForCausalLM)
    weights.sweep()
    assert not other.exists() and not gone.exists() and not staging.exists() and fresh.exists()

    assert weights.release() > 0
    assert weights.entries() == []
