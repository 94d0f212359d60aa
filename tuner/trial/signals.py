"""Early-warning readings inside a trial, taken on sampled steps, cheap enough to leave on in every trial.

    readings = Signals(precision="fp16-mixed", every=5)
    readings.attach(model)                      # forward hooks on the decoder layers, the final norm and the head
    readings.begin_step(step, model)            # on a sampled step: arm the hooks, keep a sample of the weights
    row.update(readings.end_step(step, model))  # {"headroom": 0.38, "headroom_site": -2, "weight_norm": ..., ...}

What each reading is (the forecast, tuner.verdicts.forecast, projects them):

- ``headroom``: the largest |value| out of a decoder layer, the final norm or the head in the step's training
  forward pass, as a share of the largest finite value of the dtype the trial computes in (float16: 65504). 1.0
  is overflow. ``headroom_site`` says where: the decoder layer's index, -1 the final norm, -2 the head (logits);
  ``headroom_logits`` is the head's own share, where the trainer calls the head (TRL 1.16's SFT, DPO and GRPO
  compute log-probabilities from the final norm's output and the head's weight in chunks, without calling it:
  there the final norm is the last site read; reward models' score head is read).
- ``weight_norm``: the L2 norm of the trainable weights after the step (its growth is a trend the forecast reads).
- ``update_ratio``: the step's mean |change| of a fixed sample of the trainable weights over their mean |value|;
  ``update_lost``: the share of that sample the step left exactly unchanged. With half-precision weights an
  update below half the dtype's resolution (bfloat16: 2^-8 of the weight) rounds away to nothing: training
  that does not train.
- ``weights_fp16``: the share of the trainable weights stored in float16 (1.0 for an fp16-pure full fine-tune; a
  PEFT adapter kept in float32 on a float16 model reads 0). Without a float32 master copy the weights and the
  optimizer's moments live in float16: updates below its resolution round away, a squared gradient below 6e-8 is
  0, and the forecast reads it as a risk of its own.

Only grad-enabled forward passes are read (the training forward; not GRPO's sampling or reference passes, which
run under no_grad), and only on sampled steps (the first, then every ``every``-th): one reduction per hooked
module and one device sync per sampled step. bench/gpu/gpu.py measures the cost side by side.
"""

from __future__ import annotations

from typing import Any

from tuner.config.precision import PRECISIONS
from tuner.verdicts.forecast import FINAL_NORM, HEAD

__all__ = ["SAMPLE", "Signals", "weight_sample"]

SAMPLE = 4096  # values kept of each trainable tensor: update_ratio, update_lost, and the monitor's "moved?"


def weight_sample(model) -> list[Any]:
    """The first SAMPLE values of each trainable tensor, copied as float32: compared after a step to see what moved."""
    return [p.detach().reshape(-1)[:SAMPLE].float().clone() for p in model.parameters() if p.requires_grad]


