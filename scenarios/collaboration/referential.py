"""collaboration/referential-v0 - a speaker names the target, a listener picks it.

The referential game of Lazaridou et al. 2017 (arXiv 1612.07182), kept small for tiny LMs
trained by RL: short prompts, a one-token choice for the listener, a short letter string
for the speaker. Objects are tuples of ``n_attributes`` attributes with ``n_values`` values
each (``n_values ** n_attributes`` objects; 16 by default). ``n_candidates`` distinct objects
are drawn, one is the target. The speaker sees the target and the others and sends a message
of exactly ``message_length`` letters from the first ``vocab_size`` letters of the alphabet.
The listener sees the message and the candidates shuffled, and picks one: by its number
(``answer="number"``, the default) or by its description (``answer="name"``). Both get
reward 1 if the pick is the target, else 0: chance is ``1 / n_candidates``.

Why ``answer="name"``: with numbers the listener's job is a two-step lookup (map the
message to an object, then find that object's line number), a circuit a random tiny model
must discover from one bit of reward. Answering by name makes it a direct mapping
(message -> name), still restricted to the ``K`` candidates shown, so chance is unchanged
(``examples/referential.md`` has the measured difference).

Seats: ``speaker`` (acts on step 1), ``listener`` (acts on step 2).

Actions:

===========  =================================================================
speaker      ``ab`` - ``message_length`` letters from the vocabulary (constraint:
             "choice" over all messages when there are at most 256, else "regex")
listener     ``answer="number"``: ``1`` ... ``K`` - the candidate's number;
             ``answer="name"``: the candidate's description, e.g. ``red circle``
             (constraint: "choice" over the ``K`` shown candidates either way)
===========  =================================================================

An invalid message reaches the listener as ``-``; an invalid pick counts as wrong.

Observations (speaker): ``Target: red circle`` / ``Others: blue square`` (unless
``show_others=False``) / the message format. (listener, ``answer="number"``):
``Message: ab`` / ``1 blue square`` / ``2 red circle`` / ``Pick 1-2:``; (listener,
``answer="name"``): ``Message: ab`` / ``Candidates: blue square, red circle`` /
``Pick one:``.
``infos[seat]["view"]`` holds value indices: ``target`` and ``others`` (speaker),
``candidates`` in shown order and ``message`` (listener), plus ``vocab``, ``message_length``,
``n_values`` and ``answer``.

Rewards (on the last step):

==========  ====================================================================
component   value
==========  ====================================================================
task        1 to both if the listener picks the target, else 0
invalid     -``invalid_penalty`` per invalid move (default 0.0)
==========  ====================================================================

Metrics: ``success`` (the pick was right), ``chance`` (``1 / n_candidates``).

Arguments: ``n_candidates`` (2), ``n_attributes`` (2, at most 4), ``n_values`` (4, at
most 8), ``vocab_size`` (8, at most 26), ``message_length`` (2), ``answer``
(``"number"`` or ``"name"``: how the listener names its pick; default ``"number"``),
``show_others`` (True: the speaker also sees the distractors; False: the target alone,
Lewis's signalling game - a fixed code needs only the target, and the shorter prompt is
what lets a tiny model learn it fast), ``invalid_penalty``, ``max_cycles``,
``render_mode``.

    >>> env = make("collaboration/referential-v0", n_candidates=4)

Version history: v0 - first version.
v1 — a move the action space refuses (characters outside the charset, too long) uses
up the seat's turn (:mod:`parley.scenarios.refusals`), so every episode ends within the
scenario's limits; v0 is kept as it was.
"""

from __future__ import annotations

import dataclasses
import itertools
import string
from typing import Any, ClassVar

import numpy as np

from parley.protocols.errors import ConfigError
from parley.scenarios.base import Scenario
from parley.scenarios.declaring import text_metadata
from parley.scenarios.refusals import RefusedMoveTakesTurn
from parley.scenarios.registry import registered

# The versions; the rules' helpers (for scripted agents and tests) are imported by path.
__all__ = ["ReferentialV0", "ReferentialV1"]

