"""The scenario registry: ids ``family/name-vN`` mapped to specs with ``"module:Class"`` strings.

Importing this module imports no scenario module: a spec names its class and its baseline
agents as strings, resolved only by :func:`make` (and by the runner, for baselines).

A version of a scenario is a class named ``<Game>V<n>`` whose ``metadata["name"]`` is its id,
its spec (baselines, one-line description) declared beside it by the :func:`registered`
decorator. The built-in ones are registered, without importing their modules, from
``catalog.json``, which ``python -m parley.scenarios.catalog`` writes from those decorators
(tests/scenarios/test_registry.py fails while it is stale, and :meth:`ScenarioSpec.make`
refuses a class registered otherwise than it declares).
Third-party packages add scenarios through the ``parley.scenarios`` entry-point group; each
entry point resolves to a :class:`ScenarioSpec`, a list of them (:func:`spec_of` of each
version class), or a callable that returns them (or calls :func:`register` itself). Entry
points are loaded the first time the registry is looked up.

An id without its version (``negotiation/deal-or-no-deal``) names the latest registered
version of that game, as in Gymnasium: :func:`spec` and :func:`make` resolve it and warn once
per process with a one-line :class:`LatestVersionNote` saying which version was taken. Pin the
version (``-vN``) for reproducible runs; the latest version is the one with the safest rules
(each version fixes a way the one before could be gamed).

    >>> from parley.scenarios import make
    >>> env = make("negotiation/deal-or-no-deal-v0", max_turns=10)
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import json
import pkgutil
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from parley.protocols.errors import ConfigError
from parley.scenarios.from_file import is_file_ref, load_file_attr

__all__ = [
    "ENTRY_POINT_GROUP",
    "ScenarioSpec",
    "register",
    "registered",
    "spec_of",
    "make",
    "spec",
    "registry",
    "load_attr",
    "resolve_id",
    "versions",
    "LatestVersionNote",
]

ENTRY_POINT_GROUP = "parley.scenarios"
_ID = re.compile(r"^[a-z0-9_]+/[a-z0-9][a-z0-9_-]*-v\d+$")
_UNVERSIONED = re.compile(r"^[a-z0-9_]+/[a-z0-9][a-z0-9_-]*$")
_VERSION = re.compile(r"-v(\d+)$")
# A game of an outside library (parley.scenarios.imported), resolved on first use.
_IMPORTED = re.compile(r"^[a-z]+:[^\s:][^\s]*$")


class LatestVersionNote(UserWarning):
    """An id without a version was resolved to the game's latest version (one per id)."""


_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclasses.dataclass(frozen=True)
class ScenarioSpec:
    """How to build one registered scenario.

    ``baselines`` maps each seat to the scripted agent class that plays it (``"module:Class"``,
    constructed with no arguments); the key ``"*"`` covers seats not named (scenarios whose
    number of seats is an argument). Use :meth:`baseline_for` rather than indexing.
    """

    id: str
    entry_point: str
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    baselines: Mapping[str, str] = dataclasses.field(default_factory=dict)
    description: str = ""

    def __post_init__(self) -> None:
        if not _ID.match(self.id) and not _IMPORTED.match(self.id) and not is_file_ref(self.id):
            raise ConfigError(
                f"scenario id {self.id!r} must look like 'family/name-vN' "
                "(lower case, a version suffix)"
            )
        for ref in (self.entry_point, *self.baselines.values()):
            if not _REF.match(ref) and not is_file_ref(ref):
                raise ConfigError(f"{ref!r} in spec {self.id} must be 'package.module:Attribute'")
        object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))
        object.__setattr__(self, "baselines", MappingProxyType(dict(self.baselines)))

    @property
    def family(self) -> str:
        """``negotiation`` of ``negotiation/...``; the library of ``openspiel:...``."""
        return re.split("[/:]", self.id, maxsplit=1)[0]

    @property
    def game(self) -> str:
        """The id without its version (``negotiation/deal-or-no-deal``)."""
        return _VERSION.sub("", self.id)

    @property
    def version(self) -> int:
        """The ``N`` of ``-vN`` (0 for an imported game's id, which carries none)."""
        found = _VERSION.search(self.id)
        return int(found.group(1)) if found else 0

    def baseline_for(self, seat: str) -> str:
        """The ``"module:Class"`` of the scripted agent for ``seat``."""
        ref = self.baselines.get(seat, self.baselines.get("*"))
        if ref is None:
            raise ConfigError(f"{self.id} names no baseline agent for seat {seat!r}")
        return ref

    def make(self, **kwargs: Any) -> Any:
        """Build the scenario with this spec's kwargs, overridden by ``kwargs``."""
        cls = _CLASSES.get(self.entry_point)
        if cls is None:  # resolved once per entry point (a runner makes one env per episode)
            cls = load_attr(self.entry_point)
            declared = vars(cls).get(_DECLARED) if isinstance(cls, type) else None
            if declared is not None and declared.id == self.id and declared != self:
                raise ConfigError(
                    f"{self.id} is registered otherwise than its class declares "
                    f"({self.entry_point}); for a built-in scenario, run "
                    "`python -m parley.scenarios.catalog` to rewrite the catalog"
                )
            _CLASSES[self.entry_point] = cls
        if "quote_messages" in kwargs or "quote_messages" in self.kwargs:
            merged = {**self.kwargs, **kwargs}
            quote = merged.pop("quote_messages")
            env = cls(**merged)
            if not hasattr(env, "quote_messages") or not isinstance(quote, bool):
                raise ConfigError(
                    f"quote_messages must be true or false (got {quote!r}) and applies to "
                    f"parley Scenario subclasses ({self.id} is {type(env).__name__})"
                )
            env.quote_messages = quote
            return env
        return cls(**{**self.kwargs, **kwargs}) if self.kwargs else cls(**kwargs)


