"""Batched remote frames (``RunConfig.batch_frames``): one ``observations`` message per agent
process and event-loop turn, the same episodes and failures as one ``observation`` each.

The remote side is a real second process (``parley agent`` or ``join_arena``), as in
``test_remote``; each test plays the same seeds both ways and compares.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from parley.arena.run import frames
from parley.protocols.bus import BusConfig
from parley.protocols.codec import Codec
from parley.protocols.messages import (
    Action,
    ActionBatch,
    Envelope,
    Error,
    Observation,
    ObservationBatch,
)
from tests.arena.run.test_remote import KILL_BUS, _join_argv, _remote_run, _steps
from tests.arena.run.test_runner import HERE, TargetAgent


class RaisingAgent(TargetAgent):
    """Raises on its first action where its agent seed is a multiple of 3 (in this run's
    4 episodes: the last two)."""

    async def act(self, observation: Observation) -> Action:
        seed = observation.info["agent_seed"]
        if seed % 3 == 0:
            raise ValueError(f"agent seed {seed} is unlucky")
        return await super().act(observation)


class HangingAgent(TargetAgent):
    """Never answers where its agent seed is a multiple of 3 (the last two episodes)."""

    async def act(self, observation: Observation) -> Action:
        if observation.info["agent_seed"] % 3 == 0:
            await asyncio.Event().wait()
        return await super().act(observation)


class OversizedAgent(TargetAgent):
    """Answers with 70 kB of text where its agent seed is a multiple of 3 (the last two
    episodes): more than its process's 64 kB message limit in ``_oversized_test``."""

    async def act(self, observation: Observation) -> Action:
        if observation.info["agent_seed"] % 3 == 0:
            return Action(agent=observation.agent, text="x" * 70_000)
        return await super().act(observation)


def _batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every batch the runner sends (recorded as it goes)."""
    sizes: list[int] = []
    ask = frames.FrameBatcher._ask

    async def recording(self: frames.FrameBatcher, peer: str, items: list[Any]) -> None:
        sizes.append(len(items))
        await ask(self, peer, items)

    monkeypatch.setattr(frames.FrameBatcher, "_ask", recording)
    return sizes


def _kinds(result: Any) -> list[list[str]]:
    """Each episode's failure as ``[seat, kind]`` (``[""]`` where it did not fail)."""
    return [record.failed.split(": ")[:2] for record in result.records]


def _both_ways(
    tmp_path: Path, argv: list[str], **kw: Any
) -> tuple[dict[bool, Any], dict[bool, bytes]]:
    results, transcripts = {}, {}
    for batch in (False, True):
        out = tmp_path / f"batch-{batch}"
        listen = f"ipc://{tmp_path}/arena-{batch}.sock"
        results[batch], _ = _remote_run(out, listen, argv, batch_frames=batch, **kw)
        transcripts[batch] = (out / "transcripts.jsonl").read_bytes()
    return results, transcripts


@pytest.mark.timeout(90)
def test_batched_frames_play_the_same_episodes_with_the_parley_agent_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = _batches(monkeypatch)
    argv = [sys.executable, "-m", "parley.arena.cli", "agent", "--connect", "ADDRESS",
            "--seat", "b", "--agent", f"{HERE}:TargetAgent", "--wait", "30"]  # fmt: skip
    results, transcripts = _both_ways(tmp_path, argv, concurrency=4)
    assert results[True].summary["episodes"] == {"total": 4, "ok": 4, "failed": 0}
    assert transcripts[True] == transcripts[False]
    # Seat b acts 3 times an episode: every request went in a batch, several per message.
    assert sum(sizes) == 4 * 3
    assert max(sizes) > 1


@pytest.mark.timeout(90)
def test_an_agent_that_raises_in_a_batch_fails_its_own_episode_with_the_same_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = _batches(monkeypatch)
    argv = _join_argv("tests.arena.run.test_batch_frames:RaisingAgent", BusConfig())
    results, transcripts = _both_ways(tmp_path, argv, concurrency=4)
    failed = {batch: [r.failed for r in results[batch].records] for batch in (False, True)}
    assert failed[True] == failed[False]
    # Episodes 2 and 3 fail; 0 and 1, asked in the same batches, play on.
    assert [bool(f) for f in failed[True]] == [False, False, True, True]
    assert all(f.startswith("b: agent_error: ValueError: agent seed") for f in failed[True] if f)
    assert transcripts[True] == transcripts[False]
    assert max(sizes) > 1