ATTRIBUTES: tuple[tuple[str, ...], ...] = (
    ("red", "blue", "green", "yellow", "purple", "orange", "black", "white"),
    ("circle", "square", "triangle", "star", "heart", "cross", "ring", "arrow"),
    ("small", "big", "tiny", "huge", "flat", "tall", "thin", "wide"),
    ("plain", "striped", "dotted", "checked", "wavy", "spotted", "dashed", "grid"),
)
"""Attribute value names; an object is one value index per attribute."""
SEATS = ("speaker", "listener")
ANSWERS = ("number", "name")
MAX_CHOICES = 256

Obj = tuple[int, ...]


def describe(obj: Obj) -> str:
    """``(0, 1)`` -> ``"red square"``; size and pattern come first, the shape last."""
    order = [i for i in (2, 3, 0, 1) if i < len(obj)]
    return " ".join(ATTRIBUTES[i][obj[i]] for i in order)


def messages(vocab: str, length: int) -> list[str]:
    """Every message of ``length`` letters over ``vocab``."""
    return ["".join(letters) for letters in itertools.product(vocab, repeat=length)]


@dataclasses.dataclass
class RefState:
    candidates: list[Obj]  # as the listener sees them
    target: int  # index into candidates
    message: str = ""
    pick: int | None = None
    phase: str = "speak"  # speak -> listen -> done


_SCRIPTED = "parley.agents.scripted.collaboration"
_BASELINES = {"speaker": f"{_SCRIPTED}:CodeSpeaker", "listener": f"{_SCRIPTED}:CodeListener"}
_ABOUT = (
    "Lazaridou et al. 2017: a speaker names the target among K candidates "
    "with a short code; the listener picks it. Shared reward; chance 1/K."
)


