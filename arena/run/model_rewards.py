"""Model-based reward components: what the LLM judge and the reward model share.

A model-based component reads a finished episode, asks a model for a number per seat (scope
``seat``: each seat's own text) or one for the episode (scope ``episode``: every seat gets
it), and credits it at the episode's last step under its name (:func:`credit`), so shaping,
trainers, exports and the viewer see it as any other component. Two kinds subclass
:class:`ModelComponent`:

- ``judge`` (:class:`~parley.arena.run.judge.Judge`): a policy the pool serves gives a
  constrained verdict on the quoted messages;
- ``rm`` (:class:`ScoredReward`): a reward model (a sequence classifier) scores the text a
  rater is shown (:func:`shown_items`), through the pool's score request.

Both hold the same guarantees, from the same code:

- **Canonical text** (:func:`canonical`): invisible characters (zero-width, bidi marks,
  controls) are dropped and compatibility forms folded (NFKC), whitespace runs are one space
  and a word sequence repeated back to back is kept once, so padding a message with
  whitespace, invisible characters or repeats gives the very same input, hence the very
  same reward (and a cache hit). A reward model reads more: :func:`scored_text` also keeps
  each word of a message once and at most :data:`MAX_SCORED_WORDS` words of it, so filler
  of the message's own words, in any order, cannot change its score either (the judge has
  its length rule instead). New words are new content: no form can hide them without hiding
  content, so past the cap they are not read, and below it the trained hinge
  (``parley train-rm --padding-penalty``) is the guard.
- **Cache**: one outcome per (kind's key, text digest); the same text is never asked twice
  by one runner (least recently used out past ``cache_size``); failures are asked again.
- **Failures**: a model that fails, times out or answers outside its contract adds no
  component to that seat (never a silent 0); the transcript's entry under the component's
  name records ``{"failed": reason}`` for it, the metric ``NAME_failed`` counts them.
- **Quoting**: the judged or scored text is content, never control: the judge quotes it in
  token ids apart from its instructions; a reward model tokenizes it with every spelling of
  a special token split into ordinary tokens (the scorer backend's ``score_texts``).

May import what :mod:`parley.arena.run` may; the reward model's client is resolved by the
dotted name :data:`SCORE_CLIENT` (the inference package), so the runner does not depend on it.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import math
import re
import unicodedata
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from pathlib import PurePath
from typing import Any

from parley.arena.run.agent_specs import load_object
from parley.arena.run.records import EpisodeRecord
from parley.protocols.errors import ConfigError

__all__ = [
    "SCOPES",
    "Outcome",
    "ModelComponent",
    "ScoredReward",
    "Score",
    "canonical",
    "reply_bound",
    "reward_model_name",
    "scored_text",
    "scored_reward_from_spec",
    "shown_items",
    "shown_text",
]

SCOPES: tuple[str, ...] = ("seat", "episode")
"""``seat``: one number per seat on its own text; ``episode``: one for every seat."""

_MAX_PERIOD = 32  # longest repeated word sequence collapsed (bounds the canonical pass)

SCORE_CLIENT = "parley.arena.inference.backends.scorer:score_client"
"""``score_client(model_dir, agent_options, timeout) -> Score``: how a run reaches its reward
model (the pool at ``agent_options["pool"]``, or one loaded in this process)."""

Score = Callable[[list[str]], Awaitable[list[float]]]
"""Scores texts, list in, list out, same order (a batcher's or a pool's ``score``)."""


def reply_bound(timeout: float) -> float:
    """How long to wait for a model's answer to a request carrying ``timeout``: the pool's
    own timeout error answers first; this bounds a pool that never answers."""
    return timeout + min(timeout, 5.0)


# Characters that show nothing: controls that are not whitespace, and Unicode's
# Default_Ignorable_Code_Point set (zero-width space and joiners, soft hyphen, bidi marks,
# variation selectors, Hangul fillers, tags), plus the blank braille pattern. Left in, they
# made each copy of a word a new word ("good good\u200b good\u2060..."), so padding escaped
# the repeat rule and a reward model's one-copy-per-word rule.
_INVISIBLE = re.compile(
    "[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5"
    "\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f\u2800\u3164\ufe00-\ufe0f"
    "\ufeff\uffa0\ufff0-\ufffb\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff]"
)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _visible(text: str) -> str:
    """``text`` as it reads: invisible characters dropped, NFKC (fullwidth and other
    compatibility forms as their plain letters), a lone surrogate as ``\\udXXX`` (a
    tokenizer cannot encode one: it failed the judge's prompt and the reward model's call)."""
    if text.isascii():
        return _INVISIBLE.sub("", text) if not text.isprintable() else text
    text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return unicodedata.normalize("NFKC", _INVISIBLE.sub("", text))


def canonical(text: str) -> str:
    """``text`` with invisible characters dropped and compatibility forms folded (NFKC),
    whitespace runs as one space and back-to-back repeats of a word sequence (up to
    :data:`_MAX_PERIOD` words) kept once: the judged and scored form. (Look-alike letters
    of other scripts, a Cyrillic o for a Latin one, are other words: not folded.)"""
    out: list[str] = []
    for word in _visible(text).split():
        out.append(word)
        for period in range(1, min(len(out) // 2, _MAX_PERIOD) + 1):
            if out[-period:] == out[-2 * period : -period]:
                del out[-period:]
                break
    return " ".join(out)


MAX_SCORED_WORDS = 256
"""Words of one line a reward model reads at most (the rest never reaches it)."""


def scored_text(text: str) -> str:
    """What a reward model reads of ``text``: each line in :func:`canonical` form with every
    word kept at its first occurrence in the line only, and at most
    :data:`MAX_SCORED_WORDS` words (empty lines left out). Padding a line with whitespace,
    repeats or filler of its own words, in any order and amount, gives the very same text;
    new words past the cap too."""
    lines = []
    for line in text.splitlines():
        seen: dict[str, None] = {}
        for word in canonical(line).split():
            seen.setdefault(word)
            if len(seen) == MAX_SCORED_WORDS:
                break
        if seen:
            lines.append(" ".join(seen))
    return "\n".join(lines)


def shown_items(transcript: Mapping[str, Any], seat: str | None) -> list[dict[str, str]]:
    """What a rater is shown of one transcript (``parley view --rate``), as ``{"who",
    "text"}`` items in order: with a seat, each observation it got (``who`` =
    ``"scenario"``) and each move it made; without, every seat's moves. Fields that are not
    what a transcript holds are left out."""
    items: list[dict[str, str]] = []
    steps = transcript.get("steps")
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict):
            continue
        obs, acts = step.get("observations"), step.get("actions")
        obs = obs if isinstance(obs, dict) else {}
        acts = acts if isinstance(acts, dict) else {}
        if seat is not None:
            if isinstance(obs.get(seat), str):
                items.append({"who": "scenario", "text": obs[seat]})
            if isinstance(acts.get(seat), str):
                items.append({"who": seat, "text": acts[seat]})
            continue
        for who, text in acts.items():
            if isinstance(text, str):
                items.append({"who": str(who), "text": text})
    return items


def shown_text(items: Sequence[Mapping[str, str]]) -> str:
    """The items as one text, a line (or more) per item: ``who: text\\n``."""
    return "".join(f"{item['who']}: {item['text']}\n" for item in items)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One model's number: ``score`` is ``None`` when the model failed (``reason`` says
    why); ``verdict`` is the judge's answer ("" for a reward model)."""

    score: float | None
    verdict: str = ""
    reason: str = ""

    def as_json(self) -> dict[str, Any]:
        """The transcript's entry of one seat."""
        if self.score is None:
            return {"failed": self.reason}
        return {"score": self.score, **({"verdict": self.verdict} if self.verdict else {})}


