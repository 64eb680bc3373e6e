"""negotiation/split-the-pie-v0 - majority-rule bargaining over a shrinking pie.

Baron and Ferejohn's (1989) legislative bargaining with a closed rule. ``n`` players
(3-7) divide a pie of size 1. Each round a proposer drawn uniformly at random proposes shares
(fractions of the current pie, one per player, summing to at most 1); then every player,
the proposer included, votes. The proposal passes with a quota ``q = floor(n/2) + 1`` of yes
votes and the game ends with payoffs ``share_i x pie``. Otherwise the pie shrinks by the
factor ``delta`` and a new round starts. After ``max_rounds`` failed rounds everyone gets 0.

Stationary subgame-perfect equilibrium (infinite horizon, what the scripted baseline plays):
ex ante every player is worth ``1/n`` of the pie on the table, so a responder's continuation
value is ``delta/n`` of the current pie. The proposer buys the ``q - 1`` cheapest votes at
exactly ``delta/n`` each and keeps the rest; the first proposal passes::

    proposer share      = 1 - delta (q - 1) / n      (odd n: 1 - delta (n - 1) / (2n))
    q - 1 coalition members get delta / n each; the others get 0

Seats: ``player_0`` ... ``player_{n-1}``.

Actions:

=====================================  ===================================================
``propose: 0.7 0.15 0.15``              the proposer: one share per seat, in seat order
``yes`` / ``no``                        every player, in the vote that follows
=====================================  ===================================================

An invalid proposal makes the round fail (the pie shrinks); an invalid vote counts as no.

Observations: the round, the pie size, the proposer, the proposal, the vote result.
``infos[seat]["view"]`` holds ``seat``, ``index``, ``n``, ``delta``, ``quota``, ``round``,
``pie``, ``phase``, ``proposer`` and ``proposal`` (the shares, or ``None``).

Rewards (on the last step):

==========  ====================================================================
component   value
==========  ====================================================================
task        own share x pie of the round the proposal passed (0 if none passed)
invalid     -``invalid_penalty`` per invalid move (default 0.05)
==========  ====================================================================

Metrics: ``agreed`` (= ``success``), ``rounds`` (rounds played), and when agreed
``proposer_share`` (fraction of that round's pie) and ``total_payoff`` (the pie left).

Arguments: ``n_players`` (3), ``delta`` (0.9), ``max_rounds`` (10), ``invalid_penalty``,
``max_cycles``, ``render_mode``.

    >>> env = make("negotiation/split-the-pie-v0", n_players=5, delta=0.8)

Version history: v0 - first version.
v1 — a move the action space refuses (characters outside the charset, too long) uses
up the seat's turn (:mod:`parley.scenarios.refusals`), so every episode ends within the
scenario's limits; v0 is kept as it was.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

import numpy as np

from parley.protocols.errors import ConfigError
from parley.scenarios.base import Scenario
from parley.scenarios.declaring import text_metadata
from parley.scenarios.refusals import RefusedMoveTakesTurn
from parley.scenarios.registry import registered

# The versions; the rules' helpers (for scripted agents and tests) are imported by path.
__all__ = ["SplitThePieV0", "SplitThePieV1"]

_PREFIX = re.compile(r"^\s*propose\s*:?", re.IGNORECASE)
_NUMBER = re.compile(r"\d+(\.\d+)?|\.\d+")
TOLERANCE = 1e-6


def quota(n: int) -> int:
    """Votes needed to pass: a strict majority."""
    return n // 2 + 1


def spe_shares(n: int, delta: float) -> tuple[float, float]:
    """Stationary SPE ``(proposer share, coalition member share)`` of the current pie."""
    member = delta / n
    return 1.0 - member * (quota(n) - 1), member


def parse_proposal(text: str, n: int) -> tuple[list[float] | None, str | None]:
    """Shares from ``"propose: 0.5 0.25 0.25"``, or the reason they are invalid."""
    match = _PREFIX.match(text)
    words = text[match.end() :].split() if match else []
    if not words or not all(_NUMBER.fullmatch(w) for w in words):
        return None, f"a proposal looks like 'propose: {' '.join(['0.3'] * n)}' ({n} shares)"
    shares = [float(w) for w in words]
    if len(shares) != n:
        return None, f"give exactly {n} shares (one per player, in seat order)"
    total = sum(shares)
    if total > 1 + TOLERANCE:
        return None, f"shares sum to {total:.6f}; they may sum to at most 1"
    if total > 1:  # within the tolerance (decimals that do not add up exactly): scaled to 1,
        shares = [share / total for share in shares]  # or the pie would pay more than itself
    return shares, None


def parse_vote(text: str) -> bool | None:
    word = text.strip().lower().removeprefix("vote").strip(" :.")
    return {"yes": True, "no": False}.get(word)


@dataclasses.dataclass
class PieState:
    round: int
    proposer: str
    phase: str = "propose"  # propose -> vote -> (next round | done)
    proposal: list[float] | None = None
    votes: dict[str, bool] = dataclasses.field(default_factory=dict)
    failed: bool = False
    payoffs: dict[str, float] = dataclasses.field(default_factory=dict)
    agreed: bool = False


_SCRIPTED = "parley.agents.scripted.negotiation"
_BASELINES = {
    **{f"player_{i}": f"{_SCRIPTED}:PieBargainer" for i in range(3)},
    "*": f"{_SCRIPTED}:PieBargainer",
}
_ABOUT = (
    "Baron-Ferejohn majority-rule bargaining, 3-7 players; random proposer, "
    "everyone votes, the pie shrinks by delta each round."
)


@registered(baselines=_BASELINES, description=_ABOUT)
class SplitThePieV0(Scenario):
    """Baron-Ferejohn closed-rule bargaining; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("negotiation/split-the-pie-v0")
    default_invalid_penalty = 0.05
    bargain: PieState

    def snapshot(self) -> Any:
        return self.bargain

    def __init__(
        self,
        n_players: int = 3,
        delta: float = 0.9,
        max_rounds: int = 10,
        *,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        if not 3 <= n_players <= 7:
            raise ConfigError(f"n_players must be 3..7, got {n_players}")
        if not 0.0 < delta <= 1.0 or max_rounds < 1:
            raise ConfigError(f"need 0 < delta <= 1 and max_rounds >= 1 ({delta}, {max_rounds})")
        seats = [f"player_{i}" for i in range(n_players)]
        super().__init__(
            seats, render_mode=render_mode, max_cycles=max_cycles, invalid_penalty=invalid_penalty
        )
        self.n, self.delta, self.max_rounds = n_players, float(delta), max_rounds

    @property
    def pie(self) -> float:
        return self.delta**self.bargain.round

    def new_episode(self, rng: np.random.Generator) -> None:
        self.bargain = PieState(round=0, proposer=self._draw_proposer())
        for seat in self.possible_agents:
            self.tell(seat, f"You are {seat} of {self.n} players; {quota(self.n)} votes pass.")
        self._announce_round()

    def _draw_proposer(self) -> str:
        return str(self.possible_agents[int(self.rng.integers(self.n))])

    def _announce_round(self) -> None:
        game = self.bargain
        self.announce(
            f"Round {game.round + 1}: the pie is {self.pie:.6f}; {game.proposer} proposes."
        )

    def acting(self) -> list[str]:
        if self.bargain.phase == "propose":
            return [self.bargain.proposer]
        return [seat for seat in self.possible_agents if seat not in self.bargain.votes]

    def play(self, seat: str, action: str) -> str | None:
        if self.bargain.phase == "propose":
            shares, reason = parse_proposal(action, self.n)
            if shares is None:
                self.bargain.failed = True
                self.announce(f"{seat} made no valid proposal; the round fails.")
                return reason
            self.bargain.proposal, self.bargain.phase = shares, "vote"
            listed = " ".join(f"{share:.6f}" for share in shares)
            self.announce(f"{seat} proposes shares {listed} (in seat order). Vote yes or no.")
            return None
        vote = parse_vote(action)
        self.bargain.votes[seat] = bool(vote)
        return None if vote is not None else "vote 'yes' or 'no' (counted as no)"

    def resolve(self) -> None:
        if self.bargain.phase == "vote" and len(self.bargain.votes) == self.n:
            yes = sum(self.bargain.votes.values())
            if yes >= quota(self.n) and self.bargain.proposal is not None:
                self.announce(f"Passed with {yes} yes votes.")
                self._end(agreed=True)
                return
            self.announce(f"Rejected ({yes} yes votes).")
            self.bargain.failed = True
        if self.bargain.failed:
            self._next_round()

    def _next_round(self) -> None:
        if self.bargain.round + 1 >= self.max_rounds:
            self.bargain.round += 1
            self.announce("No agreement within the round limit; everyone gets 0.")
            self._end(agreed=False)
            return
        self.bargain = PieState(round=self.bargain.round + 1, proposer=self._draw_proposer())
        self._announce_round()

    def _end(self, *, agreed: bool) -> None:
        self.bargain.agreed, self.bargain.phase = agreed, "done"
        shares = self.bargain.proposal if agreed and self.bargain.proposal else [0.0] * self.n
        for seat, share in zip(self.possible_agents, shares, strict=True):
            self.bargain.payoffs[seat] = share * self.pie
            self.reward(seat, "task", self.bargain.payoffs[seat])
        self.finish()

    def prompt(self, seat: str) -> str:
        if self.bargain.phase == "propose":
            return f"Propose {self.n} shares in seat order: propose: s0 s1 ... (sum <= 1)."
        return "Vote: yes or no."

    def constraint(self, seat: str) -> dict[str, Any] | None:
        if self.bargain.phase == "propose":
            number = r"(0(\.[0-9]{1,6})?|1(\.0{1,6})?)"
            return {"type": "regex", "pattern": f"propose:( {number}){{{self.n}}}"}
        return {"type": "choice", "choices": ["yes", "no"]}

    def view(self, seat: str) -> dict[str, Any]:
        return {
            "seat": seat,
            "index": self.possible_agents.index(seat),
            "n": self.n,
            "delta": self.delta,
            "quota": quota(self.n),
            "round": self.bargain.round,
            "pie": self.pie,
            "phase": self.bargain.phase,
            "proposer": self.bargain.proposer,
            "proposal": list(self.bargain.proposal) if self.bargain.proposal is not None else None,
        }

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """Nothing is private: proposals and votes are public, proposers drawn as play goes."""
        return False

    def system_prompt(self, seat: str) -> str:
        return (
            f"{self.n} players split a pie by majority vote. Each round a random proposer "
            "writes 'propose: s0 s1 ...' (one share of the current pie per player, in seat "
            f"order, summing to at most 1); then everyone votes yes or no. With "
            f"{quota(self.n)} yes votes the shares are paid; otherwise the pie shrinks by the "
            f"factor {self.delta} and a new round starts ({self.max_rounds} rounds at most)."
        )

    def metrics(self) -> dict[str, float]:
        if self.bargain.phase != "done":
            return {}
        out = {"agreed": float(self.bargain.agreed), "success": float(self.bargain.agreed)}
        out["rounds"] = float(self.bargain.round + (1 if self.bargain.agreed else 0))
        if self.bargain.agreed and self.bargain.proposal is not None:
            index = self.possible_agents.index(self.bargain.proposer)
            out["proposer_share"] = self.bargain.proposal[index]
            out["total_payoff"] = sum(self.bargain.payoffs.values())
        return out


@registered(baselines=_BASELINES, description=_ABOUT + " v1: a refused move uses up the turn.")
class SplitThePieV1(RefusedMoveTakesTurn, SplitThePieV0):
    """v1: a move the action space refuses uses up the turn (:mod:`parley.scenarios.refusals`)."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("negotiation/split-the-pie-v1")


# Deprecated: the name before the <Game>V<n> convention, for imports written against it.
SplitThePie = SplitThePieV0
