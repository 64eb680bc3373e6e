"""Scripted baselines for the negotiation scenarios.

* :class:`DealNegotiator` — deal-or-no-deal: proposes divisions in a parseable form
  (``propose: book=1 hat=0 ball=2``, what it takes), conceding over turns, and accepts a
  partner's proposal worth at least its current target by writing ``<selection>``.
* :class:`Trader` — simple-trade-v0: offers trades that raise its own inventory value and
  accepts offers that raise it by a margin.
* :class:`SpiralTrader` — the same strategy in simple-trade-v1's syntax (SPIRAL's rules),
  never making an invalid move (one loses the game there).
* :class:`PieBargainer` — split-the-pie: the stationary subgame-perfect strategy of
  Baron-Ferejohn closed-rule bargaining.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

from parley.agents.scripted.base import ScriptedAgent
from parley.protocols.messages import Observation

__all__ = ["DealNegotiator", "PieBargainer", "SpiralTrader", "Trader"]

_PROPOSAL = re.compile(r"propose:\s*book=(\d+)\s+hat=(\d+)\s+ball=(\d+)", re.IGNORECASE)
Counts = tuple[int, ...]


def _value(take: Counts, values: Counts) -> int:
    return sum(t * v for t, v in zip(take, values, strict=True))


class DealNegotiator(ScriptedAgent):
    """Concedes from 10 points down to ``floor``; the deal is the last proposal on the table.

    Both sides claim the last proposal: the proposer claims what it proposed to take, the
    seat that wrote ``<selection>`` claims the rest.
    """

    name = "deal-negotiator"
    floor = 5

    def new_episode(self) -> None:
        self.my_turns = 0
        self.my_last: Counts | None = None
        self.partner_last: Counts | None = None

    def target(self, turns_left: int) -> int:
        if turns_left <= 2:
            return 1
        return max(self.floor, 10 - self.my_turns)

    def decide(self, observation: Observation) -> str:
        view: dict[str, Any] = observation.info.get("view", {})
        counts: Counts = tuple(view.get("counts", (0, 0, 0)))
        values: Counts = tuple(view.get("values", (0, 0, 0)))
        if view.get("phase") == "choose":
            return self.claim(view, counts)
        match = _PROPOSAL.search(view.get("last_message", ""))
        if match is not None:
            self.partner_last = tuple(int(g) for g in match.groups())
        target = self.target(int(view.get("turns_left", 0)))
        self.my_turns += 1
        if self.partner_last is not None:
            mine = tuple(c - t for c, t in zip(counts, self.partner_last, strict=True))
            if min(mine) >= 0 and _value(mine, values) >= target:
                return "<selection>"
        self.my_last = self.propose(counts, values, target)
        book, hat, ball = self.my_last
        return f"propose: book={book} hat={hat} ball={ball} (I take these, you take the rest)"

    @staticmethod
    def propose(counts: Counts, values: Counts, target: int) -> Counts:
        """Among takes worth >= target, the one leaving the partner the most items."""
        takes = [tuple(t) for t in itertools.product(*(range(c + 1) for c in counts))]
        good = [t for t in takes if _value(t, values) >= target] or [tuple(counts)]
        return min(good, key=lambda t: (sum(t), -_value(t, values), t))

    def claim(self, view: dict[str, Any], counts: Counts) -> str:
        if view.get("selector") == view.get("seat"):
            deal = self.partner_last
            take = None if deal is None else tuple(c - d for c, d in zip(counts, deal, strict=True))
        else:
            take = self.my_last
        if take is None:
            return "no agreement"
        rest = tuple(c - t for c, t in zip(counts, take, strict=True))
        return "book={} hat={} ball={} / book={} hat={} ball={}".format(*take, *rest)


class Trader(ScriptedAgent):
    """Offers 2 of its cheaper resource for 1 of its dearer; accepts gains of 10 or more."""

    name = "trader"
    accept_gain = 10

    def decide(self, observation: Observation) -> str:
        view: dict[str, Any] = observation.info.get("view", {})
        values: dict[str, int] = view.get("values", {})
        inventory: dict[str, int] = view.get("inventory", {})
        pending = view.get("pending")
        if not values:
            return "[Deny]"
        if pending is not None and view.get("pending_from_partner"):
            gain = sum(values[r] * n for r, n in pending["get"].items())
            gain -= sum(values[r] * n for r, n in pending["give"].items())
            if gain >= self.accept_gain and all(
                inventory.get(r, 0) >= n for r, n in pending["give"].items()
            ):
                return "Deal. [Accept]"
        cheap, dear = sorted(values, key=lambda r: (values[r], r))[:2]
        if inventory.get(cheap, 0) < 2:
            return "I have nothing more to offer. [Deny]" if pending else "Let us wait."
        return f"How about this? [Offer: I give 2 {cheap}; You give 1 {dear}]"


class SpiralTrader(ScriptedAgent):
    """simple-trade-v1 (SPIRAL's syntax and rules): never makes an invalid move.

    Accepts a pending offer that raises its own inventory value by ``accept_gain`` or more
    and that it can pay; otherwise, unless its own offer is still pending, offers the fewest
    units of its cheaper resource that buy one unit of its dearer one at a gain.
    """

    name = "spiral-trader"
    accept_gain = 10

    def decide(self, observation: Observation) -> str:
        view: dict[str, Any] = observation.info.get("view", {})
        values: dict[str, int] = view.get("values", {})
        stock: dict[str, int] = view.get("inventory", {})
        pending = view.get("pending")
        if not values:
            return "Hello."
        if pending is not None and view.get("pending_from_partner"):
            gain = sum(values[r] * n for r, n in pending["get"].items())
            gain -= sum(values[r] * n for r, n in pending["give"].items())
            if gain >= self.accept_gain and all(
                stock.get(r, 0) >= n for r, n in pending["give"].items()
            ):
                return "Deal. [Accept]"
        elif pending is not None:
            return "My offer stands."
        cheap, dear = sorted(values, key=lambda r: (values[r], r))[:2]
        units = max(1, math.ceil(values[dear] / max(values[cheap], 1)) - 1)
        if values[dear] <= values[cheap] * units or stock.get(cheap, 0) < units:
            return "I will wait. [Deny]" if pending else "I will wait."
        return f"How about this? [Offer: {units} {cheap} -> 1 {dear}]"


class PieBargainer(ScriptedAgent):
    """The stationary subgame-perfect strategy of closed-rule Baron-Ferejohn bargaining.

    As proposer: offer ``delta/n`` (rounded up to 6 decimals) to ``q - 1`` other players
    drawn at random, keep the rest. As voter: yes iff the own share is at least ``delta/n``
    (the continuation value; indifference votes yes).
    """

    name = "pie-bargainer"

    def decide(self, observation: Observation) -> str:
        view: dict[str, Any] = observation.info.get("view", {})
        n, delta = int(view.get("n", 0)), float(view.get("delta", 1.0))
        quota = int(view.get("quota", n // 2 + 1))
        member = math.ceil(delta / n * 1e6) / 1e6 if n else 0.0
        index = int(view.get("index", 0))
        if view.get("phase") == "propose":
            others = [i for i in range(n) if i != index]
            partners = self.rng.choice(others, size=quota - 1, replace=False)
            shares = [0.0] * n
            for i in partners:
                shares[int(i)] = member
            shares[index] = max(0.0, 1.0 - sum(shares))
            return "propose: " + " ".join(f"{share:.6f}" for share in shares)
        proposal = view.get("proposal") or []
        own = proposal[index] if index < len(proposal) else 0.0
        is_proposer = view.get("proposer") == view.get("seat")
        return "yes" if is_proposer or own >= delta / n - 1e-6 else "no"
