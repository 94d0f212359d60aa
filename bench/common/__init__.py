"""What every kind of bench shares: bench/RESULTS.md's writer (``results``): the machine and library versions a run
records, the load average beside them, a section put into RESULTS.md in place of its last version
(``replace_section``), the table helpers the sections share and where bench keeps its files (``RECORDED``: the data
in bench/recorded/). It imports nothing else of bench, so every other kind (headline, studies, horizon, gpu) may
import it."""