@pytest.mark.timeout(90)
def test_an_oversized_action_in_a_batch_fails_its_own_episode_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch's reply would not fit the agent process's limit: only the oversized
    actions fail, as each would alone (the whole reply failed, and every batch-mate)."""
    sizes = _batches(monkeypatch)
    argv = _join_argv("tests.arena.run.test_batch_frames:OversizedAgent",
                      BusConfig(max_message_bytes=64_000))  # fmt: skip
    results, _ = _both_ways(tmp_path, argv, concurrency=4)
    failed = {batch: [r.failed for r in results[batch].records] for batch in (False, True)}
    assert [bool(f) for f in failed[True]] == [False, False, True, True]
    assert [bool(f) for f in failed[False]] == [False, False, True, True]
    for f in failed[True][2:]:
        assert "reply not sendable: message of" in f
        assert "exceeds the limit of 64000" in f
    assert all("reply not sendable" in f for f in failed[False][2:])
    assert _steps(tmp_path / "batch-True")[:2] == _steps(tmp_path / "batch-False")[:2]
    assert max(sizes) > 1


def test_a_batch_reply_too_big_together_fails_its_largest_actions_first() -> None:
    """Each action fits alone, not all together: the largest go until the rest fit."""
    from parley.arena.run.agent_host import _fit_reply

    results: list[Action | Error] = [
        Action(agent="b", text="a" * 30_000),
        Action(agent="b", text="ok"),
        Error(code="timeout", message="no action"),
        Action(agent="b", text="c" * 20_000),
        Action(agent="b", text="d" * 25_000),
    ]
    _fit_reply(results, 64_000)
    kinds = [type(r).__name__ for r in results]
    assert kinds == ["Error", "Action", "Error", "Action", "Action"]
    assert results[0].message.startswith("reply not sendable: action of 30")
    assert "does not fit in its batch's reply" in results[0].message
    encoded = Codec().encode(Envelope(body=ActionBatch(results=results), sender="agents"))
    assert sum(len(f) for f in encoded) <= 64_000
    untouched = [Action(agent="b", text="x" * 100)] * 3
    _fit_reply(untouched, 64_000)
    assert untouched == [Action(agent="b", text="x" * 100)] * 3


@pytest.mark.long
@pytest.mark.timeout(120)
def test_an_agent_that_hangs_in_a_batch_times_out_its_own_episode_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent process answers the batch at its timeout, the hung item as timed out: its
    batch-mates' actions are not lost with it."""
    sizes = _batches(monkeypatch)
    argv = _join_argv("tests.arena.run.test_batch_frames:HangingAgent", BusConfig())
    results, _ = _both_ways(tmp_path, argv, concurrency=4, act_timeout=3.0)
    assert _kinds(results[True]) == _kinds(results[False])
    assert _kinds(results[True]) == [[""], [""], ["b", "timeout"], ["b", "timeout"]]
    # The same steps; the timeout's wording differs (a single request names its id).
    assert _steps(tmp_path / "batch-True") == _steps(tmp_path / "batch-False")
    assert max(sizes) > 1


@pytest.mark.long
@pytest.mark.timeout(120)
def test_a_dead_agent_process_fails_its_seat_as_without_batching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _batches(monkeypatch)
    argv = _join_argv("tests.arena.run.test_remote:DyingAgent", KILL_BUS)
    runs = {}
    for batch in (False, True):
        runs[batch], proc = _remote_run(
            tmp_path / f"batch-{batch}", f"ipc://{tmp_path}/a-{batch}.sock", argv,
            concurrency=1, bus=KILL_BUS, act_timeout=20.0, join_timeout=6.0, batch_frames=batch,
        )  # fmt: skip
        assert proc.returncode == -signal.SIGKILL
    assert _kinds(runs[True]) == _kinds(runs[False])
    assert _kinds(runs[True]) == [
        [""],
        ["b", "peer_dead"],
        ["b", "not_joined"],
        ["b", "not_joined"],
    ]


def test_the_batch_messages_round_trip_through_the_codec() -> None:
    codec = Codec()
    batch = ObservationBatch(
        observations=[Observation(agent="a", text="x"), Observation(agent="b", text="y")],
        episodes=["t00000-r00", "t00001-r00"],
    )
    reply = ActionBatch(
        results=[Action(agent="a", text="1"), Error(code="handler_failed", message="no")]
    )
    for body in (batch, reply):
        assert codec.decode(codec.encode(Envelope(body=body))).body == body
