"""Which keys ``trl <trainer> --config FILE`` accepts, what a refused key is called now, and which settings cannot
run on this machine.

    check_keys("my.yaml", raw, "grpo")     # every bad key named in one TunerError, renamed ones with their new name
    launch_keys()                           # keys TRL hands to `accelerate launch` (num_processes, mixed_precision ...)
    cannot_run(params, on_gpu=False)        # [Substitution("use_liger_kernel", "liger-kernel is not installed", False)]

TRL's CLI (trl/cli/commands/training.py) parses the file with its dataclasses (the trainer's script arguments, its
config, ``ModelConfig``, ``DatasetMixtureConfig``) and passes every key they do not know to ``accelerate launch``
as ``--key value``; accelerate's own parser then refuses what it does not know either. A key is accepted when one
of the two takes it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from tuner.config import trainers
from tuner.errors import TunerError

__all__ = ["RENAMED", "Substitution", "cannot_run", "check_keys", "launch_keys", "parser_fields"]

# Keys TRL and transformers used to take, and what to write now. Each names the release that changed it.
RENAMED: dict[str, str] = {
    "torch_dtype": "TRL and transformers now call it dtype (transformers 4.56, TRL's ModelConfig)",
    "evaluation_strategy": "transformers now calls it eval_strategy (renamed in 4.41, removed in 4.46)",
    "max_seq_length": "TRL's SFTConfig now calls it max_length (TRL 0.20)",
    "no_cuda": "transformers now calls it use_cpu",
    "per_gpu_train_batch_size": "transformers now calls it per_device_train_batch_size",
    "per_gpu_eval_batch_size": "transformers now calls it per_device_eval_batch_size",
    "push_to_hub_model_id": "transformers now calls it hub_model_id",
    "push_to_hub_organization": "transformers now takes the organisation in hub_model_id (ORG/NAME)",
    "push_to_hub_token": "transformers now calls it hub_token",
    "use_liger": "TRL now calls it use_liger_kernel",
    "use_liger_loss": "TRL now calls it use_liger_kernel",
    "gradient_checkpointing_use_reentrant": "write gradient_checkpointing_kwargs: {use_reentrant: ...} instead",
    "vllm_device": "TRL 1.x has no vllm_device: vllm_mode (server or colocate) says where vLLM runs",
    "overwrite_output_dir": "transformers 5 removed it (resume_from_checkpoint replaces it): remove it",
    "logging_dir": "transformers 5 removed it: remove it (TensorBoard reads TENSORBOARD_LOGGING_DIR)",
    "max_prompt_length": "TRL 1.x removed it (dpo in 0.2x, grpo in 1.0): filter out long prompts in your dataset "
                         "before training instead",
    "warmup_ratio": "transformers 5 folded it into warmup_steps: a float below 1 there is the ratio (warmup_steps: "
                    "0.1)",
    "chat_template": "not a TRL key: TRL reads a template from a file or model named in chat_template_path (sft, "
                     "reward)",
    "dataset_mixture": "alignment-handbook's key; TRL's own is datasets: (a list of path, name, split, columns, "
                       "fraction)",
}
# Keys of the training scripts of two widely copied recipe collections (huggingface/open-r1 and
# alignment-handbook), which add their own script arguments to TRL's: `trl <trainer>` does not take them.
RECIPE_KEYS = frozenset({
    "system_prompt", "callbacks", "benchmarks", "hub_model_revision", "push_to_hub_revision",
    "wandb_entity", "wandb_project", "wandb_run_group", "wandb_log_unique_prompts", "dataset_prompt_column",
    "dataset_mixer", "dataset_splits", "preprocessing_num_workers", "auto_insert_empty_system_msg",
    "truncation_side", "code_language", "code_eval_test_batch_size", "code_eval_scoring_mode",
    "parallel_code_exec_per_proc", "e2b_router_url", "morph_router_url", "code_provider", "ioi_provider",
    "max_completion_len", "soft_punish_cache", "cosine_min_value_wrong", "cosine_max_value_wrong",
    "cosine_min_value_correct", "cosine_max_value_correct", "cosine_max_len", "repetition_n_grams",
    "repetition_max_penalty", "enforce_same_language",
})


@functools.cache
def parser_fields(entry: trainers.Adapter) -> frozenset[str]:
    """Every key the dataclasses of ``trl <trainer>``'s parser take (``env`` included: TRL sets those variables)."""
    parser = importlib.import_module(entry.script).make_parser()
    return frozenset({f.name for kind in parser.dataclass_types for f in dataclasses.fields(kind)} | {"env"})


