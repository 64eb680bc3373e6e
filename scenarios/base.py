"""The scenario contract: a :class:`pettingzoo.ParallelEnv` with text spaces and parley's extras.

A scenario subclasses :class:`Scenario` and overrides the hooks in the "override these"
section; everything marked ``@final`` is machinery that every scenario shares and that the
runner, the conformance suite and the trainers rely on:

* spaces — ``gymnasium.spaces.Text`` over :data:`CHARSET` (printable ASCII and newline), built
  once per instance and returned as the same object on every call;
* randomness — one ``np.random.Generator`` per instance, seeded only by ``reset(seed=...)``;
* turn-taking — :meth:`Scenario.acting` names the seats asked to act this step. Every live
  seat still appears in ``step``'s action dict (PettingZoo's parallel API); actions of seats
  not asked to act are ignored, and ``infos[seat]["to_act"]`` tells the runner whom to ask;
* messages — :meth:`Scenario.say` delivers an agent's message into the recipients' next
  observations, on the public channel (everyone else) or privately (named recipients);
* observations — every line a hook adds (:meth:`Scenario.tell`, :meth:`Scenario.say`,
  :meth:`Scenario.announce`) is escaped into :data:`CHARSET` (``\\x00``, ``\\u00e9``,
  ``\\ud800``), so observations always lie in their space whatever an agent smuggled in
  through JSON escapes;
* caller contract — ``step``'s ``actions`` must be a mapping whose keys are live seats; anything
  else raises :class:`StepContractError` (the caller's bug, never an agent's move);
* invalid moves — an action that is not a string, is too long, uses characters outside the
  charset, or that :meth:`Scenario.play` rejects is recorded with its reason in
  ``infos[seat]["invalid"]`` and costs ``invalid_penalty`` (component ``"invalid"``); it never
  raises;
* rewards — per agent, per component: hooks call :meth:`Scenario.reward`; ``infos[seat]
  ["components"]`` holds this step's components and the step reward is their plain sum
  (re-weigh them with :mod:`parley.scenarios.shaping`).

``infos[seat]`` after every ``reset``/``step`` holds ``to_act`` (bool), ``turn`` (int),
``components`` (dict), ``view`` (the scenario's structured view of what this seat knows, for
scripted agents: nothing the seat may not know, no index into public answer tables), and when
relevant ``constraint`` (fields of :class:`parley.protocols.messages.Constraint`) and
``invalid`` (str). All values are plain JSON types: they travel on the bus as they are.

Privileged data — the reference answer a scripted *oracle* needs — never goes in ``infos``.
:meth:`Scenario.oracle` gives it; the runner adds it, under ``info[ORACLE_KEY]``, only to the
observations of in-process agents whose class sets ``privileged = True`` (never to a remote
agent). :meth:`Scenario.redraw_private` is the conformance suite's handle for proving that
nothing private leaks: it redraws what one seat may not know, and the ``noninterference``
check requires that seat's observations and infos to stay the same.

A whole scenario, to show the hooks (register it with :func:`parley.scenarios.register`)::

    class Echo(Scenario):
        metadata = {"name": "demo/echo-v0", "render_modes": ["ansi"], "is_parallelizable": True}

        def __init__(self, **kwargs):
            super().__init__(["a", "b"], **kwargs)          # seats are declared

        def new_episode(self, rng):
            self.s = {"turn": 0}                            # state; draw from rng only
            self.tell("a", "You start.")

        def acting(self):
            return [("a", "b")[self.s["turn"] % 2]]          # turn-taking

        def play(self, seat, action):
            if not action.strip():
                return "say something"                       # an invalid move, not an error
            self.say(seat, action)                           # to the other seat's next obs
            self.s["turn"] += 1
            if self.s["turn"] == 4:
                self.reward("a", "task", 1.0)
                self.finish()
            return None

        def system_prompt(self, seat):
            return "Take turns saying something."
"""

from __future__ import annotations

import dataclasses
import functools
import json
from abc import abstractmethod
from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar, final

