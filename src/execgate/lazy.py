"""Package names imported on first use (PEP 562), so a front end pays only for the modules it
touches (start-up time): ``__getattr__ = lazy_exports(__name__, globals(), {"Name": "module"})``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, namespace: dict[str, Any], homes: Mapping[str, str]
) -> Callable[[str], object]:
    """A module ``__getattr__`` that finds ``name`` in ``package.<homes[name]>`` and keeps it
    in ``namespace`` (the package's globals), so the lookup runs once per name."""

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    return __getattr__