_REGISTRY: dict[str, ScenarioSpec] = {}
_CLASSES: dict[str, Any] = {}  # entry point -> what it names, once loaded
_entry_points_loaded = False
_DECLARED = "_registered_spec"  # the class attribute where @registered keeps its spec

CATALOG = Path(__file__).with_name("catalog.json")
"""The built-in scenarios' specs, written from their decorators by
``python -m parley.scenarios.catalog``."""

BUILTIN_FAMILIES = ("negotiation", "collaboration", "tool_use", "code")
"""The subpackages of :mod:`parley.scenarios` whose modules hold built-in scenarios."""

_Class = TypeVar("_Class", bound=type)


def register(
    id: str,
    entry_point: str,
    *,
    kwargs: Mapping[str, Any] | None = None,
    baselines: Mapping[str, str] | None = None,
    description: str = "",
    override: bool = False,
) -> ScenarioSpec:
    """Register a scenario; re-registering an id raises unless ``override=True``."""
    new = ScenarioSpec(id, entry_point, kwargs or {}, baselines or {}, description)
    _add(new, override=override)
    return new


def registered(
    *,
    baselines: Mapping[str, str],
    description: str,
    kwargs: Mapping[str, Any] | None = None,
) -> Callable[[_Class], _Class]:
    """Class decorator: declare, beside the class, the spec it is registered with.

    The spec's id is the class's ``metadata["name"]``, its entry point the class itself
    (``"module:Class"``); ``baselines``, ``description`` and ``kwargs`` are those of
    :func:`register`. Declaring registers nothing, so importing the module has no effect on
    the registry: the built-in scenarios are registered from :data:`CATALOG`, a package's
    through its entry point (which returns :func:`spec_of` of each version), a file's
    (``parley run game.py:GameV0``) under its reference with the declared baselines. The
    class's ``__doc__`` becomes its module's docstring, so ``help(env)`` shows the scenario's
    page.
    """

    def decorate(cls: _Class) -> _Class:
        declared = ScenarioSpec(
            cls.metadata["name"],  # type: ignore[attr-defined]
            f"{cls.__module__}:{cls.__qualname__}",
            kwargs or {},
            baselines,
            description,
        )
        setattr(cls, _DECLARED, declared)
        cls.__doc__ = sys.modules[cls.__module__].__doc__
        return cls

    return decorate


def spec_of(cls: type) -> ScenarioSpec:
    """The spec declared by :func:`registered` on ``cls`` itself (not on a base class)."""
    declared = vars(cls).get(_DECLARED)
    if not isinstance(declared, ScenarioSpec):
        raise ConfigError(
            f"{cls.__qualname__} declares no spec; decorate it with "
            "@parley.scenarios.registered(baselines=..., description=...)"
        )
    return declared


def builtin_specs() -> list[ScenarioSpec]:
    """The specs the built-in scenario classes declare (:func:`registered`), sorted by id.

    Imports every module of :data:`BUILTIN_FAMILIES`: for writing and checking
    :data:`CATALOG`, not for listing (:func:`registry` reads the catalog).
    """
    found: dict[str, ScenarioSpec] = {}
    for family in BUILTIN_FAMILIES:
        package = importlib.import_module(f"{__package__}.{family}")
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for value in vars(module).values():
                declared = vars(value).get(_DECLARED) if isinstance(value, type) else None
                if declared is not None and value.__module__ == module.__name__:
                    found[declared.id] = declared
    return [found[i] for i in sorted(found)]


def catalog_entry(found: ScenarioSpec) -> dict[str, Any]:
    """``found`` as one entry of :data:`CATALOG` (the arguments of :class:`ScenarioSpec`)."""
    return {
        "id": found.id,
        "entry_point": found.entry_point,
        "kwargs": dict(found.kwargs),
        "baselines": dict(found.baselines),
        "description": found.description,
    }


def _load_catalog() -> None:
    for entry in json.loads(CATALOG.read_text(encoding="utf-8")):
        _add(ScenarioSpec(**entry))


