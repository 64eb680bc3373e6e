"""textarena:ENV_ID - a TextArena game (``textarena`` 0.7.4) as a parley scenario.

``ENV_ID`` is a TextArena id (``textarena:KuhnPoker-v0``, ``textarena:SimpleNegotiation-v0``);
the adapter plays its unwrapped ``-raw`` variant and writes the observations itself.

Seats: ``player_0`` ... ``player_{n-1}`` (TextArena's player ``i``); ``n`` is the game's
smallest player count that resets (give ``num_players=N`` to pick another).

Turn order: the library's (``get_observation()`` names the player to act, one at a time).
Observations: the messages TextArena addressed to that player since its last turn (its own
prompt, the game's notices, the other players' public moves), one line each as
``[GAME] ...`` or ``[Player i] ...``, a player's text indented by two spaces after its first
line (a move cannot write a ``[GAME]`` line into another's view); what TextArena sends to
another player only never reaches this seat. Actions: free text, as TextArena parses it (no
choice constraint: TextArena lists no legal moves). A move TextArena refuses is an invalid
move with its reason and TextArena's own rule applies (its error allowance, then the
offender loses); a text the action space refuses (over-long, outside printable ASCII) is
played as the empty move, which TextArena refuses by that same rule (before, the game never
moved on and a seat could stall it into a truncated 0-0 draw).

Rewards: component ``task`` is TextArena's reward of each player at the end (``close()``),
so a seat's ``task`` total is the library's for the same moves; ``invalid`` is
``-invalid_penalty`` per refused move (default 0).

Randomness: TextArena draws from Python's global ``random`` module, seeded by its
``reset(seed=...)``. The adapter gives each scenario its own generator behind ``random``'s
functions (swapped in around every call into TextArena and out again afterwards), seeded at
the start of each episode with the library seed (:attr:`TextArenaGame.library_seed`):
episodes in one process do not draw from each other's stream, and the caller's ``random``
state is left as it was. The library seed of ``reset(seed=n)`` is :func:`library_seed_of`
``(n)`` (splitmix64 of ``n``: the same episode for ``n`` in a fresh env or a reused one); a
reset without a seed, or with one outside [0, 2**64), draws it from the env's numpy
generator (:attr:`rng`), which continues from the last seed.

Arguments: ``num_players``, ``invalid_penalty``, ``max_cycles``, ``render_mode``.

    >>> env = make("textarena:KuhnPoker-v0")

Not represented (:func:`catalog` lists each with its reason): games that need data files or
services that cannot be reached here (NLTK corpora, an LLM jury), games that fail to reset.

Version history: the adapter's first version (pinned by the ``textarena==0.7.4`` install);
since then, refused texts play the empty move and players' line breaks are indented, and
the library seed of ``reset(seed=n)`` comes from :class:`~parley.scenarios.imported.openspiel.
SeedDraws` (before: a numpy generator seeded with ``n``, ~8 us an episode), so a seed plays
another episode than it did (an imported game's id carries no version).
"""

from __future__ import annotations

import contextlib
import functools
import io
import operator
import random
import socket
import sys
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from parley.protocols.errors import ConfigError
from parley.scenarios.base import Scenario
from parley.scenarios.helpers import SeedDraws
from parley.scenarios.imported import Entry
from parley.scenarios.registry import ScenarioSpec

__all__ = ["TextArenaGame", "catalog", "library_seed_of", "spec_for"]

_INSTALL = (
    'TextArena is not installed: pip install -e ".[games]" && '
    "pip install --no-deps textarena==0.7.4"
)
_BASELINE = "parley.agents.scripted.imported:RandomLegal"
_PLAYER_COUNTS = (2, 1, 3, 4, 5, 6)


def _ta() -> Any:
    try:
        import textarena
    except ImportError as exc:
        raise ConfigError(_INSTALL) from exc
    return textarena


def _registry() -> dict[str, Any]:
    from textarena.envs.registration import ENV_REGISTRY

    return dict(ENV_REGISTRY)


_SHARED = random.random.__self__  # type: ignore[attr-defined]  # (behind the functions)
_FUNCTIONS = tuple(
    name for name, value in vars(random).items() if getattr(value, "__self__", None) is _SHARED
)
"""The names of ``random``'s functions (``random.choice``, ``random.seed``, ...): the bound
methods of its one shared instance, which is what TextArena calls."""
_SAVE = operator.itemgetter(*_FUNCTIONS)
_SHARED_FUNCTIONS = _SAVE(vars(random))
_RESTORE_SHARED = dict(zip(_FUNCTIONS, _SHARED_FUNCTIONS, strict=True))
"""``random``'s own functions (what a caller almost always has), to put back in one update."""
_MODULE: dict[str, Any] = vars(random)
"""``random``'s namespace (the same dict for the process: looked up once, not per swap)."""