def credit(record: EpisodeRecord, name: str, outcomes: Mapping[str, Outcome]) -> None:
    """Credit each seat's outcome as the component ``name`` (see the module doc) and record
    every outcome (``transcript[name]``, metrics ``name`` and ``name_failed``)."""
    scores = {seat: o.score for seat, o in outcomes.items() if o.score is not None}
    record.credit(name, scores)
    record.transcript[name] = {seat: o.as_json() for seat, o in outcomes.items()}
    if scores:
        record.metrics[name] = sum(scores.values()) / len(scores)
    record.metrics[f"{name}_failed"] = 1.0 - len(scores) / len(outcomes)


class ModelComponent:
    """A model-based reward component (see the module docstring). Subclasses give the
    input of a seat (:meth:`unit`), its cache key and prepared request (:meth:`prepare`)
    and ask the model (:meth:`compute`); :meth:`apply` and the cache are shared."""

    name = ""
    """The component's name (``judge``, ``rm``)."""

    def __init__(self, *, scope: str = "seat", cache_size: int = 4096) -> None:
        if scope not in SCOPES:
            raise ConfigError(f"{self.name} scope must be one of {list(SCOPES)}, got {scope!r}")
        self.scope = scope
        self._cache: collections.OrderedDict[Hashable, Outcome] = collections.OrderedDict()
        self._cache_size = cache_size
        self.hits = 0
        """Outcomes answered from the cache."""
        self.requests = 0
        """Outcomes asked of the model."""

    def unit(self, transcript: Mapping[str, Any], seat: str | None) -> Any:
        """What the model reads of ``seat`` (``None``: of the whole episode)."""
        raise NotImplementedError

    def prepare(self, unit: Any) -> tuple[Hashable, Any]:
        """``(cache key, request)`` of a unit."""
        raise NotImplementedError

    async def compute(self, request: Any) -> Outcome:
        """Ask the model; failures are an :class:`Outcome` with a reason, never raised."""
        raise NotImplementedError

    async def outcome(self, unit: Any) -> Outcome:
        """The outcome of ``unit``: from the cache or the model."""
        key, request = self.prepare(unit)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return cached
        outcome = await self.compute(request)
        if outcome.score is not None:  # failures are asked again next time
            self._cache[key] = outcome
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return outcome

    async def apply(self, record: EpisodeRecord) -> None:
        """Read a finished episode and credit each seat's outcome as the component
        :attr:`name` (see the module docstring); a failed episode is left as it is."""
        if record.failed or not record.transcript.get("steps"):
            return
        seats = [t.agent for t in record.trajectories]
        if self.scope == "episode":
            outcome = await self.outcome(self.unit(record.transcript, None))
            outcomes = dict.fromkeys(seats, outcome)
        else:
            units = [self.unit(record.transcript, seat) for seat in seats]
            found = await asyncio.gather(*(self.outcome(unit) for unit in units))
            outcomes = dict(zip(seats, found, strict=True))
        credit(record, self.name, outcomes)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class ScoredReward(ModelComponent):
    """The ``rm`` component: a reward model's score of each seat's text (scope ``seat``:
    what ``parley view --rate --seat SEAT`` shows a rater, so a model trained on those
    ratings scores what it was trained on; ``episode``: every seat's moves) as
    :func:`scored_text`, times ``weight``.

    ``score`` scores texts (the pool's score request, a batcher's ``score``); ``model``
    names the reward model in the cache key; ``timeout`` bounds one call (seconds)."""

    name = "rm"

    def __init__(
        self,
        score: Score,
        *,
        model: str = "rm",
        weight: float = 1.0,
        scope: str = "seat",
        timeout: float = 60.0,
        cache_size: int = 4096,
    ) -> None:
        super().__init__(scope=scope, cache_size=cache_size)
        if not math.isfinite(weight):
            raise ConfigError(f"the rm component's weight must be a finite number, got {weight}")
        if not timeout > 0:
            raise ConfigError(f"the rm component's timeout must be positive, got {timeout}")
        self.score, self.model, self.weight, self.timeout = score, model, weight, timeout

    def unit(self, transcript: Mapping[str, Any], seat: str | None) -> str:
        """The :func:`scored_text` of ``seat`` (``None``: of the episode), each message on
        one line (so that a message's own words are its line's)."""
        items = shown_items(transcript, seat)
        return scored_text(shown_text([{**i, "text": canonical(i["text"])} for i in items]))

    def prepare(self, unit: str) -> tuple[Hashable, str]:
        return (self.model, self.weight, _digest(unit)), unit

    async def compute(self, request: str) -> Outcome:
        self.requests += 1
        try:
            (score,) = await asyncio.wait_for(self.score([request]), reply_bound(self.timeout))
        except Exception as exc:  # the episode stands; the component is absent, with why
            kind = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
            return Outcome(None, reason=f"rm_failed: {kind}: {exc}".rstrip(": "))
        if not math.isfinite(score):
            return Outcome(None, reason=f"rm_failed: score {score!r} is not finite")
        return Outcome(self.weight * float(score))


def reward_model_name(path: str) -> str:
    """The name a reward model directory is served under (``parley serve --reward-model
    DIR`` and a run's ``reward_model: DIR`` agree on it): the directory's name."""
    return PurePath(path.rstrip("/")).name or path


def scored_reward_from_spec(
    path: str,
    options: Mapping[str, Any],
    *,
    weight: float = 1.0,
    scope: str = "seat",
    timeout: float = 60.0,
) -> ScoredReward:
    """The ``rm`` component of a run: the reward model directory ``path`` scored through
    the pool at ``options["pool"]`` (``RunConfig.agent_options``; a bus address whose pool
    serves it under :func:`reward_model_name`, or a pool object) or, without one, loaded
    in this process on first use and shared by the run's episodes (one batch for the calls
    that arrive together)."""
    client: Callable[..., Score] = load_object(SCORE_CLIENT)
    score = client(path, options, timeout)
    return ScoredReward(
        score, model=reward_model_name(path), weight=weight, scope=scope, timeout=timeout
    )