import numpy as np
from gymnasium.spaces import Text
from pettingzoo import ParallelEnv

from parley.protocols.errors import ConfigError, ParleyError
from parley.scenarios.charset import CHARSET, printable
from parley.scenarios.events import Event, split_address
from parley.scenarios.helpers import (
    LazyRng,
    NoDraws,
    all_clean,
    check_action,
    json_default,
)
from parley.scenarios.observing import DEFAULT_PROMPT, observe

__all__ = [
    "CHARSET",
    "ORACLE_KEY",
    "Event",
    "Scenario",
    "StepContractError",
    "printable",
    "split_address",
]

ORACLE_KEY = "oracle"
"""``Observation.info`` key of :meth:`Scenario.oracle`'s data, for privileged local agents."""

_STATE_MAX_LENGTH = 1 << 24


class StepContractError(ParleyError, TypeError):
    """The caller broke ``step``'s contract (PettingZoo's parallel API): ``actions`` must be a
    mapping from live seat names (``env.agents``) to actions."""


class Scenario(LazyRng, ParallelEnv[str, str, str]):  # type: ignore[misc]
    """Base class of every parley scenario (a PettingZoo ``ParallelEnv`` over text).

    Subclasses set :attr:`metadata` (at least ``"name"``, the registry id), call
    ``super().__init__(seats, ...)`` with their declared seats, and override the hooks below.

    :attr:`metadata` keys: ``"name"`` (the registry id), ``"render_modes"``,
    ``"is_parallelizable"`` (PettingZoo's), and ``"blocking_step"`` (``True`` where ``step``
    waits on subprocesses, e.g. sandboxed code runs, for up to seconds; the runner then runs
    that scenario's steps in a worker thread so they cannot block other episodes; absent or
    ``False``: ``step`` is quick, in-process work).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "name": "scenario",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
    }
    max_action_length: ClassVar[int] = 1000
    """Longest accepted action, in characters; longer ones are invalid moves."""
    max_observation_length: ClassVar[int] = 8192
    """Longest observation; older lines are cut (marked ``[...]``) to fit."""
    default_invalid_penalty: ClassVar[float] = 0.0
    """Penalty of an invalid move unless the constructor's ``invalid_penalty`` overrides it."""
    # (np.random.default_rng(n), ~13 us, is most of a small scenario's reset.)
    new_episode_draws: bool = True
    """``False`` where :meth:`new_episode` never draws from its ``rng`` (it then gets a stand-in
    that raises on use): ``reset(seed=n)`` then seeds :attr:`rng` only when something uses it."""
    refused_move_takes_turn: ClassVar[bool] = False
    """``True``: a move the action space refuses is played as ``""`` (invalid in every
    scenario, so it uses up the seat's turn; the recorded reason stays the refusal's); every
    v1 or later sets it (:mod:`parley.scenarios.refusals`)."""
    quote_messages: bool = False
    """``True`` (``make(id, quote_messages=True)``, ``-s quote_messages=true``): every line
    after the first of a seat's message is indented by two spaces in the others'
    observations, so a message cannot forge a line of the scenario's (a notice, ``Invalid
    move:``, the prompt) or another seat's (``agent_1 (private to agent_2): ...``). Off by
    default: it changes observations, which a version keeps fixed."""
    default_max_cycles: ClassVar[int] = 1000
    """The step cap when the constructor's ``max_cycles`` is None: a guard, far above what
    every scenario's own rules allow, so that no episode runs forever (a policy looping on
    moves the rules do not count, a scenario bug); the episode is then truncated."""

    def __init__(
        self,
        seats: Sequence[str],
        *,
        render_mode: str | None = "ansi",
        max_cycles: int | None = None,
        invalid_penalty: float | None = None,
    ) -> None:
        if not seats or len(set(seats)) != len(seats):
            raise ConfigError(f"seats must be non-empty and distinct, got {list(seats)}")
        # "human" (the ansi text, printed) works everywhere: PettingZoo's render_test asks it.
        modes = [*self.metadata["render_modes"], "human"]
        if render_mode is not None and render_mode not in modes:
            raise ConfigError(
                f"render_mode {render_mode!r} is not supported; use one of {modes} or None"
            )
        if max_cycles is not None and max_cycles < 1:
            raise ConfigError(f"max_cycles must be >= 1 or None, got {max_cycles}")
        self.possible_agents: list[str] = list(seats)
        self.agents: list[str] = []
        self.render_mode = render_mode
        self.max_cycles: int = self.default_max_cycles if max_cycles is None else max_cycles
        """Truncate the episode after this many steps (invalid moves included); the
        constructor's ``None`` means :attr:`default_max_cycles`."""
        self.invalid_penalty = (
            self.default_invalid_penalty if invalid_penalty is None else float(invalid_penalty)
        )
        self.turn = 0
        # The event log: plain tuples (~10x cheaper than named ones), Events when read.
        self._events: list[Event] = []
        self._raw_events: list[tuple[int, str, str, str, tuple[str, ...]]] = []
        # One inbox list per seat for the instance's life (emptied in place, never replaced),
        # so that ``say`` can keep the bound ``append`` of every other seat's inbox.
        self._inbox: dict[str, list[str]] = {seat: [] for seat in seats}
        self._deliver = {
            seat: tuple(self._inbox[other].append for other in seats if other != seat)
            for seat in seats
        }
        # Hooks left as the base defines them are not called per seat and step (same result).
        cls = type(self)
        self._own_prompt = cls.prompt is not Scenario.prompt
        self._own_view = cls.view is not Scenario.view
        self._own_constraint = cls.constraint is not Scenario.constraint
        self._own_resolve = cls.resolve is not Scenario.resolve
        self._no_draws = NoDraws(cls)
        # Per-seat dicts that step copies (a copy is ~3x cheaper than dict.fromkeys).
        self._zeros: dict[str, float] = {}
        self._falses: dict[str, bool] = {}
        self._templates_of: list[str] | None = None  # the agents list they are for
        self._templates_src: list[str] = []  # a copy of its seats when they were made
        self._step_components: dict[str, dict[str, float]] = {}
        self._totals: dict[str, dict[str, float]] = {}
        self._invalid: dict[str, str] = {}
        self._invalid_count = 0
        self._done = False
        self._truncated = False
        self._live: frozenset[str] = frozenset()
        self._clean: str | None = None  # the last action step found in the charset
        self._rng: np.random.Generator | None = None  # (see rng)
        self._seed: int | None = None

    # ------------------------------------------------------------------ override these

    @abstractmethod
    def new_episode(self, rng: np.random.Generator) -> None:
        """Build the episode's state from ``rng`` (the only randomness allowed).

        Tell each seat its private context with :meth:`tell`.
        """

    @abstractmethod
    def acting(self) -> Sequence[str]:
        """The seats asked to act in the coming step (a subset of ``self.agents``)."""

    @abstractmethod
    def play(self, seat: str, action: str) -> str | None:
        """Apply one action (already checked against the action space, stripped of nothing).

        Return ``None`` when the move is legal, or the reason it is not (the machinery records
        the invalid move and its penalty; the hook decides what the move still does, e.g. a
        lost turn). Seats act in the order :meth:`acting` lists them.
        """

    def brief(self) -> None:
        """Tell each seat, from the state alone, what it learns at the start (:meth:`tell`).

        Called by :meth:`reset` right after :meth:`new_episode` (which may tell seats things
        itself instead). Briefing here lets the conformance suite redraw private data before
        the first observations are written, so they are checked for leaks too.
        """

    def resolve(self) -> None:
        """Called once after every acting seat's :meth:`play` in a step (simultaneous moves)."""

    def prompt(self, seat: str) -> str:
        """The last line of an acting seat's observation: what to do now and how."""
        return DEFAULT_PROMPT

    def constraint(self, seat: str) -> dict[str, Any] | None:
        """Structured-output constraint for an LLM in this seat now (Constraint fields)."""
        return None

    def view(self, seat: str) -> dict[str, Any]:
        """What this seat knows, structured (plain JSON types), for scripted agents."""
        return {}

    @abstractmethod
    def system_prompt(self, seat: str) -> str:
        """What an LLM in this seat is told once: the rules and the action syntax."""

    def metrics(self) -> dict[str, float]:
        """Scenario metrics of the finished episode; leave out a metric that is undefined."""
        return {}

    def oracle(self, seat: str) -> dict[str, Any]:
        """Privileged: what a scripted oracle in this seat needs and the seat may not know
        (plain JSON; ``{}`` if none). Never in ``infos`` (see the module docstring)."""
        return {}

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """Conformance hook: redraw in place (after :meth:`new_episode`) every private datum
        that seat ``keep`` may not know (other seats' context, hidden answers, ids pointing at
        them) from ``rng``, keeping what ``keep`` knows and all public state; ``False`` when
        nothing is hidden from ``keep``. Data whose consequences the rules make public (a
        stock that decides whether a trade goes through) stays. Not defined: the
        ``noninterference`` check reports "not applicable"."""
        raise NotImplementedError(f"{type(self).__name__} does not define redraw_private")

    def snapshot(self) -> Any:
        """The full state as a dataclass or JSON-able value (for :meth:`state`). By default
        the attribute ``s`` (the short convention of the example above); the built-in
        scenarios name their state per game (``self.deal``) and return it here."""
        return getattr(self, "s", None)

    # ------------------------------------------------------------------ machinery for hooks

    @property
    def events(self) -> list[Event]:
        """The episode's record so far, oldest first (the same list all episode long)."""
        raw = self._raw_events
        if raw:
            self._events.extend(map(Event._make, raw))
            raw.clear()
        return self._events

    @events.setter
    def events(self, value: list[Event]) -> None:
        self._raw_events.clear()
        self._events = value

    @final
    def tell(self, seat: str, text: str) -> None:
        """Add a line to ``seat``'s next observation (private notice from the scenario)."""
        # A short text (a game's observation) is checked at half printable's cost: ASCII
        # printable but for newlines is the charset (printable's bytes.translate wins from
        # ~100 characters on).
        if len(text) > 96 or not text.isascii() or not text.replace("\n", " ").isprintable():
            text = printable(text)
        self._inbox[seat].append(text)

    @final
    def announce(self, text: str) -> None:
        """Add a line to every seat's next observation and to the public record."""
        text = printable(text)
        self._raw_events.append((self.turn, "notice", "", text, ()))
        for agent in self.possible_agents:
            self._inbox[agent].append(text)

    @final
    def say(self, sender: str, text: str, to: Sequence[str] | None = None) -> None:
        """Deliver ``sender``'s message: to everyone else (``to=None``) or privately to ``to``."""
        if text is not self._clean:  # (the action step just checked is printable already)
            text = printable(text)
        shown = text.replace("\n", "\n  ") if self.quote_messages and "\n" in text else text
        if to is None:
            self._raw_events.append((self.turn, "message", sender, text, ()))
            line = f"{sender}: {shown}"
            for deliver in self._deliver[sender]:
                deliver(line)
            return
        recipients = tuple(to)
        self._raw_events.append((self.turn, "message", sender, text, recipients))
        line = f"{sender} (private to {','.join(recipients)}): {shown}"
        inbox = self._inbox
        for agent in recipients:
            if agent != sender:
                inbox[agent].append(line)

    @final
    def reward(self, seat: str, component: str, value: float) -> None:
        """Credit ``value`` to ``seat``'s reward component ``component`` in this step."""
        comps = self._step_components.setdefault(seat, {})
        comps[component] = comps.get(component, 0.0) + float(value)
        totals = self._totals[seat]
        totals[component] = totals.get(component, 0.0) + float(value)

    @final
    def finish(self) -> None:
        """End the episode (terminated) at the end of this step."""
        self._done = True

    @final
    def totals(self, seat: str) -> dict[str, float]:
        """``seat``'s reward components summed over the episode so far."""
        return dict(self._totals.get(seat, {}))

    @final
    def invalid_moves(self) -> int:
        """Invalid moves recorded in this episode."""
        return self._invalid_count

    # ------------------------------------------------------------------ ParallelEnv

    # Built on first use: a Text space indexes its charset (~0.1 ms); the runner never asks.
    @functools.cached_property
    def observation_spaces(self) -> dict[str, Text]:
        """One :class:`~gymnasium.spaces.Text` space per seat (the same object every call)."""
        return {seat: self._text(self.max_observation_length) for seat in self.possible_agents}

    @functools.cached_property
    def action_spaces(self) -> dict[str, Text]:
        """One :class:`~gymnasium.spaces.Text` space per seat (the same object every call)."""
        return {seat: self._text(self.max_action_length) for seat in self.possible_agents}

    @functools.cached_property
    def state_space(self) -> Text:
        """The space :meth:`state` lies in (ASCII JSON)."""
        return self._text(_STATE_MAX_LENGTH)

    @staticmethod
    def _text(max_length: int) -> Text:
        return Text(max_length, min_length=0, charset=CHARSET)

    @final
    def observation_space(self, agent: str) -> Text:
        return self.observation_spaces[agent]

    @final
    def action_space(self, agent: str) -> Text:
        return self.action_spaces[agent]

    @final
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        """Start an episode. ``seed`` re-seeds the instance's generator; ``None`` continues it.

        ``options={"redraw_private": {"keep": seat, "seed": n}}`` (for the conformance
        suite) calls :meth:`redraw_private` between :meth:`new_episode` and :meth:`brief`."""
        if seed is not None:  # (made on first use: LazyRng)
            self.seed_rng(seed)
        self.agents = agents = list(self.possible_agents)
        self._live = frozenset(agents)
        if agents == self._templates_src:  # (the last episode's seats: keep step's templates)
            self._templates_of = agents
        self.turn = 0
        self._events = []  # a fresh list: a caller may still hold the last episode's
        self._raw_events = []
        for lines in self._inbox.values():
            lines.clear()
        self._totals = {agent: {} for agent in agents}
        self._step_components = {}
        self._invalid = {}
        self._invalid_count = 0
        self._done = False
        self._truncated = False
        self.new_episode(self.rng if self.new_episode_draws else self._no_draws)  # type: ignore[arg-type]
        redraw = options.get("redraw_private") if options else None
        if redraw is not None:
            self.redraw_private(redraw["keep"], np.random.default_rng(redraw["seed"]))
        self.brief()
        return observe(self, set(self.acting()), False)

    @final
    def step(
        self, actions: Mapping[str, Any]
    ) -> tuple[
        dict[str, str],
        dict[str, float],
        dict[str, bool],
        dict[str, bool],
        dict[str, dict[str, Any]],
    ]:
        """Apply the acting seats' actions; other seats' entries are ignored.

        An acting seat missing from ``actions`` plays ``""`` (usually an invalid move).
        Stepping a finished episode returns empty dicts. ``actions`` that is not a mapping, or
        names a seat that is not live, raises :class:`StepContractError`.
        """
        agents = self.agents
        if type(actions) is not dict and not isinstance(actions, Mapping):
            raise StepContractError(
                "step(actions): actions must be a mapping {seat: action} (PettingZoo parallel "
                f"API), got {type(actions).__name__}"
            )
        if not agents:
            return {}, {}, {}, {}, {}
        if not self._live.issuperset(actions):
            unknown = sorted(str(seat) for seat in actions if seat not in self._live)
            raise StepContractError(
                f"step(actions): actions names seats that are not live: {unknown[:5]}; "
                f"the live seats are env.agents = {agents}"
            )
        # Last step's dicts went out in its infos: replace them (most steps need neither).
        if self._step_components:
            self._step_components = {}
        if self._invalid:
            self._invalid = {}
        play, limit = self.play, self.max_action_length
        # Printable ASCII that fits is decided at C speed (many seats: all in one); else _check.
        batch = len(actions) > 2 and type(actions) is dict and all_clean(actions.values(), limit)
        for agent in self.acting():
            if self._done:
                break
            action = actions.get(agent, "")
            if batch or (
                type(action) is str
                and len(action) <= limit
                and action.isascii()
                and action.isprintable()
            ):
                self._clean = action
                reason = play(agent, action)
            else:
                reason = check_action(action, limit)
                if reason is None:
                    reason = play(agent, action)
                elif self.refused_move_takes_turn:
                    play(agent, "")
            if reason is not None:
                self._record_invalid(agent, reason)
        done = self._done
        if not done and self._own_resolve:
            self.resolve()
            done = self._done
        self.turn = turn = self.turn + 1
        if not done and turn >= self.max_cycles:
            self._truncated = True
        truncated = self._truncated and not done
        ended = done or truncated
        if ended:
            observations, infos = observe(self, (), True)
        else:
            asked: Collection[str] = self.acting()  # (a set where tests need one)
            if (type(asked) is not tuple and type(asked) is not list) or len(asked) > 4:
                asked = set(asked)
            observations, infos = observe(self, asked, False)
        zeros = self._zeros
        if len(zeros) != len(agents) or self._templates_of is not agents:
            zeros = self._templates(agents)
        rewards = zeros.copy()
        paid = self._step_components
        if paid:
            for agent, comps in paid.items():
                if agent in rewards:
                    rewards[agent] = float(sum(comps.values()))
        if ended:
            self.agents = []
            return (
                observations,
                rewards,
                dict.fromkeys(agents, done),
                dict.fromkeys(agents, truncated),
                infos,
            )
        falses = self._falses
        return observations, rewards, falses.copy(), falses.copy(), infos

    @final
    def state(self) -> str:
        """The full state as canonical JSON (ASCII only, so it lies in :attr:`state_space`)."""
        snap = self.snapshot()
        if dataclasses.is_dataclass(snap) and not isinstance(snap, type):
            snap = dataclasses.asdict(snap)
        return json.dumps(
            {"turn": self.turn, "done": self._done, "state": snap},
            sort_keys=True,
            default=json_default,
        )

    @final
    def render(self) -> str | None:
        """``"ansi"``: the episode so far as text; ``"human"``: the same text printed to stdout
        (returns ``None``); ``None`` when ``render_mode`` is ``None``."""
        if self.render_mode is None:
            return None
        if self.render_mode == "human":
            print(self._render_text(), flush=True)
            return None
        return self._render_text()

    def _render_text(self) -> str:
        lines = [f"== {self.metadata['name']}  turn {self.turn} =="]
        for event in self.events[-40:]:
            to = f" -> {','.join(event.to)}" if event.to else ""
            who = event.sender or "*"
            lines.append(f"[{event.turn}] {event.kind} {who}{to}: {event.text}")
        return "\n".join(lines)

    @final
    def close(self) -> None:
        """Nothing to release: a scenario holds no external resource."""

    @final
    def episode_metrics(self) -> dict[str, float]:
        """The scenario's :meth:`metrics` plus ``turns`` and ``invalid_moves``."""
        metrics = {key: float(value) for key, value in self.metrics().items()}
        metrics.setdefault("turns", float(self.turn))
        metrics.setdefault("invalid_moves", float(self._invalid_count))
        return metrics

    # ------------------------------------------------------------------ internals
    def _record_invalid(self, seat: str, reason: str) -> None:
        reason = printable(reason)
        self._invalid[seat] = reason
        self._invalid_count += 1
        self._raw_events.append((self.turn, "invalid", seat, reason, (seat,)))
        self._inbox[seat].append(f"Invalid move: {reason}")
        self.reward(seat, "invalid", -self.invalid_penalty)

    def _templates(self, agents: list[str]) -> dict[str, float]:
        self._templates_of, self._templates_src = agents, list(agents)
        self._falses = dict.fromkeys(agents, False)
        self._zeros = zeros = dict.fromkeys(agents, 0.0)
        return zeros
