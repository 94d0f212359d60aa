"""GRPO's sampling failing on non-finite probabilities is the trial diverging, on a CPU and on CUDA."""

from pathlib import Path

import pytest

from tuner.trial._run import sampling_diverged

GENERATION = str(Path("site-packages") / "transformers" / "generation" / "utils.py")
ELSEWHERE = str(Path("site-packages") / "torch" / "nn" / "functional.py")
CUDA_ASSERT = ("CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported at some "
               "other API call, so the stacktrace below might be incorrect.")


def _raised(message: str, filename: str) -> BaseException:
    """An exception raised from code that claims ``filename``: its traceback names that file, as a real one does."""
    code = compile(f"raise RuntimeError({message!r})", filename, "exec")
    try:
        exec(code, {})
    except RuntimeError as error:
        return error
    raise AssertionError("not raised")


def test_cpu_multinomial_message_is_divergence_anywhere():
    error = _raised("probability tensor contains either `inf`, `nan` or element < 0", ELSEWHERE)
    assert sampling_diverged(error, steps_done=0)


@pytest.mark.parametrize("filename, steps, diverged", [
    (GENERATION, 12, True),  # after training steps, inside the decoding loop: the policy's probabilities
    (GENERATION, 0, False),  # before any step the weights are the model's own: a real crash
    (ELSEWHERE, 12, False),  # outside generation: not sampling
])
def test_cuda_device_side_assert_in_generation_after_a_step(filename, steps, diverged):
    assert sampling_diverged(_raised(CUDA_ASSERT, filename), steps_done=steps) is diverged


def test_other_errors_are_not_divergence():
    assert not sampling_diverged(_raised("shape mismatch", GENERATION), steps_done=12)
