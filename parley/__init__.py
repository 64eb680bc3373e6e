"""parley: a multi-agent gym for LLMs.

The code lives in four folders at the repository's root, installed as subpackages of this
one (README "Layout", ``pyproject.toml`` ``[tool.setuptools.package-dir]``):

- :mod:`parley.protocols` (``protocols/``) — messages, the ZeroMQ bus, keys;
- :mod:`parley.scenarios` (``scenarios/``) — the PettingZoo parallel environments;
- :mod:`parley.agents` (``agents/``) — LLM, scripted and human agents;
- :mod:`parley.arena` (``arena/``) — runner, inference pool, training, viewer, bench, CLI.

This module holds only ``parley.__version__`` and imports nothing else, so that
``import parley.<anything>`` costs no more than that subpackage.
"""

from __future__ import annotations

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    # Read from the installed distribution's metadata when first asked for (a few ms that
    # ``parley --help`` and every other import need not pay).
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("parley")
        except PackageNotFoundError:
            return "0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
