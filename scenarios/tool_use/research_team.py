"""tool_use/research-team-v0 — two researchers with different search access answer a
multi-hop question about a generated encyclopedia.

Each episode draws a fictional world from ``reset(seed=...)``
(:mod:`parley.scenarios.tools.corpus`: places, organisations, people and events with invented
names and consistent cross-references), so no pretrained model knows the answers. Its articles
are split between two search engines (:mod:`parley.scenarios.tools.search`, SQLite FTS5 BM25):
the ``biographer`` searches the people, the ``geographer`` the places, organisations and events.
Both are asked the same two-hop question, and each hop lies in the other's half, e.g. "Where was
the founder of the Thavio Guild born?" (the geographer finds the founder, the biographer the
founder's birthplace). Seats: ``biographer`` and ``geographer``; they move simultaneously.

Tools (this seat's half only; results arrive in the next observation as
``[call_id] name -> result``): ``search(query, k?)`` — at most 10 BM25 hits
``[{"doc_id", "title", "snippet"}]``, the query is plain words (operators are not syntax) —
and ``open(doc_id)`` — an article: title, a sentence, ``Key: value`` fact lines.

Action: one JSON object per turn (the tool-use syntax of :mod:`parley.scenarios.tools.tool`)::

    {"tool_calls": [{"name": "search", "arguments": {"query": "Thavio Guild"}}],
     "message": "The founder is Rena Volk.", "answer": "Tessamar"}

every key optional: ``tool_calls`` run first, ``message`` (at most 300 characters) goes to
the other seat's next observation, ``answer`` is the seat's final answer (it then stops
acting). ``{}`` waits. Unknown keys, a non-string message or answer, or a longer message are
invalid moves (the turn is used; nothing of the move is applied). A refused move uses the turn
too. The episode ends when both have answered or used their ``max_turns`` turns.

Observations: the question and the tool list first, then tool results and the other seat's
messages. ``infos[seat]["view"]``: ``question``, ``template``, ``subject``, ``chain`` (the
relations to follow from the subject), ``shard``, ``turns_left``, ``tools`` (OpenAI function
specs), ``tool_results`` (this seat's last results as ToolResult dicts) and ``messages`` (what
the other seat sent in the last step). Nothing in ``infos`` holds the answer; the privileged
:meth:`ResearchTeamV0.oracle` hook gives it to in-process oracles only.

Rewards (on the last step; SQuAD-style normalisation: lower case, no punctuation or articles):

==========  =================================================================================
component   value
==========  =================================================================================
task        this seat's token F1 with the reference (1 for an exact match); 0 for an answer
            that names more than one entity of the world or more than one number (answer
            spraying), or has more than 8 words
team        ``team_weight`` (0.5) x the mean of both seats' task scores
invalid     -``invalid_penalty`` (0.05) per invalid move
==========  =================================================================================

Metrics: ``success`` (both exact), ``exact`` and ``f1`` (means over seats), ``tool_calls``,
``messages``.

Arguments: ``max_turns`` (10), ``team_weight`` (0.5), ``corpus_dir`` (None: a directory of
``.txt``/``.md`` files added to both seats' indexes, read once per instance), ``invalid_penalty``,
``max_cycles``, ``render_mode``.

    >>> env = make("tool_use/research-team-v0", max_turns=10)

Version history: v0 — first version (messages are quoted; a refused move uses the turn).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Any, ClassVar

import numpy as np

from parley.scenarios.base import Scenario
from parley.scenarios.declaring import text_metadata, turn_limit
from parley.scenarios.registry import registered
from parley.scenarios.tools.corpus import (
    Document,
    World,
    generate_world,
    load_directory,
    render_document,
)
from parley.scenarios.tools.search import SearchIndex
from parley.scenarios.tools.tool import (
    ToolBox,
    action_constraint,
    parse_turn,
    render_result,
    result_dicts,
)

# The versions; the rules' helpers (for scripted agents and tests) are imported by path.
__all__ = ["ResearchTeamV0"]

SEATS = ("biographer", "geographer")
SHARDS: dict[str, tuple[str, ...]] = {
    "biographer": ("person",),
    "geographer": ("place", "organisation", "event"),
}
"""The entity kinds whose articles each seat's search engine holds."""

