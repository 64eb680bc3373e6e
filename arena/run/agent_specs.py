"""Agent specs: the strings that say who plays a seat (``--agents scripted,remote``).

One function, :func:`resolve_agent_spec`, turns a spec into either an
:data:`AgentFactory` (a zero-argument callable making a fresh :class:`Agent`; the runner
calls it once per seat per episode) or a :class:`RemoteSeat` (the seat is played by an
agent in another process that joins the arena over the bus).

=================  ===================================================================
spec               who plays
=================  ===================================================================
``scripted``       the seat's baseline from the scenario registry (``spec.baselines``)
``module:Class``   ``Class()`` imported from ``module`` (any :class:`Agent` subclass)
``file.py:Class``  ``Class()`` from a Python file, not installed (``path/to/file.py:Class``)
``remote``         a remote agent named ``agent-SEAT`` (``parley agent --seat SEAT``)
``remote:NAME``    a remote agent whose endpoint is named ``NAME``
``human[:tty]``    a person, in the browser page the run prints (``:tty``: the terminal)
``KIND:ARG``       the resolver registered under ``KIND`` in :data:`AGENT_KINDS`
=================  ===================================================================

Extending: add ``"KIND": "module:function"`` to :data:`AGENT_KINDS` (imported lazily, so a
heavy resolver costs nothing until used), or call :func:`register_agent_kind`. A resolver
is ``resolver(arg: str, seat: SeatContext) -> AgentFactory | RemoteSeat``; ``arg`` is the
text after ``KIND:``. ``llm:PATH`` is meant to be served this way by ``parley.agents.llm``.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl

from parley.agents.base import Agent
from parley.protocols.errors import ConfigError
from parley.scenarios.from_file import is_file_ref, load_file_attr

__all__ = [
    "AGENT_KINDS",
    "AgentFactory",
    "AgentSource",
    "RemoteSeat",
    "Resolver",
    "SeatContext",
    "load_object",
    "register_agent_kind",
    "remote_peer_name",
    "resolve_agent_spec",
    "seat_specs",
]

AgentFactory = Callable[[], Agent]
"""Makes a fresh agent for one seat of one episode."""


@dataclass(frozen=True)
class RemoteSeat:
    """The seat is played by the bus peer named ``peer`` (another process or host)."""

    peer: str


AgentSource = AgentFactory | RemoteSeat


@dataclass(frozen=True)
class SeatContext:
    """What a resolver may need to know about the seat it builds an agent for."""

    scenario: str
    """Scenario id the run plays."""
    seat: str
    """The seat (PettingZoo agent name)."""
    baseline: str = ""
    """The seat's scripted baseline as ``"module:Class"`` ("" when the scenario has none)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """``RunConfig.agent_options``: free-form settings for resolvers (pool address, ...)."""
    join_timeout: float | None = None
    """``RunConfig.join_timeout`` (``--join-timeout``): seconds players in other processes
    may take to join; None outside a run."""


Resolver = Callable[[str, SeatContext], AgentSource]


def remote_peer_name(seat: str) -> str:
    """Default bus name of the remote agent that plays ``seat``."""
    return f"agent-{seat}"


