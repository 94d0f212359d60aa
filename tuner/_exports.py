"""A subpackage's public names, imported when first asked for (PEP 562), so ``import tuner.search`` stays cheap
and ``tuner --help`` answers without pydantic, Ray or torch::

    __all__, __getattr__ = lazy_exports(__name__, {"run_search": "tuner.search.driver", ...})
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, homes: dict[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """``__all__`` and the module ``__getattr__`` of ``package``: each name of ``homes`` from its module."""

    def __getattr__(name: str) -> Any:
        if name in homes:
            return getattr(importlib.import_module(homes[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return sorted(homes), __getattr__