class _Sink(io.TextIOBase):
    """stdout while TextArena runs: what the library prints is dropped."""

    def write(self, text: str) -> int:
        return len(text)


_SINK = _Sink()


class _OwnRandom:
    """``with own:`` runs TextArena with an episode's own generator behind ``random``'s
    functions, and with stdout dropped (some games print their puzzles; stdout belongs to
    the command: ``parley run --json``); both are put back afterwards.

    One generator per scenario, seeded with the library seed at the start of every episode
    (:meth:`start`: before the game is made, so draws while it is made are a function of the
    seed too; TextArena then seeds it again in ``reset``), keeping its state between calls;
    the shared instance is never touched, so the caller's ``random`` state stays as it was.
    Not reentrant.

    The episode's seed is applied by the first call into ``random`` after :meth:`start`
    (stand-ins for its functions seed, then hand over to the generator's own): a seed
    replaces the whole state, so where that first call is TextArena's own ``random.seed``
    in ``reset`` (most games) the seed before it, ~3 us an episode, is skipped, and where
    something draws first it draws the same stream as from a generator seeded at once.
    """

    # Swapping the module's functions for the generator's bound methods is two dict updates
    # a call; swapping states (random.getstate/setstate, 625 words copied each, four a call)
    # was ~60 % of a KuhnPoker episode's CPU time, and copying the caller's state into a new
    # generator every episode (getstate, setstate: ~10 us) a tenth of it.

    def __init__(self) -> None:
        # Made unseeded: seeding at once (random.Random(0), ~4.4 us, as much as the rest of
        # this constructor, paid by every env of ``parley run``) is wasted where the first
        # episode's seed replaces it, so seed 0 is pending as any episode's seed is (until
        # :meth:`start`, the stream of random.Random(0)). Nothing reaches the generator but
        # through a stand-in that applies the pending seed first (it has no state until then).
        self.random = random.Random.__new__(random.Random)
        self._functions = {name: getattr(self.random, name) for name in _FUNCTIONS}
        self._seeding = {name: functools.partial(self._first_call, name) for name in _FUNCTIONS}
        self._installed = self._seeding  # what ``with`` puts behind random's functions
        self._pending: int | None = 0  # the seed the next call into random applies first
        self._inside = False
        self._saved: dict[str, Any] = {}
        self._stdout: Any = None

    def start(self, seed: int) -> None:
        """Seed the generator for a new episode (on the first call into ``random``)."""
        self._pending = seed
        self._installed = self._seeding

    def _first_call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._pending is not None:
            if name != "seed":  # (random.seed(...) replaces the state: nothing to apply)
                self.random.seed(self._pending)
            self._pending = None
            self._installed = self._functions
            if self._inside:  # (a stand-in kept by the game may be called outside ``with``)
                _MODULE.update(self._functions)
        return self._functions[name](*args, **kwargs)

    # (A swap is ~1.05 us: two 23-name updates, 0.25 each, the save and its check 0.22;
    # vars(random) per call and ``*exc`` cost 0.14 more.)
    def __enter__(self) -> None:
        saved = _SAVE(_MODULE)
        # (the tuples compare by identity first: the common case costs no call)
        self._saved = (
            _RESTORE_SHARED
            if saved == _SHARED_FUNCTIONS
            else dict(zip(_FUNCTIONS, saved, strict=True))
        )
        _MODULE.update(self._installed)
        self._inside = True
        self._stdout, sys.stdout = sys.stdout, _SINK

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        sys.stdout = self._stdout
        self._inside = False
        _MODULE.update(self._saved)


@functools.cache  # (TextArena's registry is fixed once imported)
def _raw(env_id: str) -> str:
    registry = _registry()
    if env_id not in registry:
        raise ConfigError(f"TextArena has no game {env_id!r}; `parley list --all` lists them")
    return f"{env_id}-raw" if f"{env_id}-raw" in registry else env_id


def _first_count(env_id: str) -> int:
    """The smallest player count (2 first) with which ``env_id`` resets and shows an
    observation; :class:`ConfigError` with TextArena's reason when none does."""
    ta, why = _ta(), ""
    for count in _PLAYER_COUNTS:
        try:
            with _OwnRandom(), _no_network():
                env = ta.make(_raw(env_id))
                env.reset(num_players=count, seed=0)
                env.get_observation()
            return count
        except ConfigError:
            raise
        except Exception as exc:  # the library's own refusal or failure: it is the reason
            why = why or _reason(exc)
            if "player" not in str(exc).lower():
                break  # not about the player count: another count fails the same way
    raise ConfigError(f"textarena:{env_id} cannot be played: {why}")