def load_object(ref: str) -> Any:
    """Import ``"package.module:attr"`` and return the attribute; a file reference
    ``"path/to/file.py:attr"`` loads that file (:mod:`parley.scenarios.from_file`)."""
    if is_file_ref(ref):
        return load_file_attr(ref)
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{ref!r} is not of the form 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} (from {ref!r}): {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ConfigError(f"module {module_name!r} has no attribute {attr!r}") from exc


def agent_class_factory(ref: str) -> AgentFactory:
    """A factory calling ``Class()`` for ``ref = "module:Class"``, checked to be an Agent."""
    cls = load_object(ref)
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise ConfigError(f"{ref} is not a subclass of parley.agents.base.Agent")
    factory: AgentFactory = cls
    return factory


def _scripted(arg: str, seat: SeatContext) -> AgentSource:
    if not seat.baseline:
        raise ConfigError(
            f"scenario {seat.scenario} registers no scripted baseline for seat {seat.seat!r}; "
            "give an agent spec such as module:Class for that seat"
        )
    return agent_class_factory(seat.baseline)


def _remote(arg: str, seat: SeatContext) -> AgentSource:
    return RemoteSeat(arg or remote_peer_name(seat.seat))


AGENT_KINDS: dict[str, str | Resolver] = {
    "scripted": _scripted,
    "remote": _remote,
    "llm": "parley.arena.inference.llm_spec:resolve_llm",
    "human": "parley.arena.view.human:resolve_human",
    "replicas": "parley.arena.run.ray_agents:resolve_replicas",  # replicas:N:SPEC, on Ray
}
"""Spec kind -> resolver, or ``"module:function"`` naming one (imported on first use)."""


def register_agent_kind(kind: str, resolver: str | Resolver) -> None:
    """Make ``KIND:ARG`` specs resolve through ``resolver``."""
    if not kind.isidentifier():
        raise ConfigError(f"agent kind must be an identifier, got {kind!r}")
    AGENT_KINDS[kind] = resolver


def resolve_agent_spec(spec: str, seat: SeatContext) -> AgentSource:
    """Who plays ``seat`` for ``spec``; raises :class:`ConfigError` with the fix."""
    spec = spec.strip()
    kind, _, arg = spec.partition(":")
    if kind in AGENT_KINDS:
        resolver = AGENT_KINDS[kind]
        if isinstance(resolver, str):
            resolver = load_object(resolver)
        return resolver(arg, seat)
    if ":" in spec:
        return agent_class_factory(spec)
    raise ConfigError(
        f"unknown agent spec {spec!r} for seat {seat.seat!r}; use one of "
        f"{sorted(AGENT_KINDS)} (optionally KIND:ARG) or module:Class"
    )


def seat_specs(
    scenario: str, agents: list[str] | Mapping[str, str] | None, seats: Sequence[str]
) -> dict[str, str]:
    """The agent spec of every seat from ``RunConfig.agents`` (a list in seat order or a
    mapping seat: spec); ``scripted`` where none is given."""
    if agents is None:
        return dict.fromkeys(seats, "scripted")
    if isinstance(agents, list):
        if len(agents) != len(seats):
            raise ConfigError(
                f"{scenario} has {len(seats)} seats {seats}; got {len(agents)} agent "
                "specs (give one per seat, in that order, or a mapping seat: spec)"
            )
        return dict(zip(seats, agents, strict=True))
    unknown = sorted(set(agents) - set(seats))
    if unknown:
        raise ConfigError(f"{scenario} has no seats {unknown}; its seats are {seats}")
    return {seat: agents.get(seat, "scripted") for seat in seats}


# --- fingerprints -------------------------------------------------------------------------

FULL_HASH_BYTES = 64 << 20
"""Files up to this size are hashed whole in a model folder's fingerprint; larger ones by
size, ``mtime_ns`` and three 1 MiB samples (:func:`folder_fingerprint`)."""
_SAMPLE = 1 << 20


def _file_digest(path: Path) -> str:
    """sha256 of the whole file, or of its size, mtime_ns and start / middle / end samples
    past :data:`FULL_HASH_BYTES` (a 5 GB shard costs 3 MiB of reading, not ~10 s of hashing)."""
    digest = hashlib.sha256()
    info = path.stat()  # (follows a symlink: the file it points to is what loads)
    with path.open("rb") as f:
        if info.st_size <= FULL_HASH_BYTES:
            digest.update(f.read())
            return digest.hexdigest()
        digest.update(f"{info.st_size} {info.st_mtime_ns}".encode())
        for offset in (0, info.st_size // 2, info.st_size - _SAMPLE):
            f.seek(offset)
            digest.update(f.read(_SAMPLE))
    return digest.hexdigest()


def folder_fingerprint(folder: str | Path) -> str:
    """A digest of the names, sizes and contents of the files at the top of ``folder`` (what
    ``from_pretrained`` reads: config, tokenizer, weights; hidden files and subfolders, such
    as older checkpoints, left out). Weights past :data:`FULL_HASH_BYTES` count by size,
    ``mtime_ns`` and samples: retraining rewrites every tensor and the file's mtime, and a
    copy that only changes the mtime costs a replay, never a stale result."""
    root = Path(folder).expanduser().resolve()
    digest = hashlib.sha256()
    for path in sorted(root.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        try:
            line = f"{path.name}\0{path.stat().st_size}\0{_file_digest(path)}\n"
        except FileNotFoundError:  # (a writer's temporary file, renamed away meanwhile)
            continue
        digest.update(line.encode())
    return digest.hexdigest()


_LOADED: weakref.WeakKeyDictionary[ModuleType, tuple[object, str]] = weakref.WeakKeyDictionary()
"""Module -> (its ``__spec__`` then, digest of its source file) when first fingerprinted
(right after import): the code a module object runs, whatever its file holds later (a
process imports it once). ``importlib.reload`` gives the module a new ``__spec__`` as it
runs the file again: its digest is then taken again."""


def _source_fingerprint(ref: str) -> str:
    """A digest of the source file of the class ``ref`` names, as this process loaded it:
    the class is imported here, and a module's file edited after that is not what runs here
    (the next process sees it)."""
    cls = load_object(ref)
    module = sys.modules.get(getattr(cls, "__module__", ""))
    loaded = _LOADED.get(module) if module is not None else None
    if loaded is not None and loaded[0] is getattr(module, "__spec__", None):
        return loaded[1]
    try:
        source = inspect.getsourcefile(cls)
    except TypeError:  # (a built-in class: no file)
        source = None
    if source is None or not os.path.isfile(source):
        return f"unchecked:{ref}"
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()
    if module is not None:
        _LOADED[module] = (getattr(module, "__spec__", None), digest)
    return digest


def agent_fingerprint(spec: str, baselines: Sequence[str] = ()) -> dict[str, str]:
    """What ``spec`` plays, as digests that change when the agent changes in place while its
    spec string stays the same (a league replays a match whose fingerprints differ):

    - ``llm:PATH[?...adapter=DIR]``: :func:`folder_fingerprint` of ``PATH`` and ``DIR`` when
      they are local folders (``model_folder`` / ``adapter_folder`` record that one was);
    - ``module:Class``, ``file.py:Class``: the digest of the class's source file;
    - ``scripted``: of the source files of ``baselines`` (the seats' ``module:Class``);
    - ``replicas:N:SPEC``: ``SPEC``'s; anything else the parley version.
    """
    spec = spec.strip()
    kind, _, arg = spec.partition(":")
    if kind == "llm":
        path, _, query = arg.partition("?")
        options = dict(parse_qsl(query))  # (as llm_spec reads it)
        out = {}
        for key, folder in (("model", path), ("adapter", options.get("adapter", ""))):
            if folder and Path(folder).expanduser().is_dir():
                out[key] = folder_fingerprint(folder)
                out[f"{key}_folder"] = folder
        return out  # (a hub id or a served model name: nothing here to check)
    if kind == "scripted":
        # (a seat without a baseline: the run says so, with the fix)
        return {ref: _source_fingerprint(ref) for ref in sorted(set(baselines) - {""})}
    if kind == "replicas":
        return agent_fingerprint(arg.partition(":")[2], baselines)
    if kind not in AGENT_KINDS and ":" in spec:
        return {"source": _source_fingerprint(spec)}
    from parley import __version__

    return {"parley": str(__version__)}
