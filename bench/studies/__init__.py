"""The studies: runs of their own beside the headline, each a command (``python -m bench.studies.<name>``) that
records its figures in bench/recorded/ and renders its own RESULTS section or target line: the warm start
(``warm_start``), slot time with the node's trial launcher (``slots``), per-trial set-up time (``setup_time``), a
real model's shape (``real_model``, on ``shapes``' Qwen2.5-0.5B shape), a real pretrained model (``smollm2``),
distributed trials (``distributed``), the default search (``default_search``) and the tiny pretrained model's real
build (``tiny_pretrained``). They import bench.common only."""
