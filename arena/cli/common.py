"""What every ``parley`` command shares: consoles that read well in a log, one-line user
errors, and the checks a command runs before it starts work (scenario arguments, an output
directory, ``llm:`` model paths, config keys).

A user error is one line on stderr, ``parley COMMAND: what is wrong; what to do``, and a
non-zero exit (2 for a bad configuration, 1 for a failure of the run or its
surroundings), never a traceback. ``PARLEY_DEBUG=1`` re-raises instead, for developers.

Imports only the standard library and ``rich`` at module level (``parley --help`` stays
fast); the checks import what they check inside.
"""

from __future__ import annotations

import dataclasses
import errno
import inspect
import os
import sys
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from parley.protocols.errors import ConfigError

if typing.TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "console",
    "error_line",
    "user_error_status",
    "check_scenario_kwargs",
    "check_out_dir",
    "check_agent_spec",
    "load_agent_kinds",
    "check_config_keys",
    "check_key_path",
    "valid_keys_hint",
    "add_peer_timeout",
    "add_scenario_and_agent_options",
]

LOG_WIDTH = 160
"""Columns of a console that is not a terminal (a log, a pipe): wide enough that the
summary tables keep their titles and labels on one line."""


def console(*, stderr: bool = False) -> Console:
    """A rich console; off a terminal it is :data:`LOG_WIDTH` wide and never wraps text
    (a piped error line stays one line)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    if tty or os.environ.get("COLUMNS"):
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=LOG_WIDTH, soft_wrap=True)


def add_peer_timeout(parser: Any) -> None:
    """The ``--peer-timeout`` flag: how long a bus peer whose connection is open may stay
    silent (busy, paused) before it is given up (``BusConfig.peer_timeout``)."""
    parser.add_argument(
        "--peer-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="seconds a peer whose connection is still open may stay silent (a busy or paused "
        "process) before it counts as gone (default 60); a peer whose connection closed is "
        "gone within a few seconds whatever this is",
    )


def add_scenario_and_agent_options(
    parser: Any, *, scenario: bool = True, agent_help: str = "option for agent-spec resolvers"
) -> None:
    """The repeatable ``KEY=VALUE`` flags (VALUE read as YAML) that
    :func:`parley.arena.cli.run.parse_assignments` reads: ``-s/--scenario-arg``, the scenario's
    keyword arguments (unless ``scenario`` is false), and ``-o/--agent-option``, options for
    the agent-spec resolvers (``agent_help`` starts its help)."""
    flags = [(("-s", "--scenario-arg"), "scenario keyword argument")] if scenario else []
    for names, what in [*flags, (("-o", "--agent-option"), agent_help)]:
        parser.add_argument(
            *names,
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"{what} (VALUE read as YAML); repeatable",
        )


def error_line(command: str, message: str) -> None:
    """``parley COMMAND: message`` as one plain line on stderr (no markup, no wrapping)."""
    text = " ".join(str(message).split())  # one line, whatever the message held
    sys.stderr.write(f"parley {command}: {text}\n")
    sys.stderr.flush()


_KNOWN_ERRNOS = {errno.EADDRINUSE, errno.EACCES, errno.EROFS, errno.ENOSPC, errno.ENOENT}
"""OS errors that are the surroundings' (a path, a port, a disk): others are shown as bugs."""


def user_error_status(exc: BaseException) -> tuple[int, str] | None:
    """``(exit status, one-line message)`` for an error that is the user's or the
    surroundings' (a bad config, a busy port, an unwritable path), else ``None``."""
    from parley.protocols.errors import ParleyError

    if isinstance(exc, ConfigError):
        return 2, str(exc)
    if isinstance(exc, ParleyError):
        return 1, str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError):  # an OSError in 3.11, usually with no message at all
        return 1, f"timed out{f': {exc}' if str(exc) else ''} (PARLEY_DEBUG=1 shows where)"
    if isinstance(exc, OSError) and (exc.filename or exc.errno in _KNOWN_ERRNOS):
        what = exc.strerror or str(exc)
        where = f"{exc.filename}: " if exc.filename else ""
        hint = {
            errno.EADDRINUSE: "; another process holds that address: stop it or pick another",
            errno.EACCES: "; pick a path or port you may use",
            errno.EROFS: "; pick a writable path",
            errno.ENOSPC: "; free some space or pick another disk",
        }.get(exc.errno or 0, "")
        return 1, f"{where}{what}{hint}"
    return None