def _reason(exc: BaseException) -> str:
    """Why a TextArena game failed to reset, in words a user can act on."""
    text = str(exc).splitlines()[0][:160] if str(exc) else ""
    if isinstance(exc, LookupError):
        return "needs NLTK data (a corpus such as 'words') that cannot be downloaded here"
    if isinstance(exc, SyntaxError):
        return f"its module does not compile on this Python ({text}; needs 3.12 f-strings)"
    if isinstance(exc, FileNotFoundError):
        return f"a data file is missing from the textarena 0.7.4 wheel ({text})"
    if "API key" in text:
        return f"needs an LLM service ({text})"
    return f"{type(exc).__name__}: {text}"


@contextlib.contextmanager
def _no_network() -> Iterator[None]:
    """A game that reaches for the network (an NLTK download, an LLM jury) fails fast."""
    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(2.0)
    try:
        yield
    finally:
        socket.setdefaulttimeout(before)


def spec_for(name: str) -> ScenarioSpec:
    """The spec of ``textarena:NAME`` (resets the game once to find its player count)."""
    count = _first_count(name)
    return ScenarioSpec(
        f"textarena:{name}",
        "parley.scenarios.imported.textarena:TextArenaGame",
        kwargs={"env_id": name, "num_players": count},
        baselines={"*": _BASELINE},
        description=f"TextArena {name}: {count} player(s), free-text moves.",
    )


def catalog() -> list[Entry]:
    """Every TextArena game id (its ``-raw``/``-train`` wrappings aside), accepted or with
    the reason it is not."""
    _ta()
    out = []
    for env_id in sorted(_registry()):
        if env_id.endswith(("-raw", "-train")):
            continue
        try:
            found = spec_for(env_id)
        except ConfigError as exc:
            out.append(Entry(f"textarena:{env_id}", (), "", str(exc).split(": ", 1)[-1]))
            continue
        seats = tuple(f"player_{i}" for i in range(found.kwargs["num_players"]))
        out.append(Entry(found.id, seats, found.description))
    return out


class TextArenaGame(Scenario):
    """A TextArena game (module docstring)."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": "textarena:*",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
    }
    refused_move_takes_turn: ClassVar[bool] = True  # (no stalling into a truncated draw)
    new_episode_draws = False  # (a seeded episode makes no numpy generator: library_seed_of)

    def __init__(
        self,
        env_id: str,
        *,
        num_players: int | None = None,
        render_mode: str | None = "ansi",
        max_cycles: int | None = None,
        invalid_penalty: float | None = None,
    ) -> None:
        self.ta = _ta()
        self.env_id = env_id
        self.num_players = num_players or _first_count(env_id)
        # The id names the game, so the name is the instance's (PettingZoo reads env.metadata).
        self.metadata = {**type(self).metadata, "name": f"textarena:{env_id}"}  # type: ignore[misc]
        seats = [f"player_{i}" for i in range(self.num_players)]
        super().__init__(
            seats, render_mode=render_mode, max_cycles=max_cycles, invalid_penalty=invalid_penalty
        )
        self._random = _OwnRandom()
        self._raw_id = _raw(env_id)
        self._pid = {seat: pid for pid, seat in enumerate(seats)}  # seat -> TextArena's id
        self.env: Any = None
        self.library_seed = 0
        """The seed this episode's TextArena ``reset`` got (drawn from ``reset(seed=...)``)."""
        self._current = ""
        self.library_error = False

    # ------------------------------------------------------------------ hooks

    def new_episode(self, rng: np.random.Generator) -> None:
        # (reset(seed=n) called seed_rng just before: a reset without one has no seed.)
        seed = self.episode_seed()
        self.library_seed = library_seed_of(seed) if seed is not None else _draw(self.rng)
        self._random.start(self.library_seed)
        self.library_error = False
        with self._random:
            self.env = self.ta.make(self._raw_id)
            self.env.reset(num_players=self.num_players, seed=self.library_seed)
            self._pull()

    def acting(self) -> list[str]:
        return [self._current] if self._current else []

    def play(self, seat: str, action: str) -> str | None:
        state = self.env.state
        pid = self._pid[seat]
        errors = getattr(state, "error_count", 0)
        try:
            with self._random:  # (one swap for the step and what follows it)
                done, _ = self.env.step(action=action)
                refused = getattr(state, "error_count", 0) > errors or bool(
                    state.game_info.get(pid, {}).get("invalid_move")
                )
                if done:
                    self._end()
                else:
                    self._pull()
        except Exception as exc:  # the library failed on this text: end, score nothing
            self.library_error = True
            self._current = ""
            self.announce(f"The game stopped: TextArena raised {type(exc).__name__}.")
            self.finish()
            return f"TextArena raised {type(exc).__name__}: {str(exc)[:200]}"
        if refused:
            reason = str(state.game_info.get(pid, {}).get("reason") or "")
            return f"TextArena refused the move{': ' + reason if reason else ''}"
        return None

    def system_prompt(self, seat: str) -> str:
        return (
            f"You play the TextArena game {self.env_id} as {seat}, one of "
            f"{self.num_players} player(s). Each turn you see the game's messages to you; "
            "answer with your move in the format the game asks for."
        )

    def metrics(self) -> dict[str, float]:
        return {"library_error": float(self.library_error)}

    def snapshot(self) -> Any:
        return {"game": self.metadata["name"], "seed": self.library_seed, "turn": self.turn}

    # ------------------------------------------------------------------ internals

    def _pull(self) -> None:
        """Tell the player TextArena asks next what it has been sent since its last turn
        (called within ``with self._random``, as :meth:`_end` is)."""
        pid, messages = self.env.get_observation()
        self._current = self.possible_agents[int(pid)]
        self.tell(self._current, _format(messages))

    def _end(self) -> None:
        self._current = ""
        rewards, game_info = self.env.close()
        paid = {seat: _number(rewards.get(pid)) for pid, seat in enumerate(self.possible_agents)}
        if None in paid.values():  # (ThreeCardMonte returns its message as the reward)
            raise TypeError(f"TextArena's rewards are not numbers: {rewards!r}"[:200])
        for pid, seat in enumerate(self.possible_agents):
            self.reward(seat, "task", paid[seat] or 0.0)
            pending = self.env.state.observations.get(pid) or []
            if pending:
                self.tell(seat, _format(pending))
        reasons = {str(info.get("reason", "")) for info in game_info.values()} - {""}
        self.announce("The game is over. " + " ".join(sorted(reasons)))
        self.finish()