TEMPLATES: dict[str, tuple[str, str, tuple[str, str]]] = {
    "founder_birthplace": ("organisation", "Where was the founder of the {} born?",
                           ("founder", "birthplace")),
    "founder_born": ("organisation", "In what year was the founder of the {} born?",
                     ("founder", "born")),
    "employer_headquarters": ("person", "In which town does the organisation that employs {} "
                              "have its headquarters?", ("employer", "headquarters")),
    "employer_founded": ("person", "In what year was the organisation that employs {} founded?",
                         ("employer", "founded")),
}  # fmt: skip
"""Question templates: the subject's kind, the text, the two relations followed. Each hop's
article lies in the other seat's half."""

MAX_MESSAGE_CHARS = 300
MAX_ANSWER_WORDS = 8
_FINALS = {"answer": {"type": "string"}, "message": {"type": "string"}}
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = re.compile(r"[^\w\s]")
_NUMBER = re.compile(r"^\d+$")


def normalize(text: str) -> list[str]:
    """SQuAD's answer normalisation, as words: lower case, no punctuation, no articles."""
    return _ARTICLES.sub(" ", _PUNCT.sub(" ", text.lower())).split()


def answer_f1(answer: str, reference: str) -> float:
    """Token F1 of ``answer`` against ``reference`` (both normalised); 1.0 iff they match."""
    got, want = normalize(answer), normalize(reference)
    common = sum((Counter(got) & Counter(want)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)


def _mentions(words: list[str], names: list[list[str]]) -> int:
    """How many entity names and numbers ``words`` holds (longest names first, no overlap)."""
    count, i = 0, 0
    while i < len(words):
        hit = next((n for n in names if words[i : i + len(n)] == n), None)
        if hit is not None:
            count, i = count + 1, i + len(hit)
            continue
        count += bool(_NUMBER.match(words[i]))
        i += 1
    return count


def grade(answer: str, reference: str, names: list[list[str]]) -> float:
    """The ``task`` score of ``answer`` (module docstring's table); ``names`` are the world's
    entity names, normalised, longest first."""
    words = normalize(answer)
    if len(words) > MAX_ANSWER_WORDS or _mentions(words, names) > 1:
        return 0.0
    return answer_f1(answer, reference)


@dataclasses.dataclass
class ResearchState:
    world: World
    template: str
    subject: str
    turns_left: dict[str, int]
    answers: dict[str, str | None]
    tool_calls: int = 0
    messages: int = 0
    last_results: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    inbox: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    """Messages sent in the step being played, by recipient."""
    delivered: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    """Messages sent in the last step played, by recipient (in the recipient's view)."""
    scores: dict[str, float] = dataclasses.field(default_factory=dict)


_SCRIPTED = "parley.agents.scripted.research"
_BASELINES = {
    "biographer": f"{_SCRIPTED}:Researcher",
    "geographer": f"{_SCRIPTED}:Researcher",
}


@registered(
    baselines=_BASELINES,
    description="Two seats search different halves of a generated encyclopedia (SQLite "
    "FTS5 BM25) and answer a two-hop question together; F1 reward per seat "
    "and team.",
)
class ResearchTeamV0(Scenario):
    """Two seats, two search engines, one multi-hop question; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("tool_use/research-team-v0")
    default_invalid_penalty = 0.05
    refused_move_takes_turn: ClassVar[bool] = True
    research: ResearchState

    def snapshot(self) -> Any:
        return self.research

    def __init__(
        self,
        max_turns: int = 10,
        team_weight: float = 0.5,
        corpus_dir: str | None = None,
        *,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(
            list(SEATS), render_mode=render_mode, max_cycles=max_cycles,
            invalid_penalty=invalid_penalty,
        )  # fmt: skip
        self.max_turns = turn_limit(max_turns)
        self.quote_messages = True
        self.team_weight = team_weight
        # The user corpus is read once per instance, not per episode (it does not change).
        self._user_docs: list[Document] = load_directory(corpus_dir) if corpus_dir else []
        self._indexes: dict[str, SearchIndex] = {}
        self._tools: dict[str, ToolBox] = {}
        # Both seats have the same two tools (over different indexes): one description and
        # one constraint serve both, available before the first reset (system prompts).
        blank = SearchIndex([])
        self._describe = blank.tools().describe()
        self._constraint = action_constraint(blank.tools(), _FINALS)
        blank.close()

    # -- the episode ---------------------------------------------------------------------

    def new_episode(self, rng: np.random.Generator) -> None:
        world = generate_world(rng)
        template = sorted(TEMPLATES)[int(rng.integers(len(TEMPLATES)))]
        subjects = world.of_kind(TEMPLATES[template][0])
        subject = subjects[int(rng.integers(len(subjects)))].name
        self.research = ResearchState(
            world, template, subject,
            turns_left=dict.fromkeys(SEATS, self.max_turns), answers=dict.fromkeys(SEATS),
        )  # fmt: skip

    def brief(self) -> None:
        # Indexes are built here, after any redraw_private, from the final world.
        self._close_indexes()
        for seat in SEATS:
            entities = [e for e in self.research.world.entities.values() if e.kind in SHARDS[seat]]
            docs = [render_document(e, f"{e.kind}-{i}") for i, e in enumerate(entities)]
            self._indexes[seat] = SearchIndex(docs + self._user_docs)
            self._tools[seat] = self._indexes[seat].tools()
            self.tell(seat, f"Question: {self.question}\nYou can search: "
                      f"{self._shard(seat)}.\nTools:\n{self._describe}")  # fmt: skip

    @property
    def question(self) -> str:
        return TEMPLATES[self.research.template][1].format(self.research.subject)

    def reference(self) -> str:
        """The answer: the chain of relations followed from the subject."""
        entity = self.research.subject
        for relation in TEMPLATES[self.research.template][2]:
            entity = self.research.world.entities[entity].facts[relation]
        return entity

    def acting(self) -> list[str]:
        s = self.research
        return [a for a in SEATS if s.answers[a] is None and s.turns_left[a] > 0]

    def play(self, seat: str, action: str) -> str | None:
        self.research.turns_left[seat] -= 1
        self.research.last_results[seat] = []
        parsed = parse_turn(action, turn=self.turn)
        if isinstance(parsed, str):
            return parsed
        fields = parsed.fields
        unknown = sorted(set(fields) - set(_FINALS))
        if unknown:
            return f"unknown keys {unknown}; use tool_calls, message and answer"
        for key in _FINALS:
            if key in fields and not isinstance(fields[key], str):
                return f'"{key}" must be a string'
        message = fields.get("message")
        if message is not None and len(message) > MAX_MESSAGE_CHARS:
            return f"the message has {len(message)} characters; at most {MAX_MESSAGE_CHARS}"
        results = [self._tools[seat].call(call) for call in parsed.calls]
        self.research.tool_calls += len(results)
        self.research.last_results[seat] = result_dicts(results)
        for result in results:
            self.tell(seat, render_result(result))
        if message:
            other = SEATS[1 - SEATS.index(seat)]
            self.say(seat, message, to=[other])
            self.research.inbox.setdefault(other, []).append(message)
            self.research.messages += 1
        if "answer" in fields:
            self.research.answers[seat] = fields["answer"].strip()
        return None

    def resolve(self) -> None:
        # Messages of the step before were read by now; this step's stay for the next view.
        self.research.delivered, self.research.inbox = self.research.inbox, {}
        if not self.acting():
            self._grade()

    def _grade(self) -> None:
        reference = self.reference()
        names = sorted((normalize(n) for n in self.research.world.entities), key=len, reverse=True)
        for seat in SEATS:
            answer = self.research.answers[seat]
            self.research.scores[seat] = (
                grade(answer, reference, names) if answer is not None else 0.0
            )
        team = sum(self.research.scores.values()) / len(SEATS)
        for seat in SEATS:
            self.reward(seat, "task", self.research.scores[seat])
            self.reward(seat, "team", self.team_weight * team)
        self.announce(f"The answer was {reference!r}; answers: {self.research.answers}.")
        self.finish()

    # -- what seats see -------------------------------------------------------------------

    def _shard(self, seat: str) -> str:
        return {"biographer": "people", "geographer": "places, organisations and events"}[seat]

    def prompt(self, seat: str) -> str:
        return (
            f"Your move ({self.research.turns_left[seat]} turns left): a JSON object with "
            "tool_calls, message and/or answer."
        )

    def constraint(self, seat: str) -> dict[str, Any] | None:
        return dict(self._constraint)

    def view(self, seat: str) -> dict[str, Any]:
        s = self.research
        return {
            "question": self.question,
            "template": s.template,
            "subject": s.subject,
            "chain": list(TEMPLATES[s.template][2]),
            "shard": self._shard(seat),
            "turns_left": s.turns_left[seat],
            "tools": self._tools[seat].specs(),
            "tool_results": s.last_results.get(seat, []),
            "messages": list(s.delivered.get(seat, [])),
        }

    def oracle(self, seat: str) -> dict[str, Any]:
        return {"answer": self.reference()}

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """Redraw the facts of the other half that ``keep``'s half never names: birth years
        and birthplaces (hidden from the geographer), founding years, headquarters, event
        years and venues (hidden from the biographer). Names and the question stay."""
        world = self.research.world
        places = [e.name for e in world.of_kind("place")]
        redraw = {
            "geographer": {"born": None, "birthplace": places},
            "biographer": {"founded": None, "headquarters": places, "year": None,
                           "venue": places},
        }[keep]  # fmt: skip
        for entity in world.entities.values():
            if entity.kind in SHARDS[keep]:
                continue
            for relation, options in redraw.items():
                if relation in entity.facts:
                    old = entity.facts[relation]
                    entity.facts[relation] = (
                        str(int(old) + int(rng.integers(1, 40)))
                        if options is None
                        else options[int(rng.integers(len(options)))]
                    )
        return True

    def system_prompt(self, seat: str) -> str:
        return (
            f"You are the {seat} of a research team of two. You can search only the "
            f"{self._shard(seat)} of an encyclopedia; your teammate searches the rest. "
            "Answer the question together: "
            "each turn reply with one JSON object with any of "
            '"tool_calls" (e.g. [{"name": "search", "arguments": {"query": "..."}}], results '
            'arrive next turn), "message" (to your teammate, at most 300 characters) and '
            '"answer" (your final answer: the name or number only; you then stop).\n'
            f"Tools:\n{self._describe}"
        )

    def metrics(self) -> dict[str, float]:
        if not self.research.scores:
            return {}
        reference = self.reference()
        exact = [
            float(normalize(a or "") == normalize(reference))
            for a in self.research.answers.values()
        ]
        return {
            "success": float(all(exact)),
            "exact": sum(exact) / len(exact),
            "f1": sum(self.research.scores.values()) / len(SEATS),
            "tool_calls": float(self.research.tool_calls),
            "messages": float(self.research.messages),
        }

    def _close_indexes(self) -> None:
        # The previous episode's in-memory databases, closed at once; the last episode's go
        # with the instance (an in-memory SQLite connection holds no outside resource, and
        # Scenario.close is final: a scenario holds none).
        for index in self._indexes.values():
            index.close()
        self._indexes.clear()


# Deprecated: the name before the <Game>V<n> convention, for imports written against it.
ResearchTeam = ResearchTeamV0
