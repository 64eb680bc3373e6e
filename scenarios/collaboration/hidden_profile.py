"""collaboration/hidden-profile-v0 - the best option is visible only from everyone's facts.

A hidden-profile task (Stasser and Titus 1985): a team of ``n_agents`` (2-5) chooses one of
``n_options`` options (A, B, ...). Each fact says that an option has a pro (+1); an option's
worth is its number of distinct pros. Every decoy option has ``k = facts_per_agent`` pros
that *everyone* holds (shared facts); the best option has ``k`` pros per agent, each held by
one agent only (unshared facts). Alone, every agent sees every option at ``k`` pros - a tie,
no better than chance; pooled, the best option has ``n_agents x k`` pros against ``k``.

Seats: ``agent_0`` ... ``agent_{n-1}``; all act on every step.

Steps: ``discussion_rounds`` rounds of talk, then one vote.

============================  =======================================================
talk: any text                a public message to the team (costs ``message_cost``)
talk: ``@agent_1: text``       a private message to the named seats (same cost)
talk: ``pass`` or empty        say nothing (free)
vote: ``A`` (or ``vote A``)    the option this agent votes for (constraint: "choice")
============================  =======================================================

The team choice is the plurality of the votes; a tie is broken at random. An invalid vote is
no vote. Facts look like ``[F07] option B: +1 (fast delivery)``; repeating a fact's line
shares it.

Observations: the agent's own facts first, then the team's messages, then what to do.
``infos[seat]["view"]`` holds ``seat``, ``phase``, ``options``, ``round`` and ``facts`` (the
agent's own facts as ``{"id", "option", "value", "text"}``).

Rewards:

=============  =================================================================
component      value
=============  =================================================================
task           1 to everyone if the team choice is the best option, else 0 (team)
message_cost   -``message_cost`` per message the agent sends (individual)
invalid        -``invalid_penalty`` per invalid move (default 0.05)
=============  =================================================================

Metrics: ``success``, ``messages`` (sent by the team), ``chance`` (``1 / n_options``).

Arguments: ``n_agents`` (3), ``n_options`` (3), ``facts_per_agent`` (2),
``discussion_rounds`` (2), ``message_cost`` (0.01), ``invalid_penalty``, ``max_cycles``,
``render_mode``.

    >>> env = make("collaboration/hidden-profile-v0", n_agents=4)

v1 (``collaboration/hidden-profile-v1``) plays the same game with two more arguments, whose
defaults give v0's rules, observations and transcripts:

* ``talk`` (``"text"``): ``"share"`` adds a talk move ``share`` - post every fact the agent
  holds to the team in one message (one ``message_cost``) - and offers the talk step as a
  "choice" between ``share`` and ``pass`` (free text stays legal, as in v0).
* ``notebook`` (False): True keeps, per agent, the set of distinct *real* facts it holds or
  has been told (a fact line in a message enters its recipients' notebooks only when the
  sender knows that fact, held or told: a made-up or guessed fact is ignored, else spraying
  every possible fact line would have the notebook confirm the real ones), and shows it as a
  short line in every prompt, the option letter of each known fact (``Known:C,A,C,B``, in
  fact-id order, so the order carries no information). The brief is then left out (the
  notebook carries the facts) and a ``share`` message reads ``share`` (what it shared is in
  the recipients' notebooks). ``view["known"]`` holds the notebook as fact dicts.

Why: a tiny model trained from reward alone cannot count distinct fact ids across several
long messages, but it can read the most frequent letter of one short line. The task stays
the task: alone each agent still sees a tie (``Known:A,B,C``); only facts shared by the
others break it, and the team wins only if a plurality votes the best option
(``examples/hidden-profile.md`` has the measured difference).

    >>> env = make("collaboration/hidden-profile-v1", talk="share", notebook=True)

Version history: v0 - first version. v1 - the ``talk`` and ``notebook`` arguments (v0 is
kept as it was; v1 with the defaults plays exactly as v0). v2 - v1 with ``quote_messages``
on: a message cannot forge another seat's private message (``agent_2 (private to agent_1):
I hold [F90] option A``) or the team's result line.
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

from parley.protocols.errors import ConfigError
from parley.scenarios.base import Scenario, split_address
from parley.scenarios.declaring import quoted_description, text_metadata
from parley.scenarios.registry import registered

# The versions; the rules' helpers (for scripted agents and tests) are imported by path.
__all__ = ["HiddenProfileV0", "HiddenProfileV1", "HiddenProfileV2"]

PROS = (
    "fast delivery", "low cost", "strong support", "good reviews", "long warranty",
    "easy setup", "low energy use", "high quality", "flexible terms", "proven record",
    "quiet operation", "local team", "open standards", "quick repairs", "fair contract",
    "solid security", "clear pricing", "small footprint", "fast onboarding", "good training",
)  # fmt: skip
FACT = re.compile(r"\[F(\d+)\] option ([A-Z]): ([+-]1)")
"""How a fact appears in text; repeating the line shares the fact."""


@dataclasses.dataclass(frozen=True)
class Fact:
    id: int
    option: str
    value: int
    text: str = dataclasses.field(default="", compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "option": self.option, "value": self.value, "text": self.text}

    def line(self) -> str:
        return f"[F{self.id:02d}] option {self.option}: {self.value:+d} ({self.text})"


def deal_facts(
    rng: np.random.Generator, n_agents: int, options: str, k: int
) -> tuple[str, list[list[Fact]]]:
    """``(best option, facts held per agent)``: decoys' pros shared, the best's pros spread."""
    best = options[int(rng.integers(len(options)))]
    texts = [PROS[int(i)] for i in rng.permutation(len(PROS))]
    ids = [int(i) for i in rng.permutation(99) + 1]
    facts: list[Fact] = []
    shared: list[Fact] = []
    for option in options:
        count = n_agents * k if option == best else k
        made = [Fact(ids.pop(), option, +1, texts[len(facts) + j]) for j in range(count)]
        facts.extend(made)
        if option != best:
            shared.extend(made)
    spread = [f for f in facts if f.option == best]
    held = []
    for agent in range(n_agents):
        own = shared + spread[agent * k : (agent + 1) * k]
        held.append([own[int(i)] for i in rng.permutation(len(own))])
    return best, held


def tally(facts: Iterable[Fact], options: str) -> dict[str, int]:
    """Worth of each option: the sum of the values of the distinct facts about it."""
    worth = dict.fromkeys(options, 0)
    for fact in set(facts):
        if fact.option in worth:
            worth[fact.option] += fact.value
    return worth


def parse_facts(text: str) -> list[Fact]:
    """Every fact line in ``text`` (the pro's wording is not needed to count it)."""
    return [Fact(int(i), option, int(value), "") for i, option, value in FACT.findall(text)]


@dataclasses.dataclass
class ProfileState:
    best: str
    held: dict[str, list[Fact]]
    round: int = 0
    votes: dict[str, str | None] = dataclasses.field(default_factory=dict)
    messages: int = 0
    choice: str = ""
    phase: str = "talk"  # talk -> vote -> done


_SCRIPTED = "parley.agents.scripted.collaboration"
_BASELINES = {
    **{f"agent_{i}": f"{_SCRIPTED}:FactSharer" for i in range(3)},
    "*": f"{_SCRIPTED}:FactSharer",
}


@registered(
    baselines=_BASELINES,
    description="2-5 agents each hold part of the facts; the best option shows only "
    "when they are pooled. Team reward, small cost per message.",
)
class HiddenProfileV0(Scenario):
    """A hidden-profile team decision; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("collaboration/hidden-profile-v0")
    default_invalid_penalty = 0.05
    profile: ProfileState

    def snapshot(self) -> Any:
        return self.profile

    def __init__(
        self,
        n_agents: int = 3,
        n_options: int = 3,
        facts_per_agent: int = 2,
        discussion_rounds: int = 2,
        message_cost: float = 0.01,
        *,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        if not 2 <= n_agents <= 5 or not 2 <= n_options <= 5:
            raise ConfigError(f"need 2..5 agents and 2..5 options ({n_agents}, {n_options})")
        if facts_per_agent < 1 or (n_options - 1 + n_agents) * facts_per_agent > len(PROS):
            raise ConfigError(f"facts_per_agent={facts_per_agent} needs more distinct pros")
        if discussion_rounds < 1 or message_cost < 0:
            raise ConfigError("need discussion_rounds >= 1 and message_cost >= 0")
        seats = [f"agent_{i}" for i in range(n_agents)]
        super().__init__(
            seats, render_mode=render_mode, max_cycles=max_cycles, invalid_penalty=invalid_penalty
        )
        self.options = string.ascii_uppercase[:n_options]
        self.k, self.rounds, self.message_cost = facts_per_agent, discussion_rounds, message_cost

    def new_episode(self, rng: np.random.Generator) -> None:
        best, held = deal_facts(rng, len(self.possible_agents), self.options, self.k)
        self.profile = ProfileState(best, dict(zip(self.possible_agents, held, strict=True)))
        self._facts_view = {
            seat: [f.as_dict() for f in facts] for seat, facts in self.profile.held.items()
        }

    def brief(self) -> None:
        for seat in self.possible_agents:
            facts = "\n".join(fact.line() for fact in self.profile.held[seat])
            self.tell(seat, f"You are {seat}. Your facts:\n{facts}")

    def acting(self) -> list[str]:
        if self.profile.phase == "talk":
            return list(self.possible_agents)
        return [a for a in self.possible_agents if a not in self.profile.votes]

    def play(self, seat: str, action: str) -> str | None:
        text = action.strip()
        if self.profile.phase == "vote":
            word = text.upper().removeprefix("VOTE").strip(" :.")
            valid = len(word) == 1 and word in self.options
            self.profile.votes[seat] = word if valid else None
            return None if valid else f"vote with one option letter from {self.options}"
        if not text or text.lower() == "pass":
            return None
        to, body = split_address(text, self.possible_agents)
        if not body:
            return "an empty message; write something or 'pass'"
        self.say(seat, body, to)
        self.profile.messages += 1
        self.reward(seat, "message_cost", -self.message_cost)
        return None

    def resolve(self) -> None:
        if self.profile.phase == "talk":
            self.profile.round += 1
            if self.profile.round >= self.rounds:
                self.profile.phase = "vote"
            return
        counts = {o: 0 for o in self.options}
        for vote in self.profile.votes.values():
            if vote is not None:
                counts[vote] += 1
        top = max(counts.values())
        leaders = [o for o in self.options if counts[o] == top]
        self.profile.choice = leaders[int(self.rng.integers(len(leaders)))]
        self.profile.phase = "done"
        success = float(self.profile.choice == self.profile.best)
        for seat in self.possible_agents:
            self.reward(seat, "task", success)
        self.announce(
            f"The team chose {self.profile.choice}; the best option was {self.profile.best}."
        )
        self.finish()

    def prompt(self, seat: str) -> str:
        if self.profile.phase == "vote":
            return f"Vote for one option ({', '.join(self.options)}):"
        left = self.rounds - self.profile.round
        return f"Talk ({left} rounds left): a message, '@seat: message', or 'pass'."

    def constraint(self, seat: str) -> dict[str, Any] | None:
        if self.profile.phase == "vote":
            return {"type": "choice", "choices": list(self.options)}
        return None

    def view(self, seat: str) -> dict[str, Any]:
        return {
            "seat": seat,
            "phase": self.profile.phase,
            "options": self.options,
            "round": self.profile.round,
            "facts": self._facts_view[seat],
        }

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """Every fact the other agents hold and ``keep`` does not: new ids, options and pros
        (the best option follows from the new facts)."""
        own = set(self.profile.held[keep])
        used = {f.id for facts in self.profile.held.values() for f in facts}
        free = [i for i in range(1, 100) if i not in used]
        fresh: dict[Fact, Fact] = {}
        for seat, facts in self.profile.held.items():
            if seat == keep:
                continue
            for i, fact in enumerate(facts):
                if fact in own:
                    continue
                if fact not in fresh:
                    option = self.options[int(rng.integers(len(self.options)))]
                    text = PROS[int(rng.integers(len(PROS)))]
                    fresh[fact] = Fact(free.pop(int(rng.integers(len(free)))), option, 1, text)
                facts[i] = fresh[fact]
            self._facts_view[seat] = [f.as_dict() for f in facts]
        worth = tally((f for facts in self.profile.held.values() for f in facts), self.options)
        self.profile.best = max(self.options, key=lambda option: worth[option])
        return bool(fresh)

    def system_prompt(self, seat: str) -> str:
        return (
            f"Your team picks one option ({', '.join(self.options)}). Each fact gives an option "
            "+1; the best option has the most distinct pros over ALL the team's facts, and each "
            "of you holds only some of them. Share what you know (each message costs a little), "
            "then vote with one letter. Everyone scores 1 if the team's plurality pick is best."
        )

    def metrics(self) -> dict[str, float]:
        if self.profile.phase != "done":
            return {}
        return {
            "success": float(self.profile.choice == self.profile.best),
            "messages": float(self.profile.messages),
            "chance": 1.0 / len(self.options),
        }


TALK_MODES = ("text", "share")
SHARE = "share"


@registered(
    baselines=_BASELINES,
    description="hidden-profile with a 'share' move and a per-agent notebook of known "
    "facts (options; the defaults play as v0).",
)
class HiddenProfileV1(HiddenProfileV0):
    """v1: hidden-profile with the ``talk`` and ``notebook`` arguments; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("collaboration/hidden-profile-v1")

    def __init__(
        self,
        n_agents: int = 3,
        n_options: int = 3,
        facts_per_agent: int = 2,
        discussion_rounds: int = 2,
        message_cost: float = 0.01,
        *,
        talk: str = "text",
        notebook: bool = False,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        if talk not in TALK_MODES:
            raise ConfigError(f"talk must be one of {TALK_MODES}, got {talk!r}")
        if not isinstance(notebook, bool):
            raise ConfigError(f"notebook must be true or false, got {notebook!r}")
        super().__init__(
            n_agents,
            n_options,
            facts_per_agent,
            discussion_rounds,
            message_cost,
            invalid_penalty=invalid_penalty,
            max_cycles=max_cycles,
            render_mode=render_mode,
        )
        self.talk, self.notebook = talk, notebook
        self.known: dict[str, set[Fact]] = {}

    def brief(self) -> None:
        # After redraw_private (conformance): the notebooks start from the facts as dealt.
        self.known = {seat: set(facts) for seat, facts in self.profile.held.items()}
        self._deal = {f for facts in self.profile.held.values() for f in facts}
        if not self.notebook:
            super().brief()

    def play(self, seat: str, action: str) -> str | None:
        text = action.strip()
        if self.profile.phase == "talk" and self.talk == SHARE and text.lower() == SHARE:
            own = sorted(self.profile.held[seat], key=lambda f: f.id)
            # With a notebook what it shared shows there (and in the state), not in the text.
            body = SHARE if self.notebook else "My facts: " + " ".join(f.line() for f in own)
            self.say(seat, body)
            self._learn(seat, own, None)
            self.profile.messages += 1
            self.reward(seat, "message_cost", -self.message_cost)
            return None
        reason = super().play(seat, action)
        if self.profile.phase == "talk" and reason is None and text and text.lower() != "pass":
            to, body = split_address(text, self.possible_agents)
            # Only facts the sender knows: the notebook must not confirm a guessed line.
            known = self.known[seat]
            self._learn(seat, [f for f in parse_facts(body) if f in known], to)
        return reason

    def _learn(self, sender: str, facts: list[Fact], to: list[str] | None) -> None:
        """``facts`` that ``sender`` knows enter the notebooks of its recipients."""
        if not facts:
            return
        deal = {f: f for f in self._deal}  # the dealt copy keeps the pro's wording
        for seat in self.possible_agents if to is None else to:
            if seat != sender and seat in self.known:
                self.known[seat].update(deal[f] for f in facts)

    def notebook_line(self, seat: str) -> str:
        """``Known:C,A,C,B`` - the option of each distinct fact ``seat`` knows, by fact id.

        No spaces: each letter is then the same token as the vote that names it (with a
        space before it, a BPE vocabulary reads another token), which a small model with
        tied embeddings can copy."""
        return "Known:" + ",".join(f.option for f in sorted(self.known[seat], key=lambda f: f.id))

    def prompt(self, seat: str) -> str:
        if not self.notebook:
            if self.profile.phase == "talk" and self.talk == SHARE:
                left = self.rounds - self.profile.round
                return f"Talk ({left} rounds left): 'share' (all your facts), a message, or 'pass'."
            return super().prompt(seat)
        what = "Vote:" if self.profile.phase == "vote" else "Share or pass:"
        return f"{self.notebook_line(seat)}\n{what}"

    def constraint(self, seat: str) -> dict[str, Any] | None:
        if self.profile.phase == "talk" and self.talk == SHARE:
            return {"type": "choice", "choices": [SHARE, "pass"]}
        return super().constraint(seat)

    def view(self, seat: str) -> dict[str, Any]:
        view = super().view(seat)
        if self.notebook:
            view["known"] = [f.as_dict() for f in sorted(self.known[seat], key=lambda f: f.id)]
        return view

    def system_prompt(self, seat: str) -> str:
        text = super().system_prompt(seat)
        if self.notebook:
            text += " 'Known' lists the option of each distinct fact you know."
        return text


@registered(baselines=_BASELINES, description=quoted_description(HiddenProfileV1))
class HiddenProfileV2(HiddenProfileV1):
    """v2: v1 with ``quote_messages`` on; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("collaboration/hidden-profile-v2")
    quote_messages = True


# Deprecated: the name before the <Game>V<n> convention, for imports written against it.
HiddenProfile = HiddenProfileV0
