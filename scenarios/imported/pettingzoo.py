"""pettingzoo:classic/NAME - a PettingZoo classic game (its AEC env) as a parley scenario.

``NAME`` is a module of ``pettingzoo.classic``: ``pettingzoo:classic/tictactoe_v3``,
``connect_four_v3``, ``chess_v6``, ``go_v5``, ``leduc_holdem_v4``, ``texas_holdem_v4``,
``texas_holdem_no_limit_v6``, ``rps_v2``.

Seats: the env's own agent names. Turn order: the env's ``agent_selection``.

Observations: what ``observe(seat)`` gives that seat only: its observation array as the
positions and values of its non-zero entries (the planes these games use are mostly zeros),
after the game's own text for public boards (chess: the board and FEN; connect four and
tic-tac-toe: the grid), then the prompt with the legal moves.

Actions: one legal move by name (chess: UCI ``e2e4``; poker: ``call``, ``raise``, ``fold``,
``check``; rock-paper-scissors: ``rock`` ...; else ``move K``): the ``action_mask`` as a
``choice`` constraint and ``view["legal"]``. Anything else is an invalid move and the seat is
asked again; the third in a row plays a random legal move. A text the action space refuses
(over-long, outside printable ASCII) counts as one of them (before, it did not: a seat that
sent only such texts stalled the game into a truncated 0-0 draw).

Rewards: component ``task`` is the sum of the env's ``rewards`` after each of its steps (the
library's return for the same moves); ``invalid`` is ``-invalid_penalty`` per invalid move.
Randomness: the env is reset with a seed drawn from ``reset(seed=...)``'s generator.

Arguments: ``invalid_tries`` (3), ``invalid_penalty``, ``max_cycles``, ``render_mode``.

    >>> env = make("pettingzoo:classic/connect_four_v3")

Version history: the adapter's first version (pettingzoo 1.27; chess, pygame and rlcard from
the ``games`` extra).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from parley.protocols.errors import ConfigError
from parley.scenarios.base import Scenario
from parley.scenarios.imported import Entry
from parley.scenarios.imported.moves import LegalMoves, choose
from parley.scenarios.registry import ScenarioSpec

__all__ = ["PettingZooGame", "catalog", "spec_for"]

_BASELINE = "parley.agents.scripted.imported:RandomLegal"
_POKER = {0: "call", 1: "raise", 2: "fold", 3: "check"}
_NAMES: dict[str, dict[int, str]] = {
    "leduc_holdem": _POKER,
    "texas_holdem": _POKER,
    "texas_holdem_no_limit": {
        0: "fold", 1: "check or call", 2: "raise half pot", 3: "raise pot", 4: "all in"
    },
    "rps": {0: "rock", 1: "paper", 2: "scissors", 3: "lizard", 4: "spock"},
    "connect_four": {k: f"column {k}" for k in range(7)},
    "tictactoe": {k: f"square {k}" for k in range(9)},
}  # fmt: skip
"""Move names by game (the module name without its version)."""


def _game_of(name: str) -> str:
    return name.rsplit("_v", 1)[0]


def _module(name: str) -> Any:
    try:
        return importlib.import_module(f"pettingzoo.classic.{name}")
    except ImportError as exc:
        raise ConfigError(
            f"pettingzoo:classic/{name} cannot be loaded ({exc}); its dependencies come "
            'with pip install -e ".[games]"'
        ) from exc


def spec_for(name: str) -> ScenarioSpec:
    """The spec of ``pettingzoo:classic/NAME`` (builds the env once to check it)."""
    if not name.startswith("classic/"):
        raise ConfigError(f"pettingzoo:{name}: only the classic games are adapted")
    module = name.split("/", 1)[1]
    try:
        env = _module(module).env()
    except ImportError as exc:  # (hanabi_v5 raises it when shimmy is missing)
        raise ConfigError(f"pettingzoo:{name} cannot be built: {exc}") from exc
    return ScenarioSpec(
        f"pettingzoo:{name}",
        "parley.scenarios.imported.pettingzoo:PettingZooGame",
        kwargs={"game": module},
        baselines={"*": _BASELINE},
        description=f"PettingZoo classic {module}: seats {', '.join(env.possible_agents)}.",
    )


def catalog() -> list[Entry]:
    """Every module of ``pettingzoo.classic`` (``*_vN``), accepted or with the reason."""
    import pettingzoo.classic

    out = []
    for info in pkgutil.iter_modules(pettingzoo.classic.__path__):
        if "_v" not in info.name:
            continue
        try:
            found = spec_for(f"classic/{info.name}")
        except ConfigError as exc:
            out.append(Entry(f"pettingzoo:classic/{info.name}", (), "", str(exc)))
            continue
        seats = tuple(found.description.split("seats ", 1)[1].rstrip(".").split(", "))
        out.append(Entry(found.id, seats, found.description))
    return out


class PettingZooGame(Scenario):
    """A PettingZoo classic game (module docstring)."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": "pettingzoo:*",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
    }
    refused_move_takes_turn: ClassVar[bool] = True  # (no stalling into a truncated draw)

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
        self.game, self.invalid_tries = game, invalid_tries
        self.env: Any = _module(game).env()
        # The id names the game, so the name is the instance's (PettingZoo reads env.metadata).
        self.metadata = {**type(self).metadata, "name": f"pettingzoo:classic/{game}"}  # type: ignore[misc]
        self._names = _NAMES.get(_game_of(game), {})
        super().__init__(
            list(self.env.possible_agents),
            render_mode=render_mode,
            max_cycles=max_cycles,
            invalid_penalty=invalid_penalty,
        )
        self._moves: LegalMoves | None = None
        self._misses: dict[str, int] = {}
        self.library_seed = 0
        """The seed of this episode's env ``reset`` (drawn from ``reset(seed=...)``)."""
        self.played: list[int] = []
        """The action ids applied this episode, in order (to replay it in the library)."""

    def new_episode(self, rng: np.random.Generator) -> None:
        self.library_seed = int(rng.integers(2**31 - 1))
        self.played = []
        self.env.reset(seed=self.library_seed)
        self._misses = dict.fromkeys(self.possible_agents, 0)
        self._moves = None

    def brief(self) -> None:
        self._next()

    def acting(self) -> list[str]:
        return [self.env.agent_selection] if self._moves is not None else []

    def play(self, seat: str, action: str) -> str | None:
        assert self._moves is not None  # (acting() names a seat only when moves are set)
        chosen, reason, self._misses[seat] = choose(
            self._moves, action, self._misses[seat], self.invalid_tries, self.rng
        )
        if chosen is None:
            return reason
        self.played.append(chosen)
        self._step(chosen)
        self._next()
        return reason

    def prompt(self, seat: str) -> str:
        listed = self._moves.listed() if self._moves is not None else ""
        return f"Your move as {seat}. Answer with one legal move: {listed}"

    def constraint(self, seat: str) -> dict[str, Any] | None:
        return {"type": "choice", "choices": list(self._moves.shown)} if self._moves else None

    def view(self, seat: str) -> dict[str, Any]:
        acting = self._moves is not None and seat == self.env.agent_selection
        return {"legal": list(self._moves.shown) if acting and self._moves else []}

    def system_prompt(self, seat: str) -> str:
        return (
            f"You play the PettingZoo classic game {self.game} as {seat}. On your turn you "
            "see your observation and the legal moves; answer with exactly one legal move, "
            "written as listed. Your score is the game's reward for you."
        )

    def snapshot(self) -> Any:
        return {"game": self.metadata["name"], "turn": self.turn}

    # ------------------------------------------------------------------ internals

    def _step(self, action: int | None) -> None:
        self.env.step(action)
        for seat, value in self.env.rewards.items():
            if value:
                self.reward(seat, "task", float(value))

    def _next(self) -> None:
        """Step the seats the env retires (``None``), then show the next seat its view."""
        env = self.env
        while env.agents:
            seat = env.agent_selection
            if env.terminations[seat] or env.truncations[seat]:
                self._step(None)
                continue
            observed = env.observe(seat)
            mask = observed.get("action_mask") if isinstance(observed, dict) else None
            count = int(env.action_space(seat).n)
            legal = [int(a) for a in np.flatnonzero(mask)] if mask is not None else range(count)
            self._moves = LegalMoves.of([self._label(seat, a) for a in legal], list(legal))
            self.tell(seat, self._describe(seat, observed))
            return
        self._moves = None
        self.announce("The game is over.")
        self.finish()

    def _label(self, seat: str, action: int) -> str:
        if self._game == "chess":
            return str(self._chess_move(seat, action))
        if self._game == "go":
            size = int(np.sqrt(int(self.env.action_space(seat).n) - 1))
            return "pass" if action == size * size else f"{action // size},{action % size}"
        return self._names.get(action, f"move {action}")

    @property
    def _game(self) -> str:
        return _game_of(self.game)

    def _chess_move(self, seat: str, action: int) -> Any:
        from pettingzoo.classic.chess import chess_utils

        board = self.env.unwrapped.board
        player = self.possible_agents.index(seat)
        return chess_utils.action_to_move(board, action, player).uci()

    def _describe(self, seat: str, observed: Any) -> str:
        """The seat's own observation as text (module docstring)."""
        array = np.asarray(observed["observation"] if isinstance(observed, dict) else observed)
        lines = [text for text in (self._board(),) if text]
        entries = np.argwhere(array != 0)
        shown = ", ".join(
            f"{tuple(int(i) for i in index)}={array[tuple(index)]:g}" for index in entries[:400]
        )
        lines.append(f"Your observation ({'x'.join(map(str, array.shape))}, non-zero): {shown}")
        return "\n".join(lines)

    def _board(self) -> str:
        """The public board of games whose board every seat sees ("" for the others)."""
        unwrapped = self.env.unwrapped
        board: Callable[[], str] | None = {
            "chess": lambda: f"{unwrapped.board}\nFEN: {unwrapped.board.fen()}",
            "connect_four": lambda: "\n".join(
                " ".join(".XO"[int(c)] for c in unwrapped.board[r * 7 : r * 7 + 7])
                for r in range(6)
            ),
            "tictactoe": lambda: "\n".join(
                " ".join(".XO"[int(unwrapped.board.squares[c * 3 + r])] for c in range(3))
                for r in range(3)
            ),
        }.get(self._game)
        return board() if board is not None else ""
