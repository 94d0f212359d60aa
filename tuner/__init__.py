"""tuner: find TRL training configs that are stable and fast.

Heavy libraries (torch, trl, ray, mlflow) are imported inside the functions that need them,
so ``import tuner`` and ``tuner --help`` stay instant.
"""

from tuner.errors import TunerError

__all__ = ["TunerError", "__version__"]
__version__ = "0.1.0"