@functools.cache
def launch_keys() -> frozenset[str]:
    """Keys ``trl`` passes on to ``accelerate launch`` and accelerate takes (its ``--name`` options), and TRL's own
    ``accelerate_config`` (a config file or one of TRL's named ones)."""
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    names = {s[2:] for action in parser._actions for s in action.option_strings if s.startswith("--")}
    return frozenset((names - {"help"}) | {"accelerate_config"})


def _why(key: str, trainer: str, known: frozenset[str]) -> str:
    if key in RENAMED:
        return RENAMED[key]
    others = [name for name, entry in trainers.ADAPTERS.items() if name != trainer and key in parser_fields(entry)]
    if others:
        return f"a setting of trl {others[0]}, not of trl {trainer} (or pass --trainer {others[0]})"
    if key in RECIPE_KEYS:
        return (f"a setting of open-r1's or alignment-handbook's own training scripts, not of trl {trainer}: remove "
                "it (or run their script)")
    close = difflib.get_close_matches(str(key), sorted(known | launch_keys()), n=1, cutoff=0.8)
    return f"unknown; did you mean {close[0]}?" if close else "unknown: remove it"


def check_keys(where: str, raw: dict[str, Any], trainer: str) -> None:
    """Refuse the file in one line naming every key ``trl <trainer> --config`` would refuse, each with what to do."""
    known = parser_fields(trainers.adapter(trainer))
    bad = [key for key in raw if key not in known and key not in launch_keys()]
    if not bad:
        return
    listed = "; ".join(f"{key}: {_why(key, trainer, known)}" for key in bad)
    count = "1 key" if len(bad) == 1 else f"{len(bad)} keys"
    raise TunerError(f"{where}: `trl {trainer} --config` would refuse {count}: {listed}")


@dataclass(frozen=True)
class Substitution:
    """A setting of their file that cannot run here, and what the trials run instead (``None``: the key left out)."""

    key: str
    why: str
    instead: Any

    def describe(self) -> str:
        runs = "without it" if self.instead is None else f"with {self.key}: {self.instead}"
        return f"{self.key}: {self.why}; the trials run {runs} (your file keeps it)"


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


# Optimizers of transformers' OptimizerNames that need bitsandbytes (8-bit and paged states).
def _bnb_optimizer(name: str) -> bool:
    return "bnb" in name or "8bit" in name or name.startswith(("paged_", "lion_", "ademamix"))


def cannot_run(params: dict[str, Any], on_gpu: bool) -> list[Substitution]:
    """The settings of a trial's params this machine cannot run (a package missing, or CUDA needed), each with what
    trial 0 runs instead; said before any trial starts, never found as a crash."""
    out: list[Substitution] = []
    quantized = [k for k in ("load_in_4bit", "load_in_8bit") if params.get(k)]
    if quantized and (not on_gpu or _missing("bitsandbytes")):
        why = ("needs a CUDA GPU (bitsandbytes quantization)" if not on_gpu
               else "needs bitsandbytes, which is not installed")
        out += [Substitution(k, why + ": the base weights load unquantized", None) for k in quantized]
    if params.get("use_liger_kernel") and (not on_gpu or _missing("liger_kernel")):
        why = "Liger's Triton kernels need a CUDA GPU" if not on_gpu else "liger-kernel is not installed"
        out.append(Substitution("use_liger_kernel", why, False))
    if params.get("use_vllm") and (not on_gpu or _missing("vllm")):
        why = "vLLM needs a CUDA GPU" if not on_gpu else "vllm is not installed"
        out.append(Substitution("use_vllm", why + ": completions are generated with transformers", False))
    optim = str(params.get("optim") or "")
    if optim and _bnb_optimizer(optim) and (not on_gpu or _missing("bitsandbytes")):
        why = "needs bitsandbytes on a CUDA GPU" if not on_gpu else "needs bitsandbytes, which is not installed"
        out.append(Substitution("optim", f"{optim} {why}", "adamw_torch"))
    attention = str(params.get("attn_implementation") or "")
    if attention.startswith("flash_attention") and (not on_gpu or _missing("flash_attn")):
        why = "needs a CUDA GPU" if not on_gpu else "needs flash-attn, which is not installed"
        out.append(Substitution("attn_implementation", f"{attention} {why}", "sdpa"))
    if params.get("deepspeed") and _missing("deepspeed"):
        out.append(Substitution("deepspeed", "deepspeed is not installed", None))
    return out
