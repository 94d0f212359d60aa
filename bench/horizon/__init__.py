"""Stable for how long (issue 33): ground truth for the forecast, configs run to the trial length and to 25x it
(``horizon``, and ``horizon_run.sh`` on a lent machine's CPUs); classifiers fitted on those records (``horizon_fit``);
the search's own picks run 25x their trial (``horizon_picks``); GRPO's KL anchor run 25x (``anchor``). Each writes
its part of RESULTS' "Stable for how long" section; the records are in bench/recorded/horizon*.json.gz."""
