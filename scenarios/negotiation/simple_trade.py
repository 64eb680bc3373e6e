"""negotiation/simple-trade-v0 - a two-resource trade game after SPIRAL's SimpleNegotiation.

The SimpleNegotiation game used by SPIRAL (arXiv 2506.24119, from TextArena): both players
start with Wood 10 and Gold 10; ``player_0`` values Wood 5 / Gold 15, ``player_1`` values
Wood 15 / Gold 5 (each knows only its own values). They take 10 turns in total, alternating,
``player_0`` first. The player whose inventory value grew more wins (zero-sum +1 / -1; a tie
gives 0 to both).

Seats: ``player_0``, ``player_1``.

Actions (the player to move; free text around the bracketed token is delivered to the
partner as a message, and a turn with no token is just a message):

==================================  =====================================================
``[Offer: I give 2 Wood; You give 1 Gold]``  propose a trade (replaces any pending offer)
``[Accept]``                         accept the partner's pending offer (executes the trade)
``[Deny]``                           decline the partner's pending offer
==================================  =====================================================

A pending offer lapses when its receiver does anything but ``[Accept]``. Invalid moves (two
tokens, an offer the offerer cannot cover, accepting with nothing pending, a trade that can
no longer be covered) lose the turn.

Observations: the player's inventory and values, the partner's messages, the state of the
pending offer, and what to do. ``infos[seat]["view"]`` holds ``inventory``, ``values``,
``pending`` (``{"give": {...}, "get": {...}}`` from this seat's side, or ``None``) and
``turns_left``.

Rewards (on the last step):

==========  ====================================================================
component   value
==========  ====================================================================
task        +1 to the larger gain in inventory value, -1 to the other, 0 on a tie
invalid     -``invalid_penalty`` per invalid move (default 0.1)
==========  ====================================================================

Metrics: ``gain_player_0``, ``gain_player_1``, ``trades``, ``draw``.

Arguments: ``max_turns`` (10), ``invalid_penalty``, ``max_cycles``, ``render_mode``.

    >>> env = make("negotiation/simple-trade-v0", max_turns=10)

Version history: v0 - first version (kept reproducible). Its rules differ from SPIRAL's
SimpleNegotiation (offer syntax, offers lapsing after one turn, turns lost to invalid moves,
...): ``negotiation/simple-trade-v1`` plays SPIRAL's rules exactly.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from parley.scenarios.base import Scenario
from parley.scenarios.declaring import text_metadata, turn_limit
from parley.scenarios.helpers import TextMemo
from parley.scenarios.registry import registered

# The versions; the rules' helpers (for scripted agents and tests) are imported by path.
__all__ = ["SimpleTradeV0"]

RESOURCES = ("Wood", "Gold")
SEATS = ("player_0", "player_1")
START = {"Wood": 10, "Gold": 10}
VALUES = {"player_0": {"Wood": 5, "Gold": 15}, "player_1": {"Wood": 15, "Gold": 5}}
_TOKEN = re.compile(r"\[(offer\s*:[^\]]*|accept|deny)\]", re.IGNORECASE)
_OFFER = re.compile(r"offer\s*:\s*i give (.*?)\s*;\s*you give (.*?)\s*$", re.IGNORECASE)
_AMOUNT = re.compile(r"^(\d+)\s+([A-Za-z]+)$")

Bundle = dict[str, int]
_MOVES = "Move: [Offer: I give N Wood; You give N Gold], [Accept], [Deny], or a message."


def parse_bundle(text: str) -> Bundle | None:
    """``"2 Wood, 1 Gold"`` -> ``{"Wood": 2, "Gold": 1}``; ``None`` if malformed."""
    bundle: Bundle = {}
    for part in text.split(","):
        match = _AMOUNT.match(part.strip())
        if match is None:
            return None
        name = match.group(2).capitalize()
        if name not in RESOURCES:
            return None
        bundle[name] = bundle.get(name, 0) + int(match.group(1))
    return bundle


def parse_move(text: str) -> tuple[str, Any, str | None]:
    """``(kind, payload, reason)`` with kind ``"talk"``, ``"offer"``, ``"accept"``, ``"deny"``."""
    return _parse(text, _parse_offer)


def _parse(
    text: str, parse_offer: Callable[[str], tuple[str, Any, str | None]]
) -> tuple[str, Any, str | None]:
    tokens = _TOKEN.findall(text)
    if not tokens:
        return "talk", None, None if text.strip() else "empty turn; write a message or a move"
    if len(tokens) > 1:
        return "talk", None, "one bracketed move per turn"
    token = tokens[0].strip()
    if token.lower() in ("accept", "deny"):
        return token.lower(), None, None
    return parse_offer(token)


def _parse_offer(token: str) -> tuple[str, Any, str | None]:
    """The ``("offer", payload, reason)`` of the one bracketed token ``offer: ...``."""
    match = _OFFER.match(token)
    give = parse_bundle(match.group(1)) if match else None
    get = parse_bundle(match.group(2)) if match else None
    if give is None or get is None:
        return "offer", None, "an offer looks like [Offer: I give 2 Wood; You give 1 Gold]"
    if not any(give.values()) and not any(get.values()):
        return "offer", None, "an offer must move at least one unit"
    return "offer", (give, get), None


# play()'s parse: an offer's token parses the same way every time, and offers recur (a
# scripted agent's few in every episode, a model's among different words), whole messages
# rarely. The payload's dicts are shared between calls: play() only reads them (the public
# parse_move builds fresh ones for callers that may not).
_offer_memo = TextMemo(_parse_offer)


def _parse_cached(text: str) -> tuple[str, Any, str | None]:
    """:func:`parse_move`, with each offer token's parse remembered (payloads shared)."""
    return _parse(text, _offer_memo)


