"""The scenario registry: ids ``family/name-vN`` mapped to specs with ``"module:Class"`` strings.

Importing this module imports no scenario module: a spec names its class and its baseline
agents as strings, resolved only by :func:`make` (and by the runner, for baselines).
Third-party packages add scenarios through the ``parley.scenarios`` entry-point group; each
entry point resolves to a :class:`ScenarioSpec`, a list of them, or a callable that returns
them (or calls :func:`register` itself). Entry points are loaded the first time the registry
is looked up.

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
import re
import sys
import warnings
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from parley.protocols.errors import ConfigError
from parley.scenarios.from_file import is_file_ref, load_file_attr

__all__ = [
    "ENTRY_POINT_GROUP",
    "ScenarioSpec",
    "register",
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
            cls = _CLASSES[self.entry_point] = load_attr(self.entry_point)
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
    first use; baselines from the class's ``baselines`` mapping, if it has one."""
    found = _FILE_SPECS.get(ref)
    if found is None:
        cls = load_file_attr(ref)
        baselines = getattr(cls, "baselines", None)
        found = _FILE_SPECS[ref] = ScenarioSpec(
            ref, ref, baselines=dict(baselines) if isinstance(baselines, Mapping) else {},
            description=(cls.__doc__ or "").strip().split("\n", 1)[0],
        )  # fmt: skip
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


# --- built-in scenarios -----------------------------------------------------------------

_NEG = "parley.scenarios.negotiation"
_COL = "parley.scenarios.collaboration"
_SCRIPTED_NEG = "parley.agents.scripted.negotiation"
_SCRIPTED_COL = "parley.agents.scripted.collaboration"

register(
    "negotiation/deal-or-no-deal-v0",
    f"{_NEG}.deal_or_no_deal:DealOrNoDeal",
    baselines={
        "player_0": f"{_SCRIPTED_NEG}:DealNegotiator",
        "player_1": f"{_SCRIPTED_NEG}:DealNegotiator",
    },
    description="Lewis et al. 2017: divide books, hats and balls valued privately; "
    "agreement only when both claims add up.",
)

register(
    "negotiation/deal-or-no-deal-v1",
    f"{_NEG}.deal_or_no_deal:DealOrNoDealV1",
    baselines={
        "player_0": f"{_SCRIPTED_NEG}:DealNegotiator",
        "player_1": f"{_SCRIPTED_NEG}:DealNegotiator",
    },
    description="Lewis et al. 2017 with the published context distribution; a claim whose "
    "halves do not add up to the counts is invalid.",
)

register(
    "negotiation/deal-or-no-deal-v2",
    f"{_NEG}.deal_or_no_deal:DealOrNoDealV2",
    baselines={
        "player_0": f"{_SCRIPTED_NEG}:DealNegotiator",
        "player_1": f"{_SCRIPTED_NEG}:DealNegotiator",
    },
    description="deal-or-no-deal-v1 with moves='proposals': offered proposals, a 'deal' "
    "claim and short prompts, for small models trained by RL (default: as v1).",
)

_TOOL = "parley.scenarios.tool_use"
_SCRIPTED_TOOL = "parley.agents.scripted.tool_use"

register(
    "tool_use/calc-chain-v0",
    f"{_TOOL}.calc_chain:CalcChain",
    baselines={"solver": f"{_SCRIPTED_TOOL}:CalcOracle"},
    description="Multi-step word problems with unit conversions; exact answers need the "
    "calculator and convert tools.",
)

register(
    "negotiation/simple-trade-v0",
    f"{_NEG}.simple_trade:SimpleTrade",
    baselines={"player_0": f"{_SCRIPTED_NEG}:Trader", "player_1": f"{_SCRIPTED_NEG}:Trader"},
    description="SPIRAL's SimpleNegotiation: trade Wood and Gold; the larger gain in "
    "inventory value wins (zero-sum).",
)
register(
    "negotiation/simple-trade-v1",
    f"{_NEG}.simple_trade_v1:SimpleNegotiation",
    baselines={
        "player_0": f"{_SCRIPTED_NEG}:SpiralTrader",
        "player_1": f"{_SCRIPTED_NEG}:SpiralTrader",
    },
    description="SPIRAL's SimpleNegotiation rule for rule ([Offer: 3 Wood -> 2 Gold], offers "
    "persist, the first invalid move loses); randomize=True varies values and stocks.",
)
register(
    "negotiation/split-the-pie-v0",
    f"{_NEG}.split_the_pie:SplitThePie",
    baselines={
        **{f"player_{i}": f"{_SCRIPTED_NEG}:PieBargainer" for i in range(3)},
        "*": f"{_SCRIPTED_NEG}:PieBargainer",
    },
    description="Baron-Ferejohn majority-rule bargaining, 3-7 players; random proposer, "
    "everyone votes, the pie shrinks by delta each round.",
)
register(
    "collaboration/referential-v0",
    f"{_COL}.referential:Referential",
    baselines={
        "speaker": f"{_SCRIPTED_COL}:CodeSpeaker",
        "listener": f"{_SCRIPTED_COL}:CodeListener",
    },
    description="Lazaridou et al. 2017: a speaker names the target among K candidates with "
    "a short code; the listener picks it. Shared reward; chance 1/K.",
)
register(
    "collaboration/hidden-profile-v0",
    f"{_COL}.hidden_profile:HiddenProfile",
    baselines={
        **{f"agent_{i}": f"{_SCRIPTED_COL}:FactSharer" for i in range(3)},
        "*": f"{_SCRIPTED_COL}:FactSharer",
    },
    description="2-5 agents each hold part of the facts; the best option shows only when "
    "they are pooled. Team reward, small cost per message.",
)

