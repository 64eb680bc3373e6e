"""negotiation/simple-trade-v1 - SPIRAL's SimpleNegotiation, rule for rule.

The two-resource trade game SPIRAL trains on (arXiv 2506.24119; ``spiral/envs/
SimpleNegotiation/env.py`` on TextArena 0.6.4, ``max_turns=10``, ``error_allowance=0``).
Both players start with Wood 10 and Gold 10; ``player_0`` values Wood 5 / Gold 15,
``player_1`` Wood 15 / Gold 5; each knows only its own values and stock. They alternate,
``player_0`` first, for ``max_turns`` turns in total. The larger gain in inventory value wins
(+1 / -1; equal gains draw, 0 / 0).

Seats: ``player_0``, ``player_1``.

Actions: any text; the whole text goes to the partner as a message. Tokens in it act:

=================================  ==========================================================
``[Offer: 3 Wood -> 2 Gold]``      offer what you give -> what you ask; ``,`` or ``and`` join
                                   items (``[Offer: 1 Wood and 2 Gold -> 3 Wood]``); every
                                   quantity > 0; ``I give`` / ``I offer`` may lead; plurals
                                   ``Woods``/``Golds`` and any letter case are accepted
``[Accept]``                       accept the partner's pending offer (the trade executes)
``[Deny]``                         deny the partner's pending offer
=================================  ==========================================================

The rules, as SPIRAL's environment applies them each turn, in this order:

1. A pending offer made to you: ``[Accept]`` executes it when both sides hold what it moves.
   If you lack what it asks, that is an invalid move; if the offerer lacks what it offered,
   or neither holds enough, the offer is cancelled (no fault). ``[Deny]`` clears it. A turn
   with neither leaves it pending: an offer persists until accepted, denied or countered.
2. ``[Accept]`` while your own offer is pending is an invalid move; ``[Accept]`` or
   ``[Deny]`` with nothing pending is ignored.
3. Then the first ``[Offer: ...]`` in the text, if any (also after an ``[Accept]`` in the
   same turn): a malformed offer, or one offering more than you hold, is an invalid move;
   otherwise it becomes the pending offer (a counter-offer denies the partner's offer).

The first invalid move ends the game: -1 to the offender, 0 to the partner. So does an
action outside the action space (not printable ASCII, too long).

Option ``randomize=True`` (not SPIRAL's game; for training on varied games): each episode
draws each player's stock of each resource from 5-15 and its values from 1-20, redrawn until
the two players rank the resources differently (so some trade helps both).

Observations: the player's stock and values first, then the partner's messages and the
game's notices (offers made, accepted, denied, cancelled), then what to do.
``infos[seat]["view"]`` holds ``inventory``, ``values``, ``pending`` (``{"give": {...},
"get": {...}}`` from this seat's side, or ``None``), ``pending_from_partner`` and
``turns_left``.

Rewards (on the last step):

==========  ====================================================================
component   value
==========  ====================================================================
task        +1 to the larger gain in inventory value, -1 to the other, 0 on a tie;
            -1 to the first invalid move's author (0 to the partner)
invalid     -``invalid_penalty`` per invalid move (default 0: the -1 is the game's)
==========  ====================================================================

Metrics: ``gain_player_0``, ``gain_player_1``, ``trades``, ``draw``, ``forfeit``.

Arguments: ``max_turns`` (10), ``randomize`` (False), ``invalid_penalty``, ``max_cycles``,
``render_mode``.

    >>> env = make("negotiation/simple-trade-v1", randomize=True)

Version history: v0 - first version (its own offer syntax, offers that lapse after one
turn, turns lost to invalid moves). v1 - SPIRAL's rules exactly (above), and ``randomize``.
v2 - v1 with ``quote_messages`` on: every line after the first of a message is indented in
the other's observation, so a message cannot forge the scenario's notices (``player_1
accepted the offer``, ``Game over. player_1 made an invalid move.``: the first invalid move
loses, so inducing one pays); v1 is kept as it was.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

import numpy as np

from parley.scenarios.base import Scenario
from parley.scenarios.declaring import quoted_description, text_metadata, turn_limit
from parley.scenarios.helpers import TextMemo
from parley.scenarios.negotiation.simple_trade import (
    RESOURCES,
    SEATS,
    START,
    VALUES,
    Bundle,
    covers,
    pending_view,
    show_cached,
    trade_metrics,
    trade_view,
    transfer,
    zero_sum,
)
from parley.scenarios.registry import registered

# The versions; the rules' helpers (for scripted agents and tests) are imported by path.
__all__ = ["SimpleTradeV1", "SimpleTradeV2"]

# SPIRAL's patterns. Its offer pattern, r"\[Offer:\s*(?:I\s+(?:give|offer)\s+)?([^\[\]]+?)\s*\.*\]",
# backtracks quadratically (20 ms on 1,000 characters of spaces); find_offer matches the same
# bodies in linear time.
ACCEPT = re.compile(r"\[Accept\]", re.IGNORECASE)
DENY = re.compile(r"\[Deny\]", re.IGNORECASE)
_OFFER_START = re.compile(r"\[Offer:", re.IGNORECASE)
_LEAD = re.compile(r"I(\s+)(?:give|offer)(\s+)", re.IGNORECASE)
_ITEM = re.compile(r"^(\d+)\s+(.+)$")
_ALIASES = {"Woods": "Wood", "Golds": "Gold"}
# Compiled once: re.split/re.sub with a pattern string look it up in re's cache every call.
_ITEMS = re.compile(r",\s*|\s+and\s+", re.IGNORECASE)
_LEADING = re.compile(r"^(I\s+(?:give|offer)\s+)", re.IGNORECASE)
_ARROW = re.compile(r"\s*->\s*")
_BRACKET = re.compile(r"[\[\]]")
_SIMPLE = re.compile(r"(\d{1,9}) (" + "|".join(RESOURCES) + ")")
_CANON = re.compile(r"\[Offer: (\d{1,9}) (Wood|Gold) -> (\d{1,9}) (Wood|Gold)\]")


def parse_resources(text: str) -> Bundle | None:
    """``"2 Wood and 1 Gold"`` -> ``{"Wood": 2, "Gold": 1}``; ``None`` if any item is bad."""
    simple = _SIMPLE.fullmatch(text)
    if simple is not None:  # one plain "N Wood" item, the usual case: the same result
        n = int(simple.group(1))
        return {simple.group(2): n} if n > 0 else None
    bundle: Bundle = {}
    for item in _ITEMS.split(text):
        item = item.strip()
        if not item:
            continue
        match = _ITEM.match(item)
        if match is None:
            return None
        digits, name = match.groups()
        name = name.strip().title()
        name = _ALIASES.get(name, name)
        if len(digits) > 9 or name not in RESOURCES:
            return None  # (9 digits: more than any stock; keeps int() cheap)
        n = int(digits)
        if n <= 0:
            return None
        bundle[name] = bundle.get(name, 0) + n
    return bundle


def find_offer(text: str) -> str | None:
    """What SPIRAL's offer pattern captures in ``text`` (its group 1), or ``None``.

    The same result, backtracking included, in linear time: after ``[Offer:`` the match can
    only run to the first bracket, which must be ``]``; within that run ``R`` the pattern
    takes all leading whitespace, then ``I give``/``I offer`` if present, then the shortest
    non-empty body whose remainder is spaces-then-dots.
    """
    for start in _OFFER_START.finditer(text):
        p = start.end()
        bracket = _BRACKET.search(text, p)
        if bracket is None or bracket.group() != "]" or bracket.start() == p:
            continue
        run = text[p : bracket.start()]
        lead = len(run) - len(run.lstrip())
        if lead == len(run):  # all whitespace: \s* gives back its last character
            return run[-1]
        body_at = lead
        phrase = _LEAD.match(run, lead)
        if phrase is not None:
            if phrase.end() < len(run):
                body_at = phrase.end()
            elif len(phrase.group(2)) > 1:  # the last \s+ gives back one character
                body_at = len(run) - 1
        tail = len(run.rstrip(".").rstrip())  # the longest spaces-then-dots suffix starts here
        return run[body_at : max(body_at + 1, tail)]
    return None


def parse_offer(text: str) -> tuple[Bundle, Bundle] | None:
    """The ``(give, get)`` of an offer body (what follows ``[Offer:``), or ``None``."""
    text = " ".join(text.split())
    text = text.rstrip(".,!?")  # SPIRAL: re.sub(r"[.,!?]+$", "", text), without its O(n^2)
    text = _LEADING.sub("", text)
    parts = _ARROW.split(text)
    if len(parts) != 2:
        return None
    give, get = parse_resources(parts[0].strip()), parse_resources(parts[1].strip())
    return (give, get) if give and get else None


_MOVES = "Write a message with [Offer: 3 Wood -> 2 Gold], [Accept] or [Deny] if you wish."


def _read(action: str) -> tuple[bool, bool, tuple[Bundle, Bundle] | str | None]:
    """What ``play`` reads in ``action``: whether it holds ``[Accept]``, ``[Deny]``, and its
    offer (``None``: none; ``""``: malformed; else ``(give, get)``, shared between calls and
    only read): what :data:`ACCEPT`, :data:`DENY`, :func:`find_offer` and
    :func:`parse_offer` make of it.

    ``play`` only sees moves inside the action space (printable ASCII and newline), where
    ``str.lower`` is exactly the patterns' ``IGNORECASE``: the brackets are found by plain
    substring search. The first offer, when its bracket closes, is parsed from that bracket
    alone and remembered per bracket text (:data:`_offer_in`): offers recur, in the words
    around them or not, while whole messages rarely do."""
    low = action.lower()
    accept, deny = "[accept]" in low, "[deny]" in low
    at = low.find("[offer:")
    if at < 0:
        return accept, deny, None  # (find_offer would find no offer either)
    bracket = _BRACKET.search(action, at + 7)
    if bracket is not None and bracket.group() == "]" and bracket.start() > at + 7:
        # find_offer stops at this offer: its result depends on the bracket alone.
        return accept, deny, _offer_in(action[at : bracket.end()])
    body = find_offer(action)  # (an empty or unclosed first offer: a later one may count)
    return accept, deny, None if body is None else (parse_offer(body.strip()) or "")


def _offer_of(bracket: str) -> tuple[Bundle, Bundle] | str:
    """The offer in ``bracket`` (``[Offer:`` + a non-empty run without brackets + ``]``):
    ``""`` when malformed, else ``(give, get)``."""
    canon = _CANON.fullmatch(bracket)
    if canon is not None:
        # The syntax the prompt teaches: what find_offer and parse_offer make of it (one
        # "N Resource" a side, N > 0) without their passes.
        n_give, give_r, n_get, get_r = canon.groups()
        give, get = int(n_give), int(n_get)
        return ({give_r: give}, {get_r: get}) if give > 0 and get > 0 else ""
    body = find_offer(bracket)
    return "" if body is None else (parse_offer(body.strip()) or "")


_offer_in = TextMemo(_offer_of)
""":func:`_offer_of`, remembered per bracket text."""


@dataclasses.dataclass
class NegotiationState:
    inventory: dict[str, Bundle]
    start: dict[str, Bundle]
    values: dict[str, Bundle]
    turn_index: int = 0
    pending: dict[str, Any] | None = None  # {"from": seat, "give": Bundle, "get": Bundle}
    trades: int = 0
    forfeit: str = ""
    outcome: dict[str, float] = dataclasses.field(default_factory=dict)


_SCRIPTED = "parley.agents.scripted.negotiation"
_BASELINES = {
    "player_0": f"{_SCRIPTED}:SpiralTrader",
    "player_1": f"{_SCRIPTED}:SpiralTrader",
}


@registered(
    baselines=_BASELINES,
    description="SPIRAL's SimpleNegotiation rule for rule ([Offer: 3 Wood -> 2 Gold], "
    "offers persist, the first invalid move loses); randomize=True varies "
    "values and stocks.",
)
class SimpleTradeV1(Scenario):
    """SPIRAL's SimpleNegotiation, exactly; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("negotiation/simple-trade-v1")
    trade: NegotiationState

    def snapshot(self) -> Any:
        return self.trade

    def __init__(
        self,
        max_turns: int = 10,
        randomize: bool = False,
        *,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(
            SEATS, render_mode=render_mode, max_cycles=max_cycles, invalid_penalty=invalid_penalty
        )
        self.max_turns, self.randomize = turn_limit(max_turns), bool(randomize)
        self.new_episode_draws = self.randomize  # (the fixed start draws nothing)

    def new_episode(self, rng: np.random.Generator) -> None:
        if self.randomize:
            start = {seat: {r: int(rng.integers(5, 16)) for r in RESOURCES} for seat in SEATS}
            values = _random_values(rng)
        else:
            start = {seat: dict(START) for seat in SEATS}
            values = {seat: dict(VALUES[seat]) for seat in SEATS}
        inventory = {seat: dict(start[seat]) for seat in SEATS}
        self.trade = NegotiationState(inventory, start, values)

    def brief(self) -> None:
        start, values = self.trade.start, self.trade.values
        for seat in SEATS:
            mine = ", ".join(
                f"{r} {start[seat][r]} (worth {values[seat][r]} each)" for r in RESOURCES
            )
            self.tell(seat, f"You are {seat}. You hold: {mine}.")

    def acting(self) -> list[str]:
        return [SEATS[self.trade.turn_index % 2]]

    def play(self, seat: str, action: str) -> str | None:
        message = action.strip()
        if message:
            self.say(seat, message)
        accept, deny, parsed = _read(action)
        reason = self._answer_pending(seat, accept, deny)
        if reason is None:
            reason = self._new_offer(seat, parsed)
        return reason

    def _answer_pending(self, seat: str, accept: bool, deny: bool) -> str | None:
        offer = self.trade.pending
        if offer is None:
            return None  # accept/deny with nothing pending: ignored
        if offer["from"] == seat:
            if accept:
                return "you cannot accept your own offer"
            return None
        if accept:
            return self._execute(seat, offer)
        if deny:
            self.trade.pending = None
            self.announce(f"{seat} denied the offer from {offer['from']}.")
        return None

    def _execute(self, seat: str, offer: dict[str, Any]) -> str | None:
        offerer = offer["from"]
        offerer_ok = covers(self.trade.inventory[offerer], offer["give"])
        taker_ok = covers(self.trade.inventory[seat], offer["get"])
        if offerer_ok and not taker_ok:
            return "you accepted a trade without holding what it asks of you"
        self.trade.pending = None
        if not offerer_ok:
            self.announce(f"Trade cancelled: {offerer} no longer holds what it offered.")
            return None
        transfer(self.trade.inventory, offer, seat)
        self.trade.trades += 1
        self.announce(f"{seat} accepted the offer from {offerer}.")
        return None

    def _new_offer(self, seat: str, parsed: tuple[Bundle, Bundle] | str | None) -> str | None:
        if parsed is None:
            return None
        if isinstance(parsed, str):  # ("": malformed)
            return "an offer looks like [Offer: 3 Wood -> 2 Gold] (quantities > 0)"
        give, get = parsed  # (shared with _read's cache: read, never changed)
        if not covers(self.trade.inventory[seat], give):
            return "you offered more than you hold"
        previous = self.trade.pending
        if previous is not None and previous["from"] != seat:
            self.announce(f"{seat} implicitly denied the offer from {previous['from']}.")
        self.trade.pending = {"from": seat, "give": give, "get": get}
        partner = SEATS[1 - SEATS.index(seat)]
        self.announce(f"{seat} offers {partner}: {show_cached(give)} -> {show_cached(get)}.")
        return None

    def resolve(self) -> None:
        # Called once per step, after the mover's play (or after the machinery refused an
        # action outside the action space, when play is not called at all).
        mover = SEATS[self.trade.turn_index % 2]  # (acting(), without building its list)
        self.trade.turn_index += 1
        # SPIRAL: error_allowance=0, so the first invalid move (which ends the game) forfeits.
        if self.invalid_moves() > 0:
            self.trade.forfeit = mover
            self._end({mover: -1.0}, f"{mover} made an invalid move.")
        elif self.trade.turn_index >= self.max_turns:
            gains = self.gains()
            self._end(zero_sum(gains), f"Gains: {gains[SEATS[0]]} / {gains[SEATS[1]]}.")

    def _end(self, outcome: dict[str, float], why: str) -> None:
        self.trade.outcome = {seat: outcome.get(seat, 0.0) for seat in SEATS}
        for seat in SEATS:
            self.reward(seat, "task", self.trade.outcome[seat])
        self.announce(f"Game over. {why}")
        self.finish()

    def gains(self) -> dict[str, int]:
        return {
            seat: sum(
                (self.trade.inventory[seat][r] - self.trade.start[seat][r])
                * self.trade.values[seat][r]
                for r in RESOURCES
            )
            for seat in SEATS
        }

    def pending_for(self, seat: str) -> dict[str, Bundle] | None:
        return pending_view(self.trade.pending, seat)

    def prompt(self, seat: str) -> str:
        left = self.max_turns - self.trade.turn_index
        offer = self.trade.pending
        status = ""
        if offer is not None and offer["from"] != seat:
            give, get = show_cached(offer["get"]), show_cached(offer["give"])
            status = f"Pending offer to you: you give {give}, you get {get}. "
        held = show_cached(self.trade.inventory[seat])
        return f"{status}You hold {held}. {left} turns left. {_MOVES}"

    def view(self, seat: str) -> dict[str, Any]:
        s, left = self.trade, self.max_turns - self.trade.turn_index
        return trade_view(seat, s.inventory[seat], s.values[seat], s.pending, left)

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """The partner's values (its stock decides which trades go through, which both see)."""
        partner = SEATS[1 - SEATS.index(keep)]
        self.trade.values[partner] = {r: int(rng.integers(1, 21)) for r in RESOURCES}
        return True

    def system_prompt(self, seat: str) -> str:
        return (
            "You trade Wood and Gold with one partner; you know only your own stock and values. "
            "Each turn write a message; it may hold [Offer: 3 Wood -> 2 Gold] (you give -> you "
            "get; join items with ',' or 'and'; quantities > 0), [Accept] or [Deny] (the "
            "partner's pending offer; an offer stays pending until answered or countered). "
            f"After {self.max_turns} turns in total the player whose inventory value grew more "
            "wins. Any invalid move (a malformed offer, offering what you do not hold, "
            "accepting your own offer or what you cannot pay) loses the game at once."
        )

    def metrics(self) -> dict[str, float]:
        out = trade_metrics(self.gains(), self.trade.trades)
        if self.trade.outcome:
            out["draw"] = float(self.trade.outcome[SEATS[0]] == self.trade.outcome[SEATS[1]])
            out["forfeit"] = float(bool(self.trade.forfeit))
        return out


def _random_values(rng: np.random.Generator) -> dict[str, Bundle]:
    while True:
        values = {seat: {r: int(rng.integers(1, 21)) for r in RESOURCES} for seat in SEATS}
        a, b = values[SEATS[0]], values[SEATS[1]]
        if a["Wood"] * b["Gold"] != a["Gold"] * b["Wood"]:  # different ratios: gains exist
            return values


@registered(baselines=_BASELINES, description=quoted_description(SimpleTradeV1))
class SimpleTradeV2(SimpleTradeV1):
    """v2: v1 with ``quote_messages`` on; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("negotiation/simple-trade-v2")
    quote_messages = True


# Deprecated: the names before the <Game>V<n> convention, for imports written against them.
SimpleNegotiation = SimpleTradeV1
SimpleNegotiationV2 = SimpleTradeV2
