"""From finished episodes to trainer samples: :func:`samples_from_record` (one
:class:`~parley.arena.training.pg.Sample` per decision, returns-to-go, per-step shaping) and
:class:`ConstraintLog` (the constraint each generation was decoded under, so the trainer can
rebuild the legal-token masks). Re-exported by :mod:`parley.arena.training.sampler`."""

from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from parley.arena.run.records import EpisodeRecord
from parley.arena.training.advantages import SampleKey
from parley.arena.training.pg import Sample
from parley.protocols.messages import Constraint, GenerateRequest, GenerateResult, TokenRecord

__all__ = ["FORGOTTEN", "ConstraintLog", "RecordingClient", "samples_from_record"]

FORGOTTEN = "forgotten"
"""A :class:`ConstraintLog` entry whose constraint is unknown (another log dropped it)."""


class ConstraintLog:
    """Remembers the constraint of each generate request, keyed by (policy, prompt ids).

    The trainer needs it to rebuild the legal-token masks the backend decoded under;
    trajectories carry the tokens but not the constraint. The same prompt always comes
    with the same constraint (the scenario derives both from one observation), and many
    episodes share prompts, so entries are kept (not consumed); the oldest are dropped
    beyond ``capacity``. A prompt is keyed by a 128-bit digest of its ids (~100 bytes an
    entry, not the ids themselves: 100,000 prompts of 512 tokens had held ~2 GB).

    A decision whose entry was dropped cannot be scored right (its recorded logprobs are
    the masked ones): :func:`samples_from_record` leaves it out and counts it in
    :attr:`lost` (a miss with nothing ever dropped means the request did not go through
    this log's client: unconstrained, as before).
    """

    def __init__(self, capacity: int = 1_000_000) -> None:
        self.capacity = capacity
        self.evicted = 0
        """Entries dropped to stay within ``capacity``."""
        self.lost = 0
        """Decisions left out of training because their entry had been dropped."""
        # a prompt's constraint, None (unconstrained), or FORGOTTEN
        self._by_prompt: OrderedDict[tuple[str, bytes], Constraint | str | None] = OrderedDict()

    @staticmethod
    def _key(policy: str, prompt_ids: Sequence[int]) -> tuple[str, bytes]:
        ids = np.asarray(prompt_ids, dtype=np.int64).tobytes()
        return policy, hashlib.blake2b(ids, digest_size=16).digest()

    def note(self, request: GenerateRequest) -> None:
        key = self._key(request.policy, request.prompt_token_ids)
        self._by_prompt[key] = request.constraint
        self._by_prompt.move_to_end(key)
        while len(self._by_prompt) > self.capacity:
            self._by_prompt.popitem(last=False)
            self.evicted += 1

    def verdict(self, policy: str, prompt_ids: Sequence[int]) -> Constraint | str | None:
        """This prompt's constraint, ``None`` (unconstrained), or :data:`FORGOTTEN` (noted as
        forgotten, or absent after entries were dropped here)."""
        key = self._key(policy, prompt_ids)
        if key not in self._by_prompt:
            return FORGOTTEN if self.evicted else None
        return self._by_prompt[key]

    def get(self, policy: str, prompt_ids: Sequence[int]) -> Constraint | None:
        value = self.verdict(policy, prompt_ids)
        return value if isinstance(value, Constraint) else None

    def forget(self, policy: str, prompt_ids: Sequence[int]) -> None:
        """Note that this prompt's constraint is unknown (another log, a Ray worker's,
        dropped it): its decisions are left out like those of an entry dropped here."""
        key = self._key(policy, prompt_ids)
        self._by_prompt.setdefault(key, FORGOTTEN)
        self._by_prompt.move_to_end(key)

    def forgotten(self, policy: str, prompt_ids: Sequence[int]) -> bool:
        """Whether this prompt's constraint is unknown (:meth:`verdict`)."""
        return self.verdict(policy, prompt_ids) == FORGOTTEN

    def verdicts(self, record: EpisodeRecord) -> list[Constraint | str | None]:
        """What this log knows of each decision of ``record`` (:meth:`verdict`, in
        trajectory, turn, token order), for another log's :meth:`learn`."""
        return [self.verdict(t.policy, t.prompt_token_ids) for t in _decisions(record)]

    def learn(self, record: EpisodeRecord, verdicts: Sequence[Constraint | str | None]) -> None:
        """Note what another log said of each decision of ``record`` (:meth:`verdicts`)."""
        for token, verdict in zip(_decisions(record), verdicts, strict=True):
            if verdict == FORGOTTEN:
                self.forget(token.policy, token.prompt_token_ids)
            else:
                request = GenerateRequest(
                    policy=token.policy,
                    prompt_token_ids=token.prompt_token_ids,
                    constraint=verdict if isinstance(verdict, Constraint) else None,
                )
                self.note(request)

    def __len__(self) -> int:
        return len(self._by_prompt)