def check_scenario_kwargs(scenario: str, kwargs: Mapping[str, Any]) -> None:
    """Build the scenario once with ``kwargs``; a bad argument raises :class:`ConfigError`
    naming the scenario's valid arguments (instead of a traceback in every episode)."""
    from parley.scenarios import spec
    from parley.scenarios.registry import load_attr

    found = spec(scenario)  # ConfigError with "did you mean" for a bad id
    cls = load_attr(found.entry_point)
    params = inspect.signature(cls).parameters
    valid = sorted(
        name
        for name, p in params.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and name != "self"
    )
    if isinstance(cls, type) and hasattr(cls, "quote_messages"):  # (every Scenario)
        valid.append("quote_messages")
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = sorted(set(kwargs) - set(valid))
    if unknown and not takes_any:
        raise ConfigError(
            f"{scenario} takes no argument {', '.join(map(repr, unknown))}; "
            f"its arguments: {', '.join(valid) or '(none)'} (-s KEY=VALUE)"
        )
    try:
        env = found.make(**kwargs)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"{scenario}: bad scenario argument ({exc}); its arguments: {', '.join(valid)}"
        ) from None
    close = getattr(env, "close", None)
    if callable(close):
        close()


def check_out_dir(out: str | os.PathLike[str]) -> Path:
    """Create ``out`` (and its parents) and check a file can be written in it."""
    path = Path(out).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".parley-write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"cannot write to --out {str(out)!r}: {reason}") from None
    return path


def expand_agent_spec(spec: str, *, build_default: bool = True) -> str:
    """``llm:~/x`` -> ``llm:/home/me/x``; the documented default model path
    (``~/.cache/parley/tiny-model``, ``$PARLEY_CACHE/tiny-model``) is built on first use;
    any other missing path is a :class:`ConfigError` saying how to make a model."""
    if not spec.startswith("llm:"):
        return spec
    path, sep, query = spec[4:].partition("?")
    expanded = os.path.expanduser(path)
    local = expanded.startswith(("/", ".")) or path.startswith("~")
    if local and not Path(expanded).exists():
        from parley.arena.inference.models.tiny import default_model_dir

        if build_default and Path(expanded).absolute() == default_model_dir().absolute():
            from parley.arena.inference.models.tiny import ensure_tiny_model

            ensure_tiny_model(default_model_dir(), console(stderr=True))
        else:
            raise ConfigError(
                f"llm:{path}: no model at {expanded}; make one with "
                f"`parley model tiny {path}` (a tiny random model) or give a checkpoint "
                "directory (parley train writes them)"
            )
    return f"llm:{expanded}{sep}{query}"


AGENT_KIND_GROUP = "parley.agent_kinds"
"""Entry-point group of agent kinds: ``NAME = "module:resolver"`` makes ``NAME:ARG`` a spec
(:func:`parley.arena.run.agent_specs.register_agent_kind`; the resolver is imported on use)."""


def load_agent_kinds() -> None:
    """Register the agent kinds that installed packages declare in :data:`AGENT_KIND_GROUP`
    (the built-in kinds win a clash)."""
    from importlib.metadata import entry_points

    from parley.arena.run.agent_specs import AGENT_KINDS, register_agent_kind

    for ep in entry_points(group=AGENT_KIND_GROUP):
        if ep.name not in AGENT_KINDS:
            register_agent_kind(ep.name, ep.value)