def _add(new: ScenarioSpec, *, override: bool = False) -> None:
    if new.id in _REGISTRY and not override and _REGISTRY[new.id] != new:
        raise ConfigError(
            f"scenario {new.id} is already registered; bump its version or pass override=True"
        )
    _REGISTRY[new.id] = new


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        loaded = point.load()
        found = loaded() if callable(loaded) and not isinstance(loaded, ScenarioSpec) else loaded
        if found is None:
            continue  # the callable registered its scenarios itself
        specs: Iterable[Any] = [found] if isinstance(found, ScenarioSpec) else found
        for item in specs:
            if not isinstance(item, ScenarioSpec):
                raise ConfigError(
                    f"entry point {point.name} = {point.value} in group {ENTRY_POINT_GROUP} "
                    f"gave a {type(item).__name__}; it must give ScenarioSpec values"
                )
            _add(item)


def versions(game: str) -> list[ScenarioSpec]:
    """The registered versions of ``game`` (an id without ``-vN``), oldest first."""
    _load_entry_points()
    found = [s for s in _REGISTRY.values() if s.game == game]
    return sorted(found, key=lambda s: s.version)


_noted: set[str] = set()  # unversioned ids already resolved with a note in this process


def resolve_id(id: str) -> str:
    """``id`` itself if it carries a version; else the id of the game's latest version.

    The first resolution of each unversioned id in a process warns (:class:`LatestVersionNote`,
    one line naming the version); an unknown game is left as given (:func:`spec` raises).
    """
    if not _UNVERSIONED.match(id):
        return id
    found = versions(id)
    if not found:
        return id
    latest = found[-1].id
    if id not in _noted:
        _noted.add(id)
        warnings.warn(
            f"{id} resolved to its latest version {latest}; pin it for reproducible runs",
            LatestVersionNote,
            stacklevel=_outside_this_module(),
        )
    return latest


def _outside_this_module() -> int:
    """The ``stacklevel`` of the first caller outside this module (the note points at the
    user's line, whether it came through make, spec or resolve_id)."""
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        level, frame = level + 1, frame.f_back
    return level


def spec(id: str) -> ScenarioSpec:
    """The spec registered under ``id``; an id without a version names the latest one
    (:func:`resolve_id`); the error suggests close ids."""
    found = _REGISTRY.get(id)
    if found is None and is_file_ref(id):
        return _file_spec(id)
    if found is None and _IMPORTED.match(id):
        # LIBRARY:GAME: the adapter's spec, imported only now (no cost when unused).
        from parley.scenarios.imported import is_imported, resolve

        if is_imported(id):
            return resolve(id)
    if found is None:
        _load_entry_points()
        found = _REGISTRY.get(resolve_id(id))
    if found is None:
        close = difflib.get_close_matches(id, list(_REGISTRY), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `parley list` shows them"
        raise ConfigError(f"no scenario registered as {id!r}{hint}")
    return found


_FILE_SPECS: dict[str, ScenarioSpec] = {}  # kept apart: registry() lists installed ones


def _file_spec(ref: str) -> ScenarioSpec:
    """The spec of the scenario class of a file (:mod:`parley.scenarios.from_file`), made on
    first use; baselines and description those the class declares (:func:`registered`), else
    its ``baselines`` mapping, if it has one, and its docstring's first line."""
    found = _FILE_SPECS.get(ref)
    if found is None:
        cls = load_file_attr(ref)
        declared = vars(cls).get(_DECLARED) if isinstance(cls, type) else None
        if declared is not None:
            found = dataclasses.replace(declared, id=ref, entry_point=ref)
        else:
            baselines = getattr(cls, "baselines", None)
            found = ScenarioSpec(
                ref, ref, baselines=dict(baselines) if isinstance(baselines, Mapping) else {},
                description=(cls.__doc__ or "").strip().split("\n", 1)[0],
            )  # fmt: skip
        _FILE_SPECS[ref] = found
    return found


def make(id: str, **kwargs: Any) -> Any:
    """Create the scenario registered as ``id`` (without a version: the latest one);
    ``kwargs`` override the spec's defaults."""
    return spec(id).make(**kwargs)


def registry() -> dict[str, ScenarioSpec]:
    """Every registered spec (entry points included), sorted by id."""
    _load_entry_points()
    return dict(sorted(_REGISTRY.items()))


def load_attr(ref: str) -> Any:
    """Resolve ``"package.module:Attribute"`` (the attribute may be dotted), or a file
    reference ``"path/to/file.py:Attribute"`` (:mod:`parley.scenarios.from_file`)."""
    if is_file_ref(ref):
        return load_file_attr(ref)
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{ref!r} must be 'package.module:Attribute'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"cannot import {module_name!r} (from {ref!r}): {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{module_name} has no attribute {attr!r} (from {ref!r})")
        obj = getattr(obj, part)
    return obj


_load_catalog()
