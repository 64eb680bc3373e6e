"""What a run writes: one record per episode, encoded as deterministic JSON lines.

Files (in ``RunConfig.out``; the schema is documented in ``arena/run/SCHEMA.md``):

- ``transcripts.jsonl`` — one line per episode, in plan order (task, then trial), whatever
  order the concurrent episodes finished in; keys sorted; no wall-clock values, so the same
  run seed and agents give byte-identical files.
- ``trajectories.jsonl`` — one :class:`~parley.protocols.messages.Trajectory` per seat per
  episode, same order.
- ``timings.jsonl`` — wall-clock durations per episode (kept apart because they vary).
- ``summary.json`` — aggregate metrics (see :mod:`parley.arena.run.summary`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import msgspec
import numpy as np

from parley.protocols.messages import Trajectory

__all__ = ["EpisodeRecord", "RecordWriter", "encode_json"]


def _enc_hook(obj: Any) -> Any:
    # Scenarios may put numpy scalars or arrays in infos; JSON gets the Python values.
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    # A transcript is a log: a value it cannot hold is named, not allowed to end the run
    # (no repr: it may carry a memory address and break byte-identical transcripts).
    return f"<unserializable {type(obj).__name__}>"


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook, order="sorted")


def _json_safe(value: Any) -> Any:
    """``value`` with non-finite floats replaced by ``None`` (JSON has no NaN/inf)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def encode_json(value: Any) -> bytes:
    """Deterministic JSON: sorted keys, no whitespace, NaN/inf written as ``null``."""
    return _encoder.encode(_json_safe(value) if not isinstance(value, msgspec.Struct) else value)


@dataclass
class EpisodeRecord:
    """The outcome of one episode, as the runner hands it to writers and the summary."""

    index: int
    """Position in the run's plan (task-major, then trial)."""
    episode: str
    """Episode id (also the bus ``Envelope.episode``)."""
    task: int
    """Task number: episodes of one task share the scenario seed."""
    trial: int
    """Trial number within the task (0..trials-1)."""
    seed: int
    """Seed the scenario was reset with."""
    transcript: dict[str, Any]
    """The ``transcripts.jsonl`` line of this episode."""
    trajectories: list[Trajectory] = field(default_factory=list)
    """One per seat."""
    metrics: dict[str, float] = field(default_factory=dict)
    """``env.episode_metrics()``; empty for failed episodes."""
    failed: str = ""
    """Why the episode failed ("" if it finished)."""
    agent_steps: int = 0
    """Actions requested from agents."""
    invalid_moves: int = 0
    """Actions the scenario marked invalid (``infos[agent]["invalid"]``)."""
    wall_s: float = 0.0
    """Wall-clock seconds the episode took (written only to ``timings.jsonl``)."""
    agents_s: float = 0.0
    """Wall-clock seconds spent waiting for agents' actions (the rest is the scenario and
    the runner's own bookkeeping); ``timings.jsonl`` only."""

    def credit(self, component: str, values: Mapping[str, float]) -> None:
        """Add ``values[seat]`` as reward ``component`` at the episode's last step, as a
        scenario's final reward is: the step's ``rewards`` and ``infos[seat]["components"]``,
        the seat's trajectory reward, components and last turn, and the ``returns``. For
        rewards computed after play (a judge, a reward model); seats not in ``values`` get
        nothing. Needs the transcript's steps (a run that keeps them)."""
        transcript = self.transcript
        last = transcript["steps"][-1]
        rewards = dict(last.get("rewards") or {})
        infos = dict(last.get("infos") or {})
        for trajectory in self.trajectories:
            seat = trajectory.agent
            if seat not in values:
                continue
            value = float(values[seat])
            rewards[seat] = float(rewards.get(seat, 0.0)) + value
            info = dict(infos.get(seat) or {})
            components = dict(info.get("components") or {})
            components[component] = components.get(component, 0.0) + value
            infos[seat] = {**info, "components": components}
            trajectory.components[component] = trajectory.components.get(component, 0.0) + value
            trajectory.reward += value
            if trajectory.turns:
                trajectory.turns[-1].reward += value
        last["rewards"], last["infos"] = rewards, infos
        transcript["returns"] = {t.agent: t.reward for t in self.trajectories}


def _lines(record: EpisodeRecord) -> tuple[bytes, bytes, bytes]:
    """The transcript line, trajectory lines and timing line of ``record``."""
    timing = {
        "episode": record.episode,
        "wall_s": round(record.wall_s, 6),
        "agents_s": round(record.agents_s, 6),
    }
    return (
        encode_json(record.transcript) + b"\n",
        b"".join(encode_json(trajectory) + b"\n" for trajectory in record.trajectories),
        encode_json(timing) + b"\n",
    )


class RecordWriter:
    """Appends episode records to the JSONL files in plan order.

    Concurrent episodes finish out of order; a record's encoded lines (not the record)
    wait in a buffer until every earlier index has been written, so the files do not
    depend on scheduling. Without ``out`` nothing is encoded or kept.
    """

    def __init__(self, out: str | Path | None) -> None:
        self._next = 0
        self._waiting: dict[int, tuple[bytes, bytes, bytes]] = {}
        self._files: dict[str, IO[bytes]] = {}
        self.out = Path(out) if out is not None else None
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            for name in ("transcripts", "trajectories", "timings"):
                self._files[name] = (self.out / f"{name}.jsonl").open("wb")

    def add(self, record: EpisodeRecord) -> None:
        """Accept ``record``; writes it (and any it unblocks) once its turn comes."""
        if not self._files:
            return
        self._waiting[record.index] = _lines(record)
        while self._next in self._waiting:
            self._write(self._waiting.pop(self._next))
            self._next += 1

    def _write(self, encoded: tuple[bytes, bytes, bytes]) -> None:
        transcript, trajectories, timing = encoded
        self._files["transcripts"].write(transcript)
        self._files["trajectories"].write(trajectories)
        self._files["timings"].write(timing)

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json`` (indented for people; keys sorted)."""
        if self.out is not None:
            data = msgspec.json.format(encode_json(summary), indent=2)
            (self.out / "summary.json").write_bytes(data + b"\n")

    def close(self) -> None:
        """Flush and close the files; records still waiting for a gap are written as-is."""
        for index in sorted(self._waiting):
            self._write(self._waiting.pop(index))
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
