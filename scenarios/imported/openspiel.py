"""openspiel:GAME - any OpenSpiel game the adapter can represent, as a parley scenario.

``GAME`` is what ``pyspiel.load_game`` takes, parameters included:
``openspiel:kuhn_poker``, ``openspiel:leduc_poker(players=3)``, ``openspiel:hanabi``.

Seats: ``player_0`` ... ``player_{n-1}`` (OpenSpiel's player ``i``).

Turn order: the library's. At a sequential node the current player is asked; at a
simultaneous node every player who has not chosen yet is asked, and the joint move is
applied once all have chosen. Chance nodes are resolved by the scenario with OpenSpiel's
explicit outcome probabilities, from one uniform draw each: after ``reset(seed=n)`` (an int,
``0 <= n < 2**64``) the ``k``-th draw of the episode is splitmix64's ``k``-th output from the
seed (:class:`SeedDraws`); after a ``reset`` without such a seed, the next draw of the
scenario's generator ``rng`` (which continues). So an episode is a function of its seed
and the moves.

Observations: on each of its turns a seat sees OpenSpiel's ``observation_string(player)``
(``information_state_string(player)`` where the game has no observation string), which holds
only what that player may know, then the prompt with its legal moves. At the end every seat
sees its final observation and the returns.

Actions: one legal move written as ``action_to_string(player, action)`` names it (spaces
around it and letter case do not matter). ``infos[seat]["constraint"]`` is a ``choice`` over
exactly those strings, so a constrained LLM never plays an illegal move; ``infos[seat]
["view"]`` holds ``player`` and ``legal`` (the same strings). Anything else is an invalid move
and the seat is asked again; after ``invalid_tries`` invalid moves in a row (default 3) a
legal move drawn from the episode's generator is played for it, so every episode ends
within the game's own length.

Rewards: component ``task`` is the change of OpenSpiel's ``returns()`` after each step, so a
seat's ``task`` total is the library's return for the same moves; ``invalid`` is
``-invalid_penalty`` per invalid move (default 0).

Arguments: ``invalid_tries`` (3), ``invalid_penalty``, ``max_cycles`` (default: the game's
``max_game_length() * invalid_tries`` plus slack), ``render_mode``.

    >>> env = make("openspiel:kuhn_poker")

Not represented (:func:`catalog` lists each with its reason): mean-field games, games whose
chance draws come from the library's own generator (``SAMPLED_STOCHASTIC``), games that need
parameters to load, games with no observation or information-state string.

Version history: the adapter's first version (the id carries no ``-vN``: the game is
OpenSpiel's, pinned by the ``games`` extra's ``open-spiel`` version). Before its release, the
chance draws of a seeded episode came from numpy's generator seeded by ``n`` (one made per
episode, ~8 us, more than a whole kuhn_poker episode of the library); since then from
:class:`SeedDraws`, so a seed deals other cards than it did then.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import operator
from typing import Any, ClassVar

import numpy as np

from parley.protocols.errors import ConfigError
from parley.scenarios.base import Scenario
from parley.scenarios.charset import printable
from parley.scenarios.helpers import SeedDraws
from parley.scenarios.imported import Entry
from parley.scenarios.imported.moves import LegalMoves, choose
from parley.scenarios.registry import ScenarioSpec

__all__ = ["OpenSpielGame", "SeedDraws", "catalog", "load_game", "spec_for"]

_SECOND = operator.itemgetter(1)  # (a chance outcome's probability)
_CHANCE, _SIMULTANEOUS = -1, -2  # OpenSpiel's kChancePlayerId, kSimultaneousPlayerId
_INSTALL = 'OpenSpiel is not installed: pip install -e ".[games]" (open-spiel 2.0.2)'
_BASELINE = "parley.agents.scripted.imported:RandomLegal"


def _pyspiel() -> Any:
    try:
        import pyspiel
    except ImportError as exc:
        raise ConfigError(_INSTALL) from exc
    _python_games()
    return pyspiel


@functools.cache
def _python_games() -> None:
    """Register OpenSpiel's games written in Python (``python_kuhn_poker``, ...; 0.13 s,
    once): the catalog and ``openspiel:python_*`` do not depend on whether something else
    imported them first (the whole test suite saw them, one module's tests did not)."""
    try:
        import open_spiel.python.games  # noqa: F401 - registers them with pyspiel
    except ImportError as exc:  # (a partial install: the C++ games are still there)
        logging.getLogger(__name__).debug("OpenSpiel's Python games not registered: %s", exc)


def _refusal(game_type: Any) -> str:
    """Why the adapter cannot play games of this type ("" when it can)."""
    pyspiel = _pyspiel()
    kind = pyspiel.GameType
    if game_type.dynamics not in (kind.Dynamics.SEQUENTIAL, kind.Dynamics.SIMULTANEOUS):
        return f"{game_type.dynamics.name.lower()} dynamics (not a game between seats)"
    if game_type.chance_mode == kind.ChanceMode.SAMPLED_STOCHASTIC:
        return "sampled chance (drawn by the library's own generator, not reset(seed))"
    if not game_type.default_loadable:
        return "needs parameters to load (give them: openspiel:GAME(param=value))"
    if not (game_type.provides_observation_string or game_type.provides_information_state_string):
        return "no observation or information-state string to show a seat"
    return ""


# Games whose State::ActionToString is a function of (player, action) and the game's parameters
# alone in open-spiel 2.0.2 (read in its games/*.cc): their legal moves are named once per
# (player, legal actions), not at every step, where naming costs a pybind call a move (~0.17
# us: 1.2 us of a 7-move tic-tac-toe step). Chess's names depend on the position: not listed.
_NAMES_BY_ACTION = frozenset(
    {
        "bargaining",
        "blotto",
        "connect_four",
        "dots_and_boxes",
        "first_sealed_auction",
        "goofspiel",
        "hanabi",
        "kuhn_poker",
        "leduc_poker",
        "liars_dice",
        "oshi_zumo",
        "tic_tac_toe",
        "tiny_hanabi",
    }
)
# Games whose State::Returns() are zeros until the end and whose CurrentPlayer() is
# kTerminalPlayerId exactly at the end in open-spiel 2.0.2 (read in games/*.cc; a test plays
# them out): a move that leaves a player to act needs neither returns() nor is_terminal()
# (two pybind calls, ~0.2 us of a tic-tac-toe step). Not every game of terminal rewards:
# repeated_leduc_poker declares them and pays each hand.
_PAID_AT_END = frozenset({"kuhn_poker", "tic_tac_toe"})
_NAMES_VERSION = "2.0.2"
"""The OpenSpiel version whose sources :data:`_NAMES_BY_ACTION` and :data:`_PAID_AT_END`
were read in (another names every step and reads the returns every step)."""
_NAMED: dict[str, dict[tuple[int, tuple[int, ...]], LegalMoves]] = {}
"""Per loaded game (:data:`_NAMES_BY_ACTION` only): (player, legal actions) -> its moves."""

_PROMPTS: dict[tuple[str, LegalMoves], str] = {}
"""(seat, moves) -> the prompt, for every instance: a game's positions repeat their move
lists across episodes and instances (LegalMoves are shared: :meth:`LegalMoves.of`)."""

_GAMES: dict[str, Any] = {}
"""Games loaded so far, by name: a game object is immutable (states are made from it), and
some take seconds to load (colored_trails reads its boards), so each is loaded once."""


def load_game(name: str) -> Any:
    """``pyspiel.load_game(name)``, refused with the reason when the adapter cannot play it."""
    if name in _GAMES:
        return _GAMES[name]
    pyspiel = _pyspiel()
    try:
        game = pyspiel.load_game(name)
    except pyspiel.SpielError as exc:
        why = str(exc).split(". Available games", 1)[0]  # (then the whole list follows)
        raise ConfigError(
            f"OpenSpiel cannot load {name!r}: {why}; `parley list --all` lists the games"
        ) from exc
    why = _refusal(game.get_type())
    # A game that loads with parameters is fine; only the other reasons refuse it.
    if why and not why.startswith("needs parameters"):
        raise ConfigError(f"openspiel:{name} cannot be played as a parley scenario: {why}")
    why = _probe(game)
    if why:
        raise ConfigError(f"openspiel:{name} cannot be played as a parley scenario: {why}")
    _GAMES[name] = game
    return game


def _probe(game: Any) -> str:
    """Why the first decision of ``game`` cannot be shown to a seat ("" when it can): some
    games expose their moves only as structs, with no legal action ids or strings."""
    pyspiel = _pyspiel()
    state = game.new_initial_state()
    try:
        OpenSpielGame._resolve_chance(state, SeedDraws(0))
        if state.is_terminal():
            return "ends before its first move"
        players = (
            range(game.num_players()) if state.is_simultaneous_node() else [state.current_player()]
        )
        for player in players:
            for action in state.legal_actions(player)[:1]:
                state.action_to_string(player, action)
            if game.get_type().provides_observation_string:
                state.observation_string(player)
            else:
                state.information_state_string(player)
    except pyspiel.SpielError as exc:
        return f"its first move cannot be shown ({str(exc).splitlines()[0][:120]})"
    return ""


def _describe(game: Any) -> str:
    kind = game.get_type()
    return (
        f"OpenSpiel {kind.long_name}: {game.num_players()} players, "
        f"{kind.dynamics.name.lower()}, {kind.information.name.lower().replace('_', ' ')}, "
        f"{kind.utility.name.lower().replace('_', '-')}."
    )


def spec_for(name: str) -> ScenarioSpec:
    """The spec of ``openspiel:NAME`` (loads the game once to check it)."""
    game = load_game(name)
    return ScenarioSpec(
        f"openspiel:{name}",
        "parley.scenarios.imported.openspiel:OpenSpielGame",
        kwargs={"game": name},
        baselines={"*": _BASELINE},
        description=_describe(game),
    )


def catalog() -> list[Entry]:
    """Every registered OpenSpiel game: accepted ones with seats and a description, the
    others with the reason."""
    pyspiel = _pyspiel()
    out = []
    for game_type in pyspiel.registered_games():
        name = f"openspiel:{game_type.short_name}"
        why = _refusal(game_type)
        if why:
            out.append(Entry(name, (), game_type.long_name, why))
            continue
        try:
            game = load_game(game_type.short_name)
        except ConfigError as exc:
            out.append(Entry(name, (), game_type.long_name, str(exc).split(": ", 1)[-1]))
            continue
        seats = tuple(f"player_{i}" for i in range(game.num_players()))
        out.append(Entry(name, seats, _describe(game)))
    return out


class OpenSpielGame(Scenario):
    """An OpenSpiel game (module docstring)."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": "openspiel:*",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
    }
    max_action_length: ClassVar[int] = 200
    refused_move_takes_turn: ClassVar[bool] = True  # (no stalling into a truncated draw)
    # Chance nodes draw from SeedDraws, or from self.rng (made on first use) after a reset
    # without an int seed: a game without chance (tic-tac-toe) never makes either.
    new_episode_draws = False

    def __init__(
        self,
        game: str,
        *,
        invalid_tries: int = 3,
        render_mode: str | None = "ansi",
        max_cycles: int | None = None,
        invalid_penalty: float | None = None,
    ) -> None:
        if invalid_tries < 1:
            raise ConfigError(f"invalid_tries must be >= 1, got {invalid_tries}")
        self.game = load_game(game)
        self.invalid_tries = invalid_tries
        # The id names the game, so the name is the instance's (PettingZoo reads env.metadata).
        self.metadata = {**type(self).metadata, "name": f"openspiel:{game}"}  # type: ignore[misc]
        kind = self.game.get_type()
        self._use_observation = bool(kind.provides_observation_string)
        self._simultaneous_game = kind.dynamics.name == "SIMULTANEOUS"
        if max_cycles is None:  # every move may take invalid_tries steps, chance takes none
            max_cycles = max(1, self.game.max_game_length()) * invalid_tries + 10
        seats = [f"player_{i}" for i in range(self.game.num_players())]
        super().__init__(
            seats, render_mode=render_mode, max_cycles=max_cycles, invalid_penalty=invalid_penalty
        )
        self.index = {seat: i for i, seat in enumerate(seats)}
        self.state_: Any = None
        self._moves: dict[str, LegalMoves] = {}
        self._chosen: dict[str, int] = {}  # simultaneous node: seat -> chosen action
        # acting()'s seats, replaced when _moves or _chosen change (a tuple: handed out).
        self._acting: tuple[str, ...] = ()
        self._endings: dict[tuple[float, ...], str] = {}  # final returns -> notice
        self._misses: dict[str, int] = {}
        self._changed = False  # a move was applied since the acting seats were told
        self._paid = [0.0] * len(seats)  # the returns paid so far, per seat
        known = _pyspiel().__version__ == _NAMES_VERSION
        self._named = (
            _NAMED.setdefault(game, {}) if known and kind.short_name in _NAMES_BY_ACTION else None
        )
        self._paid_at_end = known and kind.short_name in _PAID_AT_END
        self._seed_of_episode: int | None = None  # (None: chance draws from self.rng)
        self._chance: Any = None  # the episode's draws, made at its first chance node

    # ------------------------------------------------------------------ hooks

    def new_episode(self, rng: np.random.Generator) -> None:
        self.state_ = self.game.new_initial_state()
        self._paid = [0.0] * self.num_seats
        self._misses = dict.fromkeys(self.possible_agents, 0)
        self._chosen = {}
        # (reset(seed=n) called seed_rng just before: a reset without one has no seed.)
        self._seed_of_episode, self._chance = self.episode_seed(), None
        self._advance()

    @property
    def num_seats(self) -> int:
        return len(self.possible_agents)

    def brief(self) -> None:
        self._refresh()
        self._tell_acting()

    def acting(self) -> tuple[str, ...]:
        return self._acting

    def play(self, seat: str, action: str) -> str | None:
        moves, reason = self._moves[seat], None
        chosen = moves.by_text.get(action.strip().lower())  # (moves.find, inlined: hot)
        if chosen is not None:  # a legal move (the common case): no generator needed
            self._misses[seat] = 0
        else:
            chosen, reason, self._misses[seat] = choose(
                moves, action, self._misses[seat], self.invalid_tries, self.rng
            )
            if chosen is None:
                return reason
        if self._simultaneous_game and self.state_.is_simultaneous_node():
            self._chosen[seat] = chosen
            self._acting = tuple(s for s in self._moves if s not in self._chosen)
        else:
            self.state_.apply_action(chosen)
            self._after_move()
        return reason

    def resolve(self) -> None:
        if self._chosen and len(self._chosen) == len(self._moves):  # the joint move is in
            joint = [self._chosen.get(seat, 0) for seat in self.possible_agents]
            self._chosen = {}
            self._acting = tuple(self._moves)
            self.state_.apply_actions(joint)
            self._after_move()
        if self._changed and not self._done:
            self._changed = False
            self._tell_acting()

    def prompt(self, seat: str) -> str:
        # A game's positions repeat their move lists: each prompt is made once (bounded).
        moves = self._moves[seat]
        text = _PROMPTS.get((seat, moves))
        if text is None:
            if len(_PROMPTS) >= 4096:
                _PROMPTS.clear()
            text = f"Your move as {seat}. Answer with one legal move: {moves.listed()}"
            _PROMPTS[seat, moves] = text
        return text

    def constraint(self, seat: str) -> dict[str, Any] | None:
        return {"type": "choice", "choices": list(self._moves[seat].shown)}

    def view(self, seat: str) -> dict[str, Any]:
        moves = self._moves.get(seat)
        if moves is None or (self._chosen and seat in self._chosen):
            return {"player": self.index[seat], "legal": []}
        return {"player": self.index[seat], "legal": list(moves.shown)}

    def system_prompt(self, seat: str) -> str:
        kind = self.game.get_type()
        return printable(
            f"You play {kind.long_name} (OpenSpiel '{self.metadata['name'][10:]}') as "
            f"{seat}, one of {self.num_seats} players. On your turn you see what you know "
            "of the game and the list of legal moves; answer with exactly one legal move, "
            "written as listed. Your score is the game's return for you."
        )

    def snapshot(self) -> Any:
        history = [] if self.state_ is None else [int(a) for a in self.state_.history()]
        return {"game": self.metadata["name"], "history": history}

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """Redraw the chance outcomes dealt before the first move (cards, hidden values),
        one at a time, into others that leave ``keep``'s observation as it was after each;
        ``False`` when none differ (or the game shows no observation during the deal)."""
        if self.game.get_type().information.name == "PERFECT_INFORMATION":
            return False  # (a chance outcome the observation omits is still public)
        player = self.index[keep]
        history = [int(action) for action in self.state_.history()]
        # Up to 16 passes, each outcome tried in rng's order with the dealt one last: one
        # pass may end where no outcome fits (kuhn_poker: the other card was taken), and
        # one pass in rng's order alone often dealt the same cards again (then False).
        try:
            for _ in range(16):
                dealt, other = self.game.new_initial_state(), self.game.new_initial_state()
                for action in history:
                    dealt.apply_action(action)
                    seen = self._observation(player, dealt)
                    order = rng.permutation([o for o, _ in other.chance_outcomes()]).tolist()
                    for outcome in sorted(order, key=action.__eq__):
                        child = other.child(outcome)
                        if self._observation(player, child) == seen:
                            other = child
                            break
                    else:
                        break  # (no outcome fits: another pass)
                else:
                    if [int(a) for a in other.history()] != history:
                        self.state_ = other
                        return True
        except _pyspiel().SpielError:
            return False
        return False

    # ------------------------------------------------------------------ internals

    def _after_move(self) -> None:
        self._changed = True
        player = self._advance()
        if self._done:
            return
        self._refresh(player)

    def _advance(self) -> int:
        """Resolve chance nodes, pay the change of the returns, finish at the end; return
        OpenSpiel's ``current_player()`` after the chance nodes."""
        state = self.state_
        # (OpenSpiel's IsChanceNode and IsSimultaneousNode are this comparison, in C++: one
        # call, read once a move, instead of one call each.)
        player = state.current_player()
        if player == _CHANCE:
            chance = self._chance
            if chance is None:  # (the episode's first chance node)
                seed = self._seed_of_episode
                chance = self._chance = self.rng if seed is None else SeedDraws(seed)
            self._resolve_chance(state, chance)
            player = state.current_player()
        if self._paid_at_end and player >= 0:  # (a player to act: not the end, nothing paid)
            return player  # type: ignore[no-any-return]
        # (Read every step even in games of terminal rewards: repeated_leduc_poker declares
        # them and pays each hand as it ends.)
        returns = state.returns()  # (a list of floats from C++ games; numpy: 3x the cost here)
        if type(returns) is not list:  # a game written in Python gives a numpy array
            returns = [float(value) for value in returns]
        if returns != self._paid:  # (one comparison at C speed on most steps: nothing paid)
            returns, paid = [float(value) for value in returns], self._paid
            for i, seat in enumerate(self.possible_agents):
                if returns[i] != paid[i]:
                    self.reward(seat, "task", returns[i] - paid[i])
            self._paid = returns
        if state.is_terminal():
            self._moves = {}
            self._acting = ()
            self.finish()
            self._tell_end()
        return player  # type: ignore[no-any-return]

    @staticmethod
    def _resolve_chance(state: Any, rng: SeedDraws | np.random.Generator) -> None:
        while state.is_chance_node():
            outcomes = state.chance_outcomes()
            # np.cumsum and np.searchsorted(side="right") give the same pick, at 5x the cost
            # for a few outcomes (the sums are added in the same order).
            weights = list(itertools.accumulate(map(_SECOND, outcomes)))
            pick = bisect.bisect_right(weights, rng.random() * weights[-1])
            state.apply_action(outcomes[min(pick, len(outcomes) - 1)][0])

    def _refresh(self, player: int | None = None) -> None:
        """The legal moves of every seat asked now (``player``: ``current_player()``)."""
        state = self.state_
        seats = self.possible_agents
        if player is None:
            player = state.current_player()
        if self._simultaneous_game and player == _SIMULTANEOUS:
            players = [p for p in range(self.num_seats) if state.legal_actions(p)]
            self._moves = {seats[p]: self._legal(p) for p in players}
            self._acting = tuple(seat for seat in self._moves if seat not in self._chosen)
        else:  # (one seat: _legal's lookup inlined, the common case of every move)
            seat = seats[player]
            actions = state.legal_actions(player)
            named = self._named
            moves = None if named is None else named.get((player, tuple(actions)))
            self._moves = {seat: self._legal(player, actions) if moves is None else moves}
            self._acting = (seat,)

    def _legal(self, player: int, actions: list[int] | None = None) -> LegalMoves:
        state = self.state_
        if actions is None:
            actions = state.legal_actions(player)
        named = self._named
        if named is None:  # (named anew every time: OpenSpiel's names may depend on the state)
            return self._name(player, actions)
        key = (player, tuple(actions))
        moves = named.get(key)
        if moves is None:
            if len(named) >= 4096:
                named.clear()
            moves = named[key] = self._name(player, actions)
        return moves

    def _name(self, player: int, actions: list[int]) -> LegalMoves:
        state = self.state_
        names = map(state.action_to_string, itertools.repeat(player, len(actions)), actions)
        return LegalMoves.of(tuple(names), actions)

    def _observation(self, player: int, state: Any = None) -> str:
        state = self.state_ if state is None else state
        if self._use_observation:
            return str(state.observation_string(player))
        return str(state.information_state_string(player))

    def _tell_acting(self) -> None:
        state, index, tell = self.state_, self.index, self.tell
        if type(self)._observation is not OpenSpielGame._observation:  # (a subclass's words)
            for seat in self._acting:
                tell(seat, self._observation(index[seat]))
            return
        # (Every step: _observation's choice made once, not per seat.)
        if self._use_observation:
            observe = state.observation_string
        else:
            observe = state.information_state_string
        for seat in self._acting:
            tell(seat, str(observe(index[seat])))

    def _tell_end(self) -> None:
        returns = tuple(self.state_.returns())
        # A game's final returns repeat (kuhn_poker has 6): each notice is written once
        # (not with a zero: 0.0 and -0.0 are one key, "0" and "-0" two notices).
        notice = self._endings.get(returns)
        if notice is None:
            final = ", ".join(f"{s} {returns[i]:g}" for i, s in enumerate(self.possible_agents))
            notice = f"The game is over. Returns: {final}."
            if 0.0 not in returns:
                if len(self._endings) >= 1024:
                    self._endings.clear()
                self._endings[returns] = notice
        for seat in self.possible_agents:
            self.tell(seat, self._observation(self.index[seat]))
        self.announce(notice)