def covers(inventory: Bundle, bundle: Bundle) -> bool:
    return all(inventory.get(r, 0) >= n for r, n in bundle.items())


def inventory_value(inventory: Bundle, values: Bundle) -> int:
    return sum(inventory[r] * values[r] for r in RESOURCES)


def show(bundle: Bundle) -> str:
    return ", ".join([f"{n} {r}" for r, n in bundle.items()]) or "nothing"


_SHOWN: dict[tuple[tuple[str, int], ...], str] = {}


def show_cached(bundle: Bundle) -> str:
    """:func:`show`, remembered per bundle content (a few hundred bundles in practice; the
    memo stops growing at 4,096 and then shows without remembering)."""
    key = tuple(bundle.items())
    text = _SHOWN.get(key)
    if text is None:
        text = show(bundle)
        if len(_SHOWN) < 4096:
            _SHOWN[key] = text
    return text


def transfer(inventory: dict[str, Bundle], offer: dict[str, Any], taker: str) -> None:
    """Execute ``offer`` (``{"from": seat, "give": Bundle, "get": Bundle}``) between its
    author and ``taker``; the caller has checked both sides cover it."""
    offerer = offer["from"]
    for resource, n in offer["give"].items():
        inventory[offerer][resource] -= n
        inventory[taker][resource] += n
    for resource, n in offer["get"].items():
        inventory[taker][resource] -= n
        inventory[offerer][resource] += n


def pending_view(offer: dict[str, Any] | None, seat: str) -> dict[str, Bundle] | None:
    """The pending ``offer`` as ``seat`` sees it: what it gives and gets if it goes through."""
    if offer is None:
        return None
    if offer["from"] == seat:
        return {"give": dict(offer["give"]), "get": dict(offer["get"])}
    return {"give": dict(offer["get"]), "get": dict(offer["give"])}


def trade_view(
    seat: str, inventory: Bundle, values: Bundle, offer: dict[str, Any] | None, turns_left: int
) -> dict[str, Any]:
    """``Scenario.view`` of both versions: the seat's own state and the pending offer."""
    return {
        "seat": seat,
        "inventory": dict(inventory),
        "values": dict(values),
        "pending": pending_view(offer, seat),
        "pending_from_partner": bool(offer and offer["from"] != seat),
        "turns_left": turns_left,
    }


def zero_sum(gains: dict[str, int]) -> dict[str, float]:
    """The task rewards of both versions' end: +1 to the larger gain, -1 to the other, 0 (and
    -0.0, as ``-sign`` writes it) on a tie."""
    diff = gains[SEATS[0]] - gains[SEATS[1]]
    sign = float((diff > 0) - (diff < 0))  # (np.sign's value, without its call)
    return {SEATS[0]: sign, SEATS[1]: -sign}


def trade_metrics(gains: dict[str, int], trades: int) -> dict[str, float]:
    """The metrics both versions report alike: each seat's gain and the trades made."""
    out = {f"gain_{seat}": float(gains[seat]) for seat in SEATS}
    out["trades"] = float(trades)
    return out


@dataclasses.dataclass
class TradeState:
    inventory: dict[str, Bundle]
    turn_index: int = 0
    pending: dict[str, Any] | None = None  # {"from": seat, "give": Bundle, "get": Bundle}
    trades: int = 0
    outcome: dict[str, float] = dataclasses.field(default_factory=dict)


_SCRIPTED = "parley.agents.scripted.negotiation"
_BASELINES = {"player_0": f"{_SCRIPTED}:Trader", "player_1": f"{_SCRIPTED}:Trader"}


