"""Lazy package exports (PEP 562): a package's public names, imported on first use.

``parley --help`` and ``parley list`` import the packages but none of the heavy modules
behind their public names; a name's module is imported when the name is first used::

    __getattr__, __dir__ = lazy_exports(__name__, {"Endpoint": "parley.protocols.bus"}, __all__)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, where: Mapping[str, str], public: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``where`` maps a public name to
    the module that defines it; a name, once imported, is cached in the package."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *public})

    return __getattr__, __dir__