class Signals:
    def __init__(self, precision: str, every: int = 5):
        import torch

        self.every = every
        self.dtype_name = PRECISIONS[precision].compute_dtype
        self.dtype_max = float(torch.finfo(getattr(torch, self.dtype_name)).max)
        self._hooks: list[Any] = []
        self._armed = False
        self._seen: dict[int, Any] = {}  # site -> the largest |value| seen while armed (a device tensor)
        self._before: list[Any] | None = None

    def sampled(self, step: int) -> bool:
        """Whether optimizer step ``step`` (counted from 1) is read: the first, then every ``every``-th."""
        return self.every > 0 and (step == 1 or step % self.every == 0)

    # -- hooks ---------------------------------------------------------------------------------

    def attach(self, model) -> int:
        """Hook the decoder layers, the final norm and the head of ``model`` (a PEFT wrapper too); returns how
        many modules were hooked (0 for an architecture whose layers it cannot find: no headroom then)."""
        if self.every <= 0 or model is None:
            return 0
        for site, module in _sites(model):
            self._hooks.append(module.register_forward_hook(self._hook(site)))
        return len(self._hooks)

    def detach(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def _hook(self, site: int):
        import torch

        def read(module, inputs, output):
            if not self._armed or not torch.is_grad_enabled():
                return
            tensor = output if isinstance(output, torch.Tensor) else next(
                (o for o in (output if isinstance(output, (tuple, list)) else getattr(output, "values", lambda: [])())
                 if isinstance(o, torch.Tensor)), None)
            if tensor is None or not tensor.is_floating_point():
                return
            largest = tensor.detach().abs().amax().float()
            seen = self._seen.get(site)
            self._seen[site] = largest if seen is None else torch.maximum(seen, largest)

        return read

    # -- steps ---------------------------------------------------------------------------------

    def begin_step(self, step: int, model) -> None:
        """Before optimizer step ``step``: on a sampled step, arm the hooks and keep the weights' sample."""
        if not self.sampled(step) or model is None:
            return
        self._armed, self._seen = True, {}
        self._before = weight_sample(model) if _trainable(model) else None

    def end_step(self, step: int, model) -> dict[str, float]:
        """After optimizer step ``step``: the readings of a sampled step (an empty dict otherwise)."""
        if not self._armed or model is None:
            return {}
        import torch

        self._armed = False
        readings: dict[str, float] = {}
        trainable = _trainable(model)
        values = []  # one device sync for all of them
        if self._seen:
            sites = list(self._seen)
            values.append(torch.stack([self._seen[s] for s in sites]))
        if trainable:
            norms = torch._foreach_norm([p.detach() for p in trainable])
            values.append(torch.linalg.vector_norm(torch.stack([n.float() for n in norms])).reshape(1))
        if self._before is not None and trainable:
            after = [p.detach().reshape(-1)[:SAMPLE].float() for p in trainable]
            change = torch.cat([(a - b).abs() for a, b in zip(after, self._before)])
            size = torch.cat([b.abs() for b in self._before])
            values.append(torch.stack([change.mean() / size.mean().clamp_min(1e-30), (change == 0).float().mean()]))
        flat = torch.cat([v.reshape(-1).to("cpu") for v in values]).tolist() if values else []
        if self._seen:
            largest, flat = flat[:len(sites)], flat[len(sites):]
            shares = [value / self.dtype_max for value in largest]
            worst = max(range(len(sites)), key=lambda i: shares[i] if shares[i] == shares[i] else float("inf"))
            readings["headroom"] = shares[worst]
            readings["headroom_site"] = float(sites[worst])
            if HEAD in sites:
                readings["headroom_logits"] = shares[sites.index(HEAD)]
        if trainable:
            readings["weight_norm"], flat = flat[0], flat[1:]
            readings["weights_fp16"] = _fp16_share(trainable)
        if self._before is not None and trainable:
            readings["update_ratio"], readings["update_lost"] = flat[0], flat[1]
        self._seen, self._before = {}, None
        return readings


def _trainable(model) -> list[Any]:
    """The trainable weights as plain tensors; none for sharded ones (FSDP2's DTensors), which are not read."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [] if any(type(p.data).__name__ == "DTensor" for p in params) else params


def _fp16_share(trainable: list[Any]) -> float:
    import torch

    total = sum(p.numel() for p in trainable)
    return sum(p.numel() for p in trainable if p.dtype == torch.float16) / total if total else 0.0


def _sites(model) -> list[tuple[int, Any]]:
    """(site, module) pairs: each decoder layer by index, the final norm, the head; found by structure, so that
    Qwen2, Llama, Mistral, GPT-2 (``h``, ``ln_f``) and their PEFT wrappers all resolve."""
    import torch

    layers, parent = None, None
    for module in model.modules():
        for name in ("layers", "h", "blocks"):
            candidate = getattr(module, name, None)
            if isinstance(candidate, torch.nn.ModuleList) and len(candidate) > 0:
                layers, parent = candidate, module
                break
        if layers is not None:
            break
    sites: list[tuple[int, Any]] = [] if layers is None else list(enumerate(layers))
    norm = next((getattr(parent, name) for name in ("norm", "ln_f", "final_layernorm")
                 if parent is not None and isinstance(getattr(parent, name, None), torch.nn.Module)), None)
    if norm is not None:
        sites.append((FINAL_NORM, norm))
    head = None
    try:
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        head = None
    if head is None:  # a sequence classifier (reward model): its score head
        head = next((m for name, m in model.named_modules() if name.split(".")[-1] in ("score", "classifier")
                     and isinstance(m, torch.nn.Module)), None)
    if head is not None:
        sites.append((HEAD, head))
    return sites