@registered(
    baselines=_BASELINES,
    description="SPIRAL's SimpleNegotiation: trade Wood and Gold; the larger gain in "
    "inventory value wins (zero-sum).",
)
class SimpleTradeV0(Scenario):
    """SPIRAL's SimpleNegotiation; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("negotiation/simple-trade-v0")
    default_invalid_penalty = 0.1
    new_episode_draws = False  # (the same start every episode)
    trade: TradeState

    def snapshot(self) -> Any:
        return self.trade

    def __init__(
        self,
        max_turns: int = 10,
        *,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(
            SEATS, render_mode=render_mode, max_cycles=max_cycles, invalid_penalty=invalid_penalty
        )
        self.max_turns = turn_limit(max_turns)
        self.values: dict[str, Bundle] = {seat: dict(VALUES[seat]) for seat in SEATS}

    def new_episode(self, rng: np.random.Generator) -> None:
        # Per episode, outside the state (v0's state() is unchanged); redraw_private edits it.
        self.values = {seat: dict(VALUES[seat]) for seat in SEATS}
        self.trade = TradeState({seat: dict(START) for seat in SEATS})

    def brief(self) -> None:
        for seat in SEATS:
            values = ", ".join(f"{r} {v}" for r, v in self.values[seat].items())
            self.tell(seat, f"You are {seat}. You hold {show(START)}. Your values: {values}.")

    def acting(self) -> list[str]:
        return [SEATS[self.trade.turn_index % 2]]

    def play(self, seat: str, action: str) -> str | None:
        if action.strip():
            self.say(seat, action.strip())
        kind, payload, reason = _parse_cached(action)
        pending = (
            self.trade.pending
            if self.trade.pending and self.trade.pending["from"] != seat
            else None
        )
        if reason is None and kind in ("accept", "deny") and pending is None:
            reason = f"there is no offer to {kind}"
        if (
            reason is None
            and kind == "offer"
            and not covers(self.trade.inventory[seat], payload[0])
        ):
            reason = "you cannot give more than you hold"
        if reason is None and kind == "accept" and pending is not None:
            reason = self._execute(seat, pending)
        if reason is None and kind == "offer":
            give, get = payload
            self.trade.pending = {"from": seat, "give": give, "get": get}
        elif pending is not None:
            self.trade.pending = None  # anything but an offer of one's own lets the offer lapse
        self.trade.turn_index += 1
        if self.trade.turn_index >= self.max_turns:
            self._score()
        return reason

    def _execute(self, seat: str, offer: dict[str, Any]) -> str | None:
        offerer = offer["from"]
        if not covers(self.trade.inventory[offerer], offer["give"]) or not covers(
            self.trade.inventory[seat], offer["get"]
        ):
            return "the trade can no longer be covered"
        transfer(self.trade.inventory, offer, seat)
        self.trade.trades += 1
        self.announce(f"Trade done: {offerer} gave {show(offer['give'])} for {show(offer['get'])}.")
        return None

    def gains(self) -> dict[str, int]:
        return {
            seat: inventory_value(self.trade.inventory[seat], self.values[seat])
            - inventory_value(START, self.values[seat])
            for seat in SEATS
        }

    def _score(self) -> None:
        gains = self.gains()
        self.trade.outcome = zero_sum(gains)
        for seat in SEATS:
            self.reward(seat, "task", self.trade.outcome[seat])
        self.announce(f"Game over. Gains: {gains[SEATS[0]]} / {gains[SEATS[1]]}.")
        self.finish()

    def pending_for(self, seat: str) -> dict[str, Bundle] | None:
        return pending_view(self.trade.pending, seat)

    def prompt(self, seat: str) -> str:
        left = self.max_turns - self.trade.turn_index
        offer = self.trade.pending
        held = f"You hold {show_cached(self.trade.inventory[seat])}. {left} turns left. "
        if offer is None or offer["from"] == seat:
            return held + _MOVES
        return (
            f"Pending offer to you: you give {show_cached(offer['get'])}, "
            f"you get {show_cached(offer['give'])}. {held}{_MOVES}"
        )

    def view(self, seat: str) -> dict[str, Any]:
        left = self.max_turns - self.trade.turn_index
        return trade_view(
            seat, self.trade.inventory[seat], self.values[seat], self.trade.pending, left
        )

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """The partner's values (each player knows only its own)."""
        partner = SEATS[1 - SEATS.index(keep)]
        self.values[partner] = {r: int(rng.integers(1, 21)) for r in RESOURCES}
        return True

    def system_prompt(self, seat: str) -> str:
        return (
            "You trade Wood and Gold with one partner. You each start with 10 Wood and 10 Gold "
            "and value them differently (you know only your own values). On your turn write "
            "[Offer: I give 2 Wood; You give 1 Gold], [Accept] or [Deny] (the partner's pending "
            "offer), optionally with a message. After 10 turns the player whose inventory "
            "value grew more wins."
        )

    def metrics(self) -> dict[str, float]:
        out = trade_metrics(self.gains(), self.trade.trades)
        if self.trade.outcome:
            out["draw"] = float(self.trade.outcome[SEATS[0]] == 0)
        return out


# Deprecated: the name before the <Game>V<n> convention, for imports written against it.
SimpleTrade = SimpleTradeV0