@registered(baselines=_BASELINES, description=_ABOUT)
class ReferentialV0(Scenario):
    """Lazaridou et al.'s referential game; see the module docstring."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("collaboration/referential-v0")
    ref: RefState

    def snapshot(self) -> Any:
        return self.ref

    def __init__(
        self,
        n_candidates: int = 2,
        n_attributes: int = 2,
        n_values: int = 4,
        vocab_size: int = 8,
        message_length: int = 2,
        answer: str = "number",
        show_others: bool = True,
        *,
        invalid_penalty: float | None = None,
        max_cycles: int | None = None,
        render_mode: str | None = "ansi",
    ) -> None:
        super().__init__(
            SEATS, render_mode=render_mode, max_cycles=max_cycles, invalid_penalty=invalid_penalty
        )
        if not 1 <= n_attributes <= len(ATTRIBUTES) or not 2 <= n_values <= len(ATTRIBUTES[0]):
            raise ConfigError("need 1 <= n_attributes <= 4 and 2 <= n_values <= 8")
        if not 2 <= n_candidates <= n_values**n_attributes:
            raise ConfigError(f"n_candidates must be 2..{n_values**n_attributes}")
        if not 2 <= vocab_size <= 26 or not 1 <= message_length <= 16:
            raise ConfigError("need 2 <= vocab_size <= 26 and 1 <= message_length <= 16")
        if answer not in ANSWERS:
            raise ConfigError(f"answer must be one of {ANSWERS}, not {answer!r}")
        self.answer, self.show_others = answer, bool(show_others)
        self.k, self.n_attributes, self.n_values = n_candidates, n_attributes, n_values
        self.vocab = string.ascii_lowercase[:vocab_size]
        self.message_length = message_length
        self.objects: list[Obj] = list(itertools.product(range(n_values), repeat=n_attributes))

    def new_episode(self, rng: np.random.Generator) -> None:
        picked = rng.choice(len(self.objects), size=self.k, replace=False)
        candidates = [self.objects[int(i)] for i in picked]
        self.ref = RefState(candidates=candidates, target=int(rng.integers(self.k)))

    def brief(self) -> None:
        candidates = self.ref.candidates
        others = [describe(c) for i, c in enumerate(candidates) if i != self.ref.target]
        self.tell("speaker", f"Target: {describe(candidates[self.ref.target])}")
        if self.show_others:
            self.tell("speaker", f"Others: {', '.join(others)}")

    def acting(self) -> list[str]:
        return {"speak": ["speaker"], "listen": ["listener"]}.get(self.ref.phase, [])

    def play(self, seat: str, action: str) -> str | None:
        text = action.strip()
        if seat == "speaker":
            valid = len(text) == self.message_length and all(ch in self.vocab for ch in text)
            self.ref.message, self.ref.phase = (text if valid else "-"), "listen"
            self.tell("listener", f"Message: {self.ref.message}")
            if self.answer == "name":
                names = ", ".join(describe(obj) for obj in self.ref.candidates)
                self.tell("listener", f"Candidates: {names}")
            else:
                for number, obj in enumerate(self.ref.candidates, start=1):
                    self.tell("listener", f"{number} {describe(obj)}")
            if valid:
                return None
            return f"the message must be {self.message_length} letters from '{self.vocab}'"
        pick = self._parse_pick(text)
        self.ref.pick, self.ref.phase = pick, "done"
        success = float(pick == self.ref.target)
        for member in SEATS:
            self.reward(member, "task", success)
        self.finish()
        if pick is not None:
            return None
        if self.answer == "name":
            return "answer with one of the candidates' descriptions"
        return f"answer with one number from 1 to {self.k}"

    def _parse_pick(self, text: str) -> int | None:
        """The picked candidate's index, or None when ``text`` names none."""
        if self.answer == "name":
            names = [describe(obj) for obj in self.ref.candidates]
            return names.index(text) if text in names else None
        return int(text) - 1 if text.isdigit() and 1 <= int(text) <= self.k else None

    def prompt(self, seat: str) -> str:
        if seat == "speaker":
            return f"Message ({self.message_length} letters from {self.vocab}):"
        return "Pick one:" if self.answer == "name" else f"Pick 1-{self.k}:"

    def constraint(self, seat: str) -> dict[str, Any] | None:
        if seat == "listener":
            if self.answer == "name":
                return {"type": "choice", "choices": [describe(c) for c in self.ref.candidates]}
            return {"type": "choice", "choices": [str(i) for i in range(1, self.k + 1)]}
        if len(self.vocab) ** self.message_length <= MAX_CHOICES:
            return {"type": "choice", "choices": messages(self.vocab, self.message_length)}
        return {"type": "regex", "pattern": f"[{self.vocab}]{{{self.message_length}}}"}

    def view(self, seat: str) -> dict[str, Any]:
        common = {"vocab": self.vocab, "message_length": self.message_length}
        common["n_values"], common["answer"] = self.n_values, self.answer
        if seat == "speaker":
            target = self.ref.candidates[self.ref.target]
            others = [list(c) for i, c in enumerate(self.ref.candidates) if i != self.ref.target]
            return {**common, "target": list(target), "others": others}
        if self.ref.phase == "speak":
            return common
        candidates = [list(c) for c in self.ref.candidates]
        return {**common, "candidates": candidates, "message": self.ref.message}

    def redraw_private(self, keep: str, rng: np.random.Generator) -> bool:
        """For the listener, which candidate is the target; for the speaker, where the target
        stands in the listener's list (the others keep their order, which the speaker sees)."""
        if self.ref.phase != "speak":
            return False
        if keep == "listener":
            self.ref.target = (self.ref.target + 1 + int(rng.integers(self.k - 1))) % self.k
            return True
        target = self.ref.candidates.pop(self.ref.target)
        self.ref.target = int(rng.integers(self.k))
        self.ref.candidates.insert(self.ref.target, target)
        return True

    def system_prompt(self, seat: str) -> str:
        if seat == "speaker":
            return (
                "You see a target object. Send a short code so your partner can pick the "
                "target among the candidates."
            )
        return "You get a code from your partner. Pick the object it refers to."

    def metrics(self) -> dict[str, float]:
        if self.ref.phase != "done":
            return {}
        return {"success": float(self.ref.pick == self.ref.target), "chance": 1.0 / self.k}


@registered(baselines=_BASELINES, description=_ABOUT + " v1: a refused move uses up the turn.")
class ReferentialV1(RefusedMoveTakesTurn, ReferentialV0):
    """v1: a move the action space refuses uses up the turn (:mod:`parley.scenarios.refusals`)."""

    metadata: ClassVar[dict[str, Any]] = text_metadata("collaboration/referential-v1")


# Deprecated: the name before the <Game>V<n> convention, for imports written against it.
Referential = ReferentialV0
