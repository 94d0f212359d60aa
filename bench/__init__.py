"""bench: tuner measured against what users write today, and the studies behind the figures docs/ and README.md
quote. A package of its kinds, each a folder: common/ (bench/RESULTS.md's writer, which every kind shares),
headline/ (``python -m bench``), studies/ (a run each: warm start, slots, set-up time, a real model, distributed,
the default search, the tiny pretrained model), horizon/ (ground truth for the forecast, fits, the search's picks
run long), gpu/ (the prepared GPU run and its shell helpers) and recorded/ (the data files the runs wrote). The
imports run one way, studies -> common, gpu -> studies, headline -> gpu and studies, horizon -> headline, with no
circle (tests/unit/layout/test_layout.py); bench/README.md says which command writes which RESULTS section."""