register(
    "collaboration/hidden-profile-v1",
    f"{_COL}.hidden_profile:HiddenProfileV1",
    baselines={
        **{f"agent_{i}": f"{_SCRIPTED_COL}:FactSharer" for i in range(3)},
        "*": f"{_SCRIPTED_COL}:FactSharer",
    },
    description="hidden-profile with a 'share' move and a per-agent notebook of known facts "
    "(options; the defaults play as v0).",
)

register(
    "tool_use/retail-desk-v0",
    f"{_TOOL}.retail_desk:RetailDesk",
    baselines={
        "user": f"{_SCRIPTED_TOOL}:RetailUser",
        "assistant": f"{_SCRIPTED_TOOL}:RetailOracle",
    },
    description="tau-bench-style customer service over SQLite: a user with a hidden goal, "
    "an assistant with tools; reward = final database and stated facts match the reference.",
)

register(
    "code/debug-v0",
    "parley.scenarios.code.debug:CodeDebug",
    baselines={
        "coder": "parley.agents.scripted.code:DebugOracle",
        "reviewer": "parley.agents.scripted.code:DebugReviewer",
    },
    description="Fix a buggy Python function with a sandboxed test runner; reward = share "
    "of hidden tests passed. Optional reviewer seat.",
)

# v1 of the scenarios whose v0 left a refused move's turn unused (an agent writing only
# non-ASCII never ended its episode): same seats, baselines and arguments; the refused move
# uses up the turn (parley.scenarios.refusals). Each v0 stays registered as it was.
for _v0, _v1_class in (
    ("collaboration/referential-v0", f"{_COL}.referential:ReferentialV1"),
    ("negotiation/split-the-pie-v0", f"{_NEG}.split_the_pie:SplitThePieV1"),
    ("tool_use/calc-chain-v0", f"{_TOOL}.calc_chain:CalcChainV1"),
    ("tool_use/retail-desk-v0", f"{_TOOL}.retail_desk:RetailDeskV1"),
    ("code/debug-v0", "parley.scenarios.code.debug:CodeDebugV1"),
):
    _first = _REGISTRY[_v0]
    register(
        _v0[: -len("v0")] + "v1",
        _v1_class,
        kwargs=_first.kwargs,
        baselines=_first.baselines,
        description=f"{_first.description} v1: a refused move uses up the turn.",
    )

# The next versions of the scenarios whose seats write free text to each other: the same
# game with quote_messages on (a multi-line message cannot forge a line of the scenario's
# or of another seat's in the others' observations). Each earlier version stays as it was.
for _before, _after, _class in (
    ("negotiation/simple-trade-v1", "negotiation/simple-trade-v2",
     f"{_NEG}.simple_trade_v1:SimpleNegotiationV2"),
    ("negotiation/deal-or-no-deal-v2", "negotiation/deal-or-no-deal-v3",
     f"{_NEG}.deal_or_no_deal:DealOrNoDealV3"),
    ("collaboration/hidden-profile-v1", "collaboration/hidden-profile-v2",
     f"{_COL}.hidden_profile:HiddenProfileV2"),
    ("tool_use/retail-desk-v1", "tool_use/retail-desk-v2",
     f"{_TOOL}.retail_desk:RetailDeskV2"),
):  # fmt: skip
    _spec = _REGISTRY[_before]
    register(
        _after,
        _class,
        kwargs=_spec.kwargs,
        baselines=_spec.baselines,
        description=f"{_before} with quote_messages on: a message cannot forge a line.",
    )

register(
    "tool_use/retail-desk-v3",
    f"{_TOOL}.retail_desk_v3:RetailDeskV3",
    baselines={
        "user": f"{_SCRIPTED_TOOL}:RetailUser",
        "assistant": f"{_SCRIPTED_TOOL}:RetailAnswerer",
    },
    description="retail-desk-v2 where the assistant commits to the facts in a structured "
    "answer (a message listing every candidate scored 1.0) and acts for the customer it "
    "serves only (another account is refused and penalised).",
)

register(
    "tool_use/research-team-v0",
    f"{_TOOL}.research_team:ResearchTeam",
    baselines={
        "biographer": "parley.agents.scripted.research:Researcher",
        "geographer": "parley.agents.scripted.research:Researcher",
    },
    description="Two seats search different halves of a generated encyclopedia (SQLite "
    "FTS5 BM25) and answer a two-hop question together; F1 reward per seat and team.",
)

register(
    "code/debug-v2",
    "parley.scenarios.code.debug:CodeDebugV2",
    baselines=_REGISTRY["code/debug-v1"].baselines,
    description="code/debug-v1 whose reward is the improvement over the unfixed code's "
    "share of hidden tests (submitting it unchanged paid 0.45 on average).",
)

register(
    "code/debug-v3",
    "parley.scenarios.code.debug:CodeDebugV3",
    baselines=_REGISTRY["code/debug-v2"].baselines,
    description="code/debug with 373 tasks (341 generated by bug injection), 32 hidden calls "
    "drawn per episode, type-exact; reward 1 only when all pass.",
)
