"""Scripted baselines for the collaboration scenarios.

* :class:`CodeSpeaker` / :class:`CodeListener` - referential: a fixed code, the target's
  index in mixed radix written in base ``vocab_size`` (lossless whenever
  ``vocab_size ** message_length >= n_values ** n_attributes``). The listener answers by
  number or by name, as the scenario's ``answer`` option asks.
* :class:`FactSharer` - hidden-profile: shares all its facts in the first round (with the
  ``share`` move where the scenario offers it), then counts every distinct fact it has seen
  (hidden-profile-v1's notebook included) and votes for the best option (reaches 100%).
* :class:`FactHoarder` - hidden-profile: never talks and votes from its own facts alone,
  breaking ties at random (stays near chance: the reference for how much talking buys).
* :class:`FactTeller` - hidden-profile: shares like :class:`FactSharer`, then abstains (a
  partner that informs a learner but leaves the team's choice to it).
"""

from __future__ import annotations

from typing import Any

from parley.agents.scripted.base import ScriptedAgent
from parley.protocols.messages import Observation
from parley.scenarios.collaboration.hidden_profile import Fact, parse_facts, tally
from parley.scenarios.collaboration.referential import describe

__all__ = ["CodeListener", "CodeSpeaker", "FactHoarder", "FactSharer", "FactTeller", "encode"]


def encode(obj: list[int], n_values: int, vocab: str, length: int) -> str:
    """The fixed code of an object: its index, in base ``len(vocab)``, ``length`` letters."""
    index = 0
    for value in obj:
        index = index * n_values + value
    index %= len(vocab) ** length
    letters = []
    for _ in range(length):
        index, digit = divmod(index, len(vocab))
        letters.append(vocab[digit])
    return "".join(reversed(letters))


class CodeSpeaker(ScriptedAgent):
    name = "code-speaker"

    def decide(self, observation: Observation) -> str:
        view: dict[str, Any] = observation.info.get("view", {})
        if "target" not in view:
            return ""
        return encode(view["target"], view["n_values"], view["vocab"], view["message_length"])


class CodeListener(ScriptedAgent):
    name = "code-listener"

    def decide(self, observation: Observation) -> str:
        view: dict[str, Any] = observation.info.get("view", {})
        candidates = view.get("candidates", [])
        for number, obj in enumerate(candidates, start=1):
            code = encode(obj, view["n_values"], view["vocab"], view["message_length"])
            if code == view.get("message"):
                return describe(tuple(obj)) if view.get("answer") == "name" else str(number)
        if view.get("answer") == "name" and candidates:
            return describe(tuple(candidates[0]))
        return "1"


class FactSharer(ScriptedAgent):
    name = "fact-sharer"
    share = True

    def new_episode(self) -> None:
        self.seen: set[Fact] = set()
        self.own: list[str] = []
        self.spoke = False

    def decide(self, observation: Observation) -> str:
        view: dict[str, Any] = observation.info.get("view", {})
        if not self.own:
            self.own = [Fact(**f).line() for f in view.get("facts", [])]
            self.seen.update(Fact(**f) for f in view.get("facts", []))
        if self.share:
            self.seen.update(parse_facts(observation.text))
            # hidden-profile-v1's notebook: the scenario's record of the facts told to us
            # (shared facts then travel as bare ids, which parse_facts cannot read).
            self.seen.update(Fact(**f) for f in view.get("known", []))
        if view.get("phase") == "vote":
            return self.vote(view["options"])
        if self.share and not self.spoke:
            self.spoke = True
            choices = (observation.info.get("constraint") or {}).get("choices", [])
            return "share" if "share" in choices else "My facts: " + " ".join(self.own)
        return "pass"

    def vote(self, options: str) -> str:
        worth = tally(self.seen, options)
        top = max(worth.values())
        leaders = [o for o in options if worth[o] == top]
        return leaders[int(self.rng.integers(len(leaders)))]


class FactHoarder(FactSharer):
    name = "fact-hoarder"
    share = False


class FactTeller(FactSharer):
    """Shares like :class:`FactSharer`, then abstains (``abstain`` is an invalid vote, which
    counts as no vote): a partner whose facts help but who leaves the team's choice to the
    others, so a learner beside two of them decides it alone (the scripted partner of the
    first stages of ``examples/hidden-profile.yaml``)."""

    name = "fact-teller"

    def vote(self, options: str) -> str:
        return "abstain"
