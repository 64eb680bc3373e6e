"""negotiation/deal-or-no-deal-v1 (and v0) — divide books, hats and balls (Lewis et al. 2017).

The game of "Deal or No Deal? End-to-End Learning for Negotiation Dialogues" (Lewis, Yarats,
Dauphin, Parikh, Batra; arXiv 1706.05125), with the published context constraints.

Context: three item types (book, hat, ball), each count 1-4, 5-7 items in total. Each player
has private non-negative integer values with ``Σ count·value = 10``; every item type is worth
something to at least one player, and at least one item type is worth something to both.
v1 draws the context uniformly from the 5,295 valid ones (:func:`valid_contexts`), as the
published data is: item totals 5 / 6 / 7 in about 47 / 38 / 15 % of episodes, so scores
compare with the paper's. v0 drew the counts uniformly until the total was 5-7, then each
value vector uniformly (totals about 21 / 36 / 43 %).

Seats: ``player_0``, ``player_1``. The first speaker is drawn at random.

Actions (talk phase, the speaker only):

====================  ============================================================
``<selection>``        end the talk; both players then state the division
any other text         a message to the partner (delivered in its next observation)
====================  ============================================================

Actions (choose phase, both players at once, independently)::

    book=1 hat=0 ball=2 / book=0 hat=2 ball=1     (what I take / what my partner takes)
    no agreement

Agreement holds iff, for every item type, the two players' "I take" numbers add up exactly
to the count. The talk ends after ``max_turns`` messages at the latest (then both choose).
An empty message or a malformed claim is an invalid move (a malformed claim counts as no
agreement); in v1 so is a claim whose own two halves do not add up to the counts. In v1 a
move the action space refuses (characters outside the charset, too long) is an invalid move
that still uses up the seat's turn, as an empty message or a malformed claim does, so the
talk always ends after ``max_turns`` messages.

Observations: the private context first, then the partner's messages as they come, then a
line saying what to do. ``infos[seat]["view"]`` holds ``phase``, ``counts``, ``values``,
``turns_left``, ``last_message`` (the partner's latest message) and ``selector`` (the seat
that wrote the selection token and so ended the talk; ``""`` while talking, and when the
turn limit ended it).

The scripted partner (:class:`parley.agents.scripted.negotiation.DealNegotiator`, the
``scripted`` spec) writes ``propose: book=B hat=H ball=L (I take these, you take the rest)``
(what it would take), concedes over its turns, and writes the selection token once the
partner's last proposal in that form leaves it at least its current target; then each side
claims that proposal (the proposer what it proposed to take, the selector the rest). An
agent that wants to deal with it reads that form in ``view["last_message"]`` (case does not
matter, spaces separate the three counts) and proposes in the same form.

Rewards (on the last step):

==========  ====================================================================
component   value
==========  ====================================================================
task        Σ own take x own value (0-10) if agreed, else 0 for both
invalid     -``invalid_penalty`` per invalid move (default 0.5)
==========  ====================================================================

Metrics: ``score`` (mean of the two players' scores), ``score_player_0``, ``score_player_1``,
``agreed`` (= ``success``), and when agreed ``score_agreed`` and ``pareto_optimal``.

Arguments: ``max_turns`` (20, messages before the choice is forced), ``invalid_penalty``,
``max_cycles``, ``render_mode``.

    >>> env = make("negotiation/deal-or-no-deal-v1", max_turns=10)

v2 (``negotiation/deal-or-no-deal-v2``) is v1 with one more argument, ``moves``: ``"text"``
(the default) plays exactly as v1; ``"proposals"`` is the game for small models trained by RL
(``examples/deal-or-no-deal.md``):

* talk moves are offered as a "choice" between every ``propose: book=B hat=H ball=L`` (what
  the speaker would take; the scripted partner's own form) and ``<selection>`` (free text
  stays legal, as in v1);
* the choice step offers ``deal`` (claim the division of the last proposal in the dialogue:
  what I proposed to take, or the rest of what my partner proposed to take), every complete
  claim, and ``no agreement``; ``deal`` with no proposal in the dialogue is an invalid move
  (no agreement);
* prompts are short: the brief is ``Items: book 1x2 hat 3x1 ball 1x3`` (count x your value)
  and the talk prompt ``Propose or <selection>:``, the choice prompt ``Claim:``.

The rules are Lewis's: each side still states its division independently and scores only if
the two add up; ``deal`` only spares a small model the copying of three numbers.

    >>> env = make("negotiation/deal-or-no-deal-v2", moves="proposals", max_turns=6)

Version history: v0 — first version. v1 — contexts uniform over the valid contexts (the
published distribution); a claim whose halves do not add up to the counts is invalid; a move
outside the action space uses up the turn (in v0 it changes nothing). v2 — the ``moves``
argument (v2 with ``moves="text"`` plays as v1). v3 — v2 with ``quote_messages`` on (a
message cannot forge a line of the scenario's, such as the selection prompt). All:
text from the action is escaped into the observation charset (no score changes).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from typing import Any, ClassVar

import numpy as np

from parley.protocols.errors import ConfigError
from parley.scenarios.base import Scenario
from parley.scenarios.declaring import quoted_description, text_metadata, turn_limit
from parley.scenarios.refusals import RefusedMoveTakesTurn
from parley.scenarios.registry import registered

# The versions; the rules' helpers (for scripted agents and tests) are imported by path.
__all__ = ["DealOrNoDealV0", "DealOrNoDealV1", "DealOrNoDealV2", "DealOrNoDealV3"]

ITEMS = ("book", "hat", "ball")
TOTAL_VALUE = 10
MIN_ITEMS, MAX_ITEMS = 5, 7
SEATS = ("player_0", "player_1")
SELECTION = "<selection>"
NO_AGREEMENT = "no agreement"
_TAKE = r"book=(\d+)\s+hat=(\d+)\s+ball=(\d+)"
_CLAIM = re.compile(rf"^\s*{_TAKE}\s*/\s*{_TAKE}\s*$", re.IGNORECASE)

Counts = tuple[int, int, int]


# --- rules: pure functions ------------------------------------------------------------------


def value_vectors(counts: Counts) -> list[Counts]:
    """Every non-negative integer value vector with Σ count·value = 10."""
    ranges = [range(TOTAL_VALUE // c + 1) for c in counts]
    return [
        (a, b, c)
        for a, b, c in itertools.product(*ranges)
        if a * counts[0] + b * counts[1] + c * counts[2] == TOTAL_VALUE
    ]


def valid_context(counts: Counts, values_a: Counts, values_b: Counts) -> bool:
    """The published constraints on a context (see the module docstring)."""
    if not MIN_ITEMS <= sum(counts) <= MAX_ITEMS or not all(1 <= c <= 4 for c in counts):
        return False
    for values in (values_a, values_b):
        if sum(c * v for c, v in zip(counts, values, strict=True)) != TOTAL_VALUE:
            return False
    worthless_to_both = any(a == 0 and b == 0 for a, b in zip(values_a, values_b, strict=True))
    valued_by_both = any(a > 0 and b > 0 for a, b in zip(values_a, values_b, strict=True))
    return valued_by_both and not worthless_to_both


def generate_context(rng: np.random.Generator) -> tuple[Counts, Counts, Counts]:
    """Draw ``(counts, values_player_0, values_player_1)`` meeting the constraints."""
    while True:
        counts: Counts = tuple(int(c) for c in rng.integers(1, 5, size=3))  # type: ignore[assignment]
        if MIN_ITEMS <= sum(counts) <= MAX_ITEMS:
            break
    vectors = value_vectors(counts)
    while True:
        values_a = vectors[int(rng.integers(len(vectors)))]
        values_b = vectors[int(rng.integers(len(vectors)))]
        if valid_context(counts, values_a, values_b):
            return counts, values_a, values_b


@functools.cache
def valid_contexts() -> tuple[tuple[Counts, Counts, Counts], ...]:
    """Every valid ``(counts, values_player_0, values_player_1)``, in a fixed order (5,295).

    The published data (facebookresearch/end-to-end-negotiator) is uniform over these: item
    totals 5 / 6 / 7 in about 47 / 38 / 15 % of contexts.
    """
    out = []
    for counts in itertools.product(range(1, 5), repeat=3):
        vectors = value_vectors(counts)  # type: ignore[arg-type]
        for values_a, values_b in itertools.product(vectors, repeat=2):
            if valid_context(counts, values_a, values_b):  # type: ignore[arg-type]
                out.append((counts, values_a, values_b))
    return tuple(out)  # type: ignore[arg-type]


def sample_context(rng: np.random.Generator) -> tuple[Counts, Counts, Counts]:
    """One context drawn uniformly from :func:`valid_contexts` (v1; the paper's distribution)."""
    contexts = valid_contexts()
    return contexts[int(rng.integers(len(contexts)))]


def score(take: Counts, values: Counts) -> int:
    """Value of the items ``take`` under ``values``."""
    return sum(t * v for t, v in zip(take, values, strict=True))


def agreement(counts: Counts, take_a: Counts, take_b: Counts) -> bool:
    """The claims agree iff they add up to the counts for every item type."""
    return all(a + b == c for a, b, c in zip(take_a, take_b, counts, strict=True))


def divisions(counts: Counts) -> list[Counts]:
    """Every way to pick what player A takes (player B takes the rest)."""
    return [tuple(t) for t in itertools.product(*(range(c + 1) for c in counts))]  # type: ignore[misc]


def pareto_optimal(counts: Counts, values_a: Counts, values_b: Counts, take_a: Counts) -> bool:
    """No other division is at least as good for both players and better for one."""
    rest: Counts = tuple(c - t for c, t in zip(counts, take_a, strict=True))  # type: ignore[assignment]
    score_a, score_b = score(take_a, values_a), score(rest, values_b)
    for other in divisions(counts):
        other_rest: Counts = tuple(c - t for c, t in zip(counts, other, strict=True))  # type: ignore[assignment]
        a, b = score(other, values_a), score(other_rest, values_b)
        if a >= score_a and b >= score_b and (a > score_a or b > score_b):
            return False
    return True


def parse_claim(
    text: str, counts: Counts, *, complete: bool = False
) -> tuple[Counts | None, str | None]:
    """``(take, None)`` for a valid claim, ``(None, None)`` for "no agreement", or a reason.

    ``complete`` (v1): the claim's two halves must add up to the counts, item by item.
    """
    if text.strip().lower() == NO_AGREEMENT:
        return None, None
    match = _CLAIM.match(text)
    if match is None:
        return None, (
            "a claim looks like 'book=1 hat=0 ball=2 / book=0 hat=2 ball=1' "
            "(what you take / what your partner takes) or 'no agreement'"
        )
    numbers = [int(g) for g in match.groups()]
    mine, theirs = numbers[:3], numbers[3:]
    for name, m, t, c in zip(ITEMS, mine, theirs, counts, strict=True):
        if m > c or t > c:
            return None, f"there are only {c} {name}(s); claims cannot exceed the count"
        if complete and m + t != c:
            return None, f"there are {c} {name}(s); your two halves give {m} + {t}"
    return (mine[0], mine[1], mine[2]), None


def describe(counts: Counts, values: Counts) -> str:
    return " ".join(
        f"{item} x{c} (worth {v} each to you)"
        for item, c, v in zip(ITEMS, counts, values, strict=True)
    )


# --- the scenario ------------------------------------------------------------------------


@dataclasses.dataclass
class DealState:
    counts: Counts
    values: dict[str, Counts]
    first: str
    speaker: str
    phase: str = "talk"  # talk -> choose -> done
    talk_turns: int = 0
    selector: str = ""
    dialogue: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    claims: dict[str, Counts | None] = dataclasses.field(default_factory=dict)
    agreed: bool = False
    scores: dict[str, int] = dataclasses.field(default_factory=dict)


_SCRIPTED = "parley.agents.scripted.negotiation"
_BASELINES = {
    "player_0": f"{_SCRIPTED}:DealNegotiator",
    "player_1": f"{_SCRIPTED}:DealNegotiator",
}


@registered(
    baselines=_BASELINES,
    description="Lewis et al. 2017: divide books, hats and balls valued privately; "
    "agreement only when both claims add up.",
)
class DealOrNoDealV0(Scenario):
    """Lewis et al. (2017) multi-issue bargaining; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("negotiation/deal-or-no-deal-v0")
    default_invalid_penalty = 0.5
    complete_claims: ClassVar[bool] = False
    """v1: a claim whose halves do not add up to the counts is invalid."""
    deal: DealState

    def snapshot(self) -> Any:
        return self.deal

    def __init__(
        self,
        max_turns: int = 20,
        *,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(
            SEATS, render_mode=render_mode, max_cycles=max_cycles, invalid_penalty=invalid_penalty
        )
        self.max_turns = turn_limit(max_turns)

    def partner(self, seat: str) -> str:
        return SEATS[1 - SEATS.index(seat)]

    def new_episode(self, rng: np.random.Generator) -> None:
        counts, values_a, values_b = self.draw_context(rng)
        first = SEATS[int(rng.integers(2))]
        self.deal = DealState(counts, {SEATS[0]: values_a, SEATS[1]: values_b}, first, first)

    def brief(self) -> None:
        for agent in SEATS:
            self.tell(
                agent,
                f"You are {agent}. Items: {describe(self.deal.counts, self.deal.values[agent])}. "
                f"{self.deal.first} speaks first.",
            )

    def draw_context(self, rng: np.random.Generator) -> tuple[Counts, Counts, Counts]:
        return generate_context(rng)

    def acting(self) -> list[str]:
        if self.deal.phase == "talk":
            return [self.deal.speaker]
        return (
            [a for a in SEATS if a not in self.deal.claims] if self.deal.phase == "choose" else []
        )

    def play(self, seat: str, action: str) -> str | None:
        if self.deal.phase == "choose":
            take, reason = parse_claim(action, self.deal.counts, complete=self.complete_claims)
            self.deal.claims[seat] = take
            return reason
        text = action.strip()
        reason = None
        if text.lower() == SELECTION:
            self.deal.phase, self.deal.selector = "choose", seat
            self.announce(f"{seat} chose {SELECTION}. Both now state the division.")
        elif not text:
            reason = f"empty message; write a message or {SELECTION}"
        else:
            self.say(seat, text)
            self.deal.dialogue.append((seat, text))
        self.deal.talk_turns += 1
        self.deal.speaker = self.partner(seat)
        if self.deal.phase == "talk" and self.deal.talk_turns >= self.max_turns:
            self.deal.phase = "choose"
            self.announce("The talk is over (turn limit). Both now state the division.")
        return reason

    def resolve(self) -> None:
        if self.deal.phase != "choose" or len(self.deal.claims) < len(SEATS):
            return
        take_a, take_b = self.deal.claims[SEATS[0]], self.deal.claims[SEATS[1]]
        agreed = take_a is not None and take_b is not None
        agreed = agreed and agreement(self.deal.counts, take_a, take_b)  # type: ignore[arg-type]
        self.deal.agreed, self.deal.phase = agreed, "done"
        for agent in SEATS:
            take = self.deal.claims[agent]
            points = score(take, self.deal.values[agent]) if agreed and take is not None else 0
            self.deal.scores[agent] = points
            self.reward(agent, "task", points)
        outcome = "Deal" if agreed else "No deal (the claims do not add up)"
        self.announce(
            f"{outcome}: {self.deal.scores[SEATS[0]]} / {self.deal.scores[SEATS[1]]} points."
        )
        self.finish()

    def prompt(self, seat: str) -> str:
        if self.deal.phase == "choose":
            return (
                "State the division: book=_ hat=_ ball=_ / book=_ hat=_ ball=_ "
                "(what you take / what your partner takes), or: no agreement"
            )
        left = self.max_turns - self.deal.talk_turns
        return f"Your turn ({left} messages left): write to your partner, or {SELECTION}."

    def constraint(self, seat: str) -> dict[str, Any] | None:
        if self.deal.phase != "choose":
            return None
        take = " ".join(f"{item}=[0-{c}]" for item, c in zip(ITEMS, self.deal.counts, strict=True))
        return {"type": "regex", "pattern": f"({take} / {take})|{NO_AGREEMENT}"}

    def view(self, seat: str) -> dict[str, Any]:
        partner = self.partner(seat)
        heard = [text for who, text in self.deal.dialogue if who == partner]
        return {
            "seat": seat,
            "phase": self.deal.phase,
            "counts": list(self.deal.counts),
            "values": list(self.deal.values[seat]),
            "turns_left": self.max_turns - self.deal.talk_turns,
            "last_message": heard[-1] if heard else "",
            "selector": self.deal.selector,
        }

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """The partner's values: another vector valid with ``keep``'s values and the counts."""
        partner = self.partner(keep)
        mine, theirs = self.deal.values[keep], self.deal.values[partner]
        choices = [
            v
            for v in value_vectors(self.deal.counts)
            if v != theirs
            and valid_context(self.deal.counts, *((mine, v) if keep == SEATS[0] else (v, mine)))
        ]
        if not choices:
            return False
        self.deal.values[partner] = choices[int(rng.integers(len(choices)))]
        return True

    def system_prompt(self, seat: str) -> str:
        return (
            "You negotiate how to divide books, hats and balls with a partner. You each value "
            "the items differently and privately; the items are worth 10 points in total to "
            "you. Take turns writing short messages. When you have a deal, write "
            f"{SELECTION}. Then both of you state the division independently as "
            "'book=1 hat=0 ball=2 / book=0 hat=2 ball=1' (what you take / what your partner "
            "takes). If the two claims add up you both score the value of what you take; "
            "otherwise both score 0."
        )

    def metrics(self) -> dict[str, float]:
        if self.deal.phase != "done":
            return {}
        scores = [float(self.deal.scores[a]) for a in SEATS]
        out = {
            "score": sum(scores) / 2,
            "score_player_0": scores[0],
            "score_player_1": scores[1],
            "agreed": float(self.deal.agreed),
            "success": float(self.deal.agreed),
        }
        take_a = self.deal.claims[SEATS[0]]
        if self.deal.agreed and take_a is not None:
            out["score_agreed"] = out["score"]
            out["pareto_optimal"] = float(
                pareto_optimal(
                    self.deal.counts, self.deal.values[SEATS[0]], self.deal.values[SEATS[1]], take_a
                )
            )
        return out


@registered(
    baselines=_BASELINES,
    description="Lewis et al. 2017 with the published context distribution; a claim "
    "whose halves do not add up to the counts is invalid.",
)
class DealOrNoDealV1(RefusedMoveTakesTurn, DealOrNoDealV0):
    """v1: contexts uniform over the valid ones, and claims must be complete divisions."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("negotiation/deal-or-no-deal-v1")
    complete_claims = True

    def draw_context(self, rng: np.random.Generator) -> tuple[Counts, Counts, Counts]:
        return sample_context(rng)


MOVES = ("text", "proposals")
DEAL = "deal"
PROPOSAL = re.compile(r"propose:\s*book=(\d+)\s+hat=(\d+)\s+ball=(\d+)", re.IGNORECASE)


def proposal_text(take: Counts) -> str:
    """``propose: book=1 hat=0 ball=2`` - what the speaker would take."""
    return "propose: book={} hat={} ball={}".format(*take)


def claim_text(take: Counts, counts: Counts) -> str:
    """The complete claim ``book=1 hat=0 ball=2 / book=0 hat=2 ball=1`` of ``take``."""
    rest = tuple(c - t for c, t in zip(counts, take, strict=True))
    return "book={} hat={} ball={} / book={} hat={} ball={}".format(*take, *rest)


@registered(
    baselines=_BASELINES,
    description="deal-or-no-deal-v1 with moves='proposals': offered proposals, a 'deal' "
    "claim and short prompts, for small models trained by RL (default: as v1).",
)
class DealOrNoDealV2(DealOrNoDealV1):
    """v2: v1 plus ``moves="proposals"`` (offered proposals, a ``deal`` claim, short prompts)."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("negotiation/deal-or-no-deal-v2")

    def __init__(
        self,
        max_turns: int = 20,
        *,
        moves: str = "text",
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        if moves not in MOVES:
            raise ConfigError(f"moves must be one of {MOVES}, got {moves!r}")
        super().__init__(
            max_turns,
            invalid_penalty=invalid_penalty,
            max_cycles=max_cycles,
            render_mode=render_mode,
        )
        self.proposals = moves == "proposals"

    def last_proposal(self, seat: str) -> Counts | None:
        """What ``seat`` takes under the last proposal in the dialogue (None: there is none)."""
        for who, text in reversed(self.deal.dialogue):
            match = PROPOSAL.search(text)
            if match is None:
                continue
            take: Counts = tuple(int(g) for g in match.groups())  # type: ignore[assignment]
            if any(t > c for t, c in zip(take, self.deal.counts, strict=True)):
                continue  # not a division of these items
            if who == seat:
                return take
            return tuple(c - t for c, t in zip(self.deal.counts, take, strict=True))  # type: ignore[return-value]
        return None

    def brief(self) -> None:
        if not self.proposals:
            super().brief()
            return
        for agent in SEATS:
            items = " ".join(
                f"{item} {c}x{v}"
                for item, c, v in zip(ITEMS, self.deal.counts, self.deal.values[agent], strict=True)
            )
            self.tell(agent, f"Items: {items}")

    def play(self, seat: str, action: str) -> str | None:
        if self.proposals and self.deal.phase == "choose" and action.strip().lower() == DEAL:
            take = self.last_proposal(seat)
            self.deal.claims[seat] = take
            return None if take is not None else "no proposal in the dialogue to claim"
        return super().play(seat, action)

    def prompt(self, seat: str) -> str:
        if not self.proposals:
            return super().prompt(seat)
        return "Claim:" if self.deal.phase == "choose" else f"Propose or {SELECTION}:"

    def constraint(self, seat: str) -> dict[str, Any] | None:
        if not self.proposals:
            return super().constraint(seat)
        takes = divisions(self.deal.counts)
        if self.deal.phase == "choose":
            claims = [claim_text(t, self.deal.counts) for t in takes]
            return {"type": "choice", "choices": [DEAL, *claims, NO_AGREEMENT]}
        return {"type": "choice", "choices": [*map(proposal_text, takes), SELECTION]}


@registered(baselines=_BASELINES, description=quoted_description(DealOrNoDealV2))
class DealOrNoDealV3(DealOrNoDealV2):
    """v3: v2 with ``quote_messages`` on; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("negotiation/deal-or-no-deal-v3")
    quote_messages = True


# Deprecated: the name before the <Game>V<n> convention, for imports written against it.
DealOrNoDeal = DealOrNoDealV0