def library_seed_of(seed: int) -> int:
    """The library seed of the episode of ``reset(seed=seed)`` (``seed`` in [0, 2**64)): the
    first draw of :class:`~parley.scenarios.helpers.SeedDraws`, in [0, 2**31 - 1)
    as before (a numpy generator made from the seed, ~8 us an episode, drew it: as much as
    the rest of a KuhnPoker reset)."""
    return int(SeedDraws(seed).random() * _SEEDS)


def _draw(rng: np.random.Generator) -> int:
    """The library seed of an episode reset without a seed: the next of ``rng``'s stream."""
    return int(rng.integers(_SEEDS))


_SEEDS = 2**31 - 1
"""Library seeds are drawn in [0, _SEEDS) (what every TextArena game's seeding accepts)."""


def _number(value: Any) -> float | None:
    """A reward as a float (a missing one is 0), or None when it is not a number."""
    if value is None:
        return 0.0
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _format(messages: Any) -> str:
    """TextArena's raw observation (a list of (sender, text, kind), or of (text, kind) in some
    single-player games) as lines: ``[GAME] ...``, ``[Player i] ...``."""
    if type(messages) is list:
        # The common form (tuples of an int sender in _TAGS and a str text, as the loop below
        # reads them) in one comprehension: 0.62-0.68 against 0.74-0.78 us for a KuhnPoker or
        # TicTacToe observation. Any other item raises (``None + text``: True and 1.0 equal
        # keys of _TAGS but print otherwise) and the loop below gives every line. A player's
        # text of several lines is quoted (_quoted), as in the loop.
        try:
            return "\n".join(
                [
                    (_TAGS[item[0]] if type(item) is tuple and type(item[0]) is int else None)
                    + (item[1] if item[0] < 0 or "\n" not in item[1] else _quoted(item[1]))  # type: ignore[operator]
                    for item in messages
                ]
            )
        except (KeyError, TypeError, IndexError):
            pass
    if isinstance(messages, str):
        return messages
    lines = []
    for item in messages or []:
        if type(item) is tuple and len(item) > 1 and type(item[0]) is int:  # the common form
            text = str(item[1])
            text = text if item[0] < 0 else _quoted(text)
            lines.append((_TAGS.get(item[0]) or _tag(item[0])) + text)
            continue
        parts = list(item) if isinstance(item, (tuple, list)) else [item]
        sender = parts[0] if parts and isinstance(parts[0], int) else -1
        text = parts[1] if isinstance(parts[0], int) and len(parts) > 1 else parts[0]
        who = "GAME" if sender < 0 else f"Player {sender}"
        lines.append(f"[{who}] {text if sender < 0 else _quoted(str(text))}")
    return "\n".join(lines)


def _tag(sender: int) -> str:
    return "[GAME] " if sender < 0 else f"[Player {sender}] "


def _quoted(text: str) -> str:
    """A player's text with every line after its first indented (the lines it writes cannot
    pass for the game's or another player's)."""
    return text.replace("\n", "\n  ")


_TAGS = {sender: _tag(sender) for sender in range(-1, 16)}
"""The common senders' line starts, made once (TextArena's game is -1)."""
