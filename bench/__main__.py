"""`python -m bench`: see bench/headline/run.py."""

import sys

from bench.headline.run import main

sys.exit(main())
