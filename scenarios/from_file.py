"""Loading a scenario or an agent from a Python file, without installing it.

A *file reference* is ``path/to/file.py:Attribute`` (a relative path is taken from the current
directory). ``parley run path/to/game.py:MyGame`` plays the scenario class ``MyGame`` of that
file, and ``--agents path/to/bot.py:MyBot`` seats the agent class ``MyBot``, while you write
them; once they work, register them as a package (``parley new scenario NAME``).

The file is imported once per process and path, as a module named after its absolute path
(``parley_file_<stem>_<hash>``, kept in ``sys.modules`` so its classes pickle and compare as one
class), and may import its neighbours only if they are installed or on ``sys.path``.

A file scenario is registered under its reference itself (:func:`file_spec`): it has no scripted
baselines unless its class names them in a ``baselines`` mapping (seat -> ``"module:Class"``
or a file reference), so give ``--agents`` for every seat otherwise.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from parley.protocols.errors import ConfigError

__all__ = ["FILE_REF", "file_module", "is_file_ref", "load_file_attr"]

FILE_REF = re.compile(r"^(?P<path>[^:\s][^:]*\.py):(?P<attr>[A-Za-z_][\w.]*)$")
"""``path.py:Attribute`` (the attribute may be dotted)."""


def is_file_ref(ref: str) -> bool:
    """Whether ``ref`` is a file reference (``path.py:Attribute``)."""
    return FILE_REF.match(ref) is not None


def file_module(path: str | Path) -> Any:
    """The module of the Python file at ``path``, imported once per process and path."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ConfigError(f"no Python file {str(path)!r} (looked at {file}); check the path")
    digest = hashlib.sha1(str(file).encode()).hexdigest()[:12]
    name = f"parley_file_{re.sub(r'[^0-9A-Za-z_]', '_', file.stem)}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    found = importlib.util.spec_from_file_location(name, file)
    if found is None or found.loader is None:
        raise ConfigError(f"{file} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module  # before running it: dataclasses and pickling look it up
    try:
        found.loader.exec_module(module)
    except Exception as exc:  # the user's file failed to import: say where, keep the cause
        del sys.modules[name]
        raise ConfigError(f"importing {file} failed: {type(exc).__name__}: {exc}") from exc
    return module


def load_file_attr(ref: str) -> Any:
    """The attribute named by the file reference ``ref`` (module docstring)."""
    matched = FILE_REF.match(ref)
    if matched is None:
        raise ConfigError(f"{ref!r} is not of the form 'path/to/file.py:Name'")
    obj: Any = file_module(matched["path"])
    for part in matched["attr"].split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{matched['path']} has no attribute {matched['attr']!r}")
        obj = getattr(obj, part)
    return obj
