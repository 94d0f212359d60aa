"""The headline, ``python -m bench`` (bench/__main__.py runs ``run.main``): tuner against a hand-written Ray Tune +
OptunaSearch (TPE) + ASHA search (``anchor_asha``) side by side in one run, each search in a fresh process
(``tuner_search``, ``reference``), judged in hand or not (``headline``), trials to target on lookups
(``efficiency``, ``lookup_targets``), and its sections of bench/RESULTS.md (``report``), which take the studies'
target lines and recorded sections from their own modules."""
