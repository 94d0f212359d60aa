"""tuner.config.precision: which precisions a machine cannot run, and which it runs a real model too slowly in to
search."""

from tuner.config.precision import PRECISIONS, slow_here, unsupported


def test_float16_weights_are_left_out_for_a_real_model_on_a_cpu_only():
    # ~30 s a step against 2-4 s in fp32 on SmolLM2-135M-Instruct, one CPU thread: not worth a search's time there
    assert list(slow_here(on_gpu=False, built_here=False)) == ["fp16-pure"]
    assert "10x slower" in slow_here(on_gpu=False, built_here=False)["fp16-pure"]
    # tuner's tiny models step in milliseconds in any precision, and a GPU has float16 kernels
    assert slow_here(on_gpu=False, built_here=True) == {}
    assert slow_here(on_gpu=True, built_here=False) == {}


def test_the_slow_rule_is_the_table_s_and_apart_from_what_cannot_run():
    assert [p.name for p in PRECISIONS.values() if p.slow_on_cpu] == ["fp16-pure"]
    assert "fp16-pure" not in unsupported(on_gpu=False)