def check_agent_spec(spec: str) -> str:
    """``spec`` ready to resolve: ``llm:`` paths expanded (:func:`expand_agent_spec`), and a
    ``module:Class`` whose module cannot be found refused with how to make it importable."""
    import importlib.util

    from parley.arena.run.agent_specs import AGENT_KINDS
    from parley.scenarios.from_file import is_file_ref, load_file_attr

    spec = spec.strip()
    kind, sep, _ = spec.partition(":")
    if kind == "llm":
        return expand_agent_spec(spec)
    if not sep or kind in AGENT_KINDS:
        return spec
    if is_file_ref(spec):  # path/to/file.py:Class: loaded from the file, not installed
        load_file_attr(spec)  # (a missing file or a failing import says so now)
        return spec
    try:
        found = importlib.util.find_spec(kind)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ConfigError(
            f"agent spec {spec!r}: no module {kind!r} on the import path; module:Class needs "
            "the module importable: install its package, or put its folder on PYTHONPATH "
            "(e.g. PYTHONPATH=examples parley run ... --agents custom_agent:Accommodating)"
        )
    return spec


def check_config_keys(data: Any, cls: Any, where: str = "") -> None:
    """Raise :class:`ConfigError` for a key of ``data`` that no field of the dataclass
    ``cls`` (recursively: nested dataclasses, lists of them) declares, naming the valid
    keys. Mappings typed ``dict[...]`` are free-form and not checked."""
    if not dataclasses.is_dataclass(cls) or not isinstance(data, Mapping):
        return
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            scope = f" under {where}" if where else ""
            raise ConfigError(f"unknown key {path!r}; valid keys{scope}: {', '.join(fields)}")
        _check_nested(value, hints.get(key), path)


def _check_nested(value: Any, hint: Any, path: str) -> None:
    for candidate in (hint, *typing.get_args(hint)):  # X, X | None, list[X]
        if dataclasses.is_dataclass(candidate):
            if isinstance(value, Mapping):
                check_config_keys(value, candidate, path)
            return
        if typing.get_origin(candidate) is list and isinstance(value, Sequence):
            (item,) = typing.get_args(candidate) or (None,)
            for i, element in enumerate(value):
                _check_nested(element, item, f"{path}.{i}")
            return


def check_key_path(keys: Sequence[str], cls: Any) -> None:
    """Raise :class:`ConfigError` unless the dotted override path ``keys``
    (``["pg", "lr"]``, ``["stages", "0", "max_updates"]``) names a field of the dataclass
    ``cls``; the message lists the valid keys where the path went wrong."""
    hint: Any = cls
    for depth, key in enumerate(keys):
        where = ".".join(keys[:depth])
        lists = [h for h in (hint, *typing.get_args(hint)) if typing.get_origin(h) is list]
        if lists:
            if not key.isdigit():
                raise ConfigError(f"{where} is a list: give an index, {where}.0.KEY=VALUE")
            hint = (typing.get_args(lists[0]) or (None,))[0]
            continue
        target = _dataclass_in(hint)
        if target is not None:
            fields = [f.name for f in dataclasses.fields(target)]
            if key not in fields:
                scope = f" under {where}" if where else ""
                raise ConfigError(
                    f"unknown key {'.'.join(keys[: depth + 1])!r}; valid keys{scope}: "
                    f"{', '.join(fields)}"
                )
            hint = typing.get_type_hints(target).get(key)
            continue
        return  # a free-form mapping or a scalar: the loader checks the rest


def _dataclass_in(hint: Any) -> Any:
    for candidate in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(candidate):
            return candidate
    return None


def valid_keys_hint(message: str, cls: Any) -> str:
    """For a loader's type error naming a field (msgspec: ``- at `$.pg.lr```), the valid
    keys beside it, as a suffix for the message; else ``""``."""
    import re

    found = re.search(r"`\$\.([A-Za-z0-9_.\[\]]+)`", message)
    if not found:
        return ""
    keys = re.sub(r"\[(\d+)\]", r".\1", found.group(1)).split(".")
    hint: Any = cls
    for key in keys[:-1]:
        lists = [h for h in (hint, *typing.get_args(hint)) if typing.get_origin(h) is list]
        if lists and key.isdigit():
            hint = (typing.get_args(lists[0]) or (None,))[0]
        elif (target := _dataclass_in(hint)) is not None:
            hint = typing.get_type_hints(target).get(key)
        else:
            return ""
    target = _dataclass_in(hint)
    if target is None or typing.get_origin(hint) is list:
        return ""
    where = ".".join(keys[:-1])
    fields = ", ".join(f.name for f in dataclasses.fields(target))
    return f"; valid keys{f' under {where}' if where else ''}: {fields}"