def _decisions(record: EpisodeRecord) -> list[TokenRecord]:
    """Every generation of ``record``, in trajectory, turn, token order."""
    return [t for tr in record.trajectories for turn in tr.turns for t in turn.tokens]


class RecordingClient:
    """A pool client that notes each request's constraint in a :class:`ConstraintLog`."""

    def __init__(self, pool: Any, log: ConstraintLog) -> None:
        self.pool = pool
        self.log = log

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.log.note(request)
        result: GenerateResult = await self.pool.generate(request)
        return result


def samples_from_record(
    record: EpisodeRecord,
    *,
    seats: Sequence[str] | None = None,
    log: ConstraintLog | None = None,
    shaping: Mapping[str, Any] | None = None,
) -> list[Sample]:
    """The trainable decisions of one finished episode, one :class:`Sample` per turn.

    ``seats``: only these seats' decisions (default: every seat that has model tokens).
    Each decision's reward is its return-to-go (its turn's reward plus later ones); with
    ``shaping`` (seat or ``"*"`` -> :class:`~parley.scenarios.shaping.ShapingConfig`) the
    same over shaped rewards: each step's ``alpha * team + individual`` over the reward
    components (the transcript's), credited as the scenario's rewards are, to the seat's
    latest decision. The identity shaping thus gives exactly the unshaped rewards.
    """
    if record.failed:
        raise ValueError(f"episode {record.episode} failed ({record.failed}): never train on it")
    shaped = _shaped_turn_rewards(record, shaping) if shaping else None
    out: list[Sample] = []
    for trajectory in record.trajectories:
        if seats is not None and trajectory.agent not in seats:
            continue
        rewards = (
            [t.reward for t in trajectory.turns] if shaped is None else shaped[trajectory.agent]
        )
        to_go = [0.0] * (len(trajectory.turns) + 1)
        for i in range(len(trajectory.turns) - 1, -1, -1):
            to_go[i] = to_go[i + 1] + rewards[i]
        for i, turn in enumerate(trajectory.turns):
            reward = to_go[i]
            for tokens in turn.tokens:
                verdict = log.verdict(tokens.policy, tokens.prompt_token_ids) if log else None
                if verdict == FORGOTTEN:
                    assert log is not None
                    log.lost += 1  # its mask is unknown: scoring it unmasked is wrong
                    continue
                constraint = verdict if isinstance(verdict, Constraint) else None
                out.append(
                    Sample(
                        policy=tokens.policy,
                        prompt_ids=list(tokens.prompt_token_ids),
                        token_ids=list(tokens.token_ids),
                        logprobs=list(tokens.logprobs),
                        policy_version=tokens.policy_version,
                        reward=float(reward),
                        key=SampleKey(
                            role=trajectory.agent,
                            turn=turn.turn,
                            prompt=f"{record.seed}:{trajectory.agent}:{turn.turn}",
                            context=tuple(tokens.prompt_token_ids),
                        ),
                        constraint=constraint,
                    )
                )
    return out


def _shaped_turn_rewards(
    record: EpisodeRecord, shaping: Mapping[str, Any]
) -> dict[str, list[float]]:
    """Per seat, the shaped reward of each of its turns: every step's shaped rewards (from
    its reward components) credited to each seat's latest decision at that step."""
    from parley.scenarios.shaping import ShapingConfig, shape

    steps = record.transcript.get("steps")
    if not steps and any(t.turns for t in record.trajectories):
        raise ValueError(
            f"episode {record.episode}: shaping needs the transcript's steps (their reward "
            "components); play it with steps kept (Runner keep_records or out)"
        )
    fallback = shaping.get("*", ShapingConfig())
    per_seat = {t.agent: shaping.get(t.agent, fallback) for t in record.trajectories}
    turns = {t.agent: [turn.turn for turn in t.turns] for t in record.trajectories}
    out = {seat: [0.0] * len(numbers) for seat, numbers in turns.items()}
    for step in steps or []:
        infos = step.get("infos") or {}
        components = {seat: (infos.get(seat) or {}).get("components") or {} for seat in turns}
        for seat, value in shape(components, per_seat).items():
            # the seat's latest decision at this step (none yet: credited to nothing)
            at = bisect.bisect_right(turns[seat], step.get("turn", 0)) - 1
            if value and at >= 0:
                out[seat][at] += value
    return out
