"""A step the fp16 GradScaler skipped is seen as skipped, also where accelerate's flag misses it (fused AdamW)."""

from types import SimpleNamespace

import pytest
import torch

from tuner.config.trainers import adapter
from tuner.trial._monitor import StepMonitor, step_skipped


@pytest.mark.parametrize("flagged, before, after, skipped", [
    (True, 65536.0, 65536.0, True),    # accelerate saw it
    (False, 65536.0, 32768.0, True),   # the scale backed off: GradScaler skipped the update
    (False, 65536.0, 65536.0, False),  # an ordinary step
    (False, 32768.0, 65536.0, False),  # the scale grew after its interval of good steps
    (False, None, 32768.0, False),     # no reading before: only the flag
])
def test_a_lower_scale_is_a_skip(flagged, before, after, skipped):
    assert step_skipped(flagged, before, after) is skipped


def test_the_monitor_reads_a_fused_optimizers_skip_from_the_scale():
    # A real Accelerator's optimizer wrapper around a fused AdamW (transformers' default on CUDA; here on the CPU),
    # with a real GradScaler: on an overflow the fused step still runs (it skips inside the kernel), so accelerate's
    # marker, set when optimizer.step runs, reads "not skipped" (accelerate #4242; an unfused AdamW reads True).
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    weight = torch.nn.Parameter(torch.ones(4))
    try:
        optimizer = torch.optim.AdamW([weight], lr=0.1, fused=True)
    except RuntimeError as error:  # a torch without the CPU fused kernel
        pytest.skip(f"no fused AdamW here: {error}")
    accelerator = Accelerator(cpu=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=65536.0)
    wrapped = AcceleratedOptimizer(optimizer, device_placement=False, scaler=scaler)
    accelerator._optimizers.append(wrapped)
    accelerator.scaler = scaler  # what Accelerator(mixed_precision="fp16") sets on CUDA
    monitor = StepMonitor(adapter("sft"), grad_scaler=True)
    monitor.trainer = SimpleNamespace(accelerator=accelerator)
    state, args = SimpleNamespace(global_step=0, max_steps=3), SimpleNamespace(max_grad_norm=1.0)
    monitor.on_train_begin(args, state, None)

    seen = []
    for step, grad in enumerate([0.5, float("inf"), 0.5], start=1):
        before = weight.detach().clone()
        wrapped.zero_grad()
        scaler.scale(weight.sum()).backward()
        weight.grad.fill_(grad)  # the scaled gradient, as the backward pass left it: inf is an overflow
        wrapped.step()
        state.global_step = step
        monitor.on_step_end(args, state, SimpleNamespace(should_training_stop=False))
        seen.append((accelerator.optimizer_step_was_skipped, monitor._pending["step_skipped"],
                     monitor._pending["loss_scale"], bool(torch.equal(before, weight.detach()))))
    # step 2 overflowed: the weights did not move and the scale halved, whatever accelerate's flag said: a skip
    assert seen[1][1:] == (1.0, 32768.0, True)
    assert [s[1] for s in (seen[0], seen[2])] == [0.0, 0.0] and not seen[0][3] and not seen[2][3]
    assert monitor._backoffs == 1
