"""``parley env-server --protocol openenv``: a real server process played by OpenEnv's own
client (``EnvClient`` over the WebSocket), many sessions at once; a trainer's bad input gets
OpenEnv's error and no other session notices; the loopback rules of parley's servers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openenv")

from openenv.core.generic_client import GenericEnvClient

from parley.arena.integrations.learner import LearnerArena
from parley.arena.integrations.openenv import ParleyAction, ParleyEnvClient

pytestmark = pytest.mark.timeout(90)

PARLEY = str(Path(sys.executable).with_name("parley"))
SCENARIO = "collaboration/referential-v1"
SESSIONS = 64
_PIDS: dict[str, int] = {}  # server URL -> its process id


@contextlib.contextmanager
def _serving(*options: str) -> Iterator[str]:
    """The URL of a ``parley env-server`` process (listener learned, speaker scripted)."""
    cmd = [PARLEY, "env-server", SCENARIO, "--learner", "listener", "--port", "0", *options]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the URL, printed once bound (or the error)
        assert line.startswith("openenv: serving"), line + proc.stdout.read()
        url = line.split(" at ")[1].split()[0]
        _PIDS[url] = proc.pid
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with _serving("--max-sessions", str(SESSIONS + 2)) as url:
        yield url


def _pick(observation: dict[str, object] | object) -> str:
    """A fixed policy: the candidate whose number is the message's first letter's parity."""
    text = observation["text"] if isinstance(observation, dict) else observation.text  # type: ignore[attr-defined]
    return "1" if str(text).split()[1][0] in "aceg" else "2"


Step = Callable[[ParleyEnvClient, ParleyAction], Awaitable[Any]]


async def _step(env: ParleyEnvClient, action: ParleyAction) -> Any:
    return await env.step(action)


async def _episodes(
    url: str, seeds: list[int], step: Step = _step
) -> list[tuple[str, float | None, str]]:
    """Plays ``seeds`` in one OpenEnv session; (observation text, return, failed) each."""
    out = []
    async with ParleyEnvClient(base_url=url, message_timeout_s=60) as env:
        for seed in seeds:
            result = await env.reset(seed=seed)
            first = result.observation.text
            while not result.done:
                result = await step(env, ParleyAction(text=_pick(result.observation)))
            out.append(
                (first, result.observation.returns.get("listener"), result.observation.failed)
            )
    return out


async def _in_process(seeds: list[int]) -> list[tuple[str, float | None, str]]:
    out = []
    async with LearnerArena(SCENARIO, learners=["listener"]) as arena:
        session = arena.session()
        for seed in seeds:
            turn = await session.reset(seed)
            first = turn.text
            while not turn.done:
                turn = await session.step(_pick(turn))
            out.append((first, turn.returns.get("listener"), turn.failed))
    return out


async def test_openenv_clients_play_64_sessions_at_once_as_the_arena_does(server: str) -> None:
    """64 concurrent EnvClient sessions, 2 episodes each: every episode is the one the
    in-process adapter plays on that seed (same observation, same return), none failed."""
    seeds = [[2 * i, 2 * i + 1] for i in range(SESSIONS)]
    served = await asyncio.gather(*(_episodes(server, pair) for pair in seeds))
    expected = await _in_process([seed for pair in seeds for seed in pair])
    assert [episode for pair in served for episode in pair] == expected
    assert all(not failed for _, _, failed in expected)
    assert {reward for _, reward, _ in expected} == {0.0, 1.0}  # both outcomes occur


async def test_bad_input_gets_openenv_errors_and_other_sessions_play_on(server: str) -> None:
    async with (
        GenericEnvClient(base_url=server, message_timeout_s=30) as bad,
        GenericEnvClient(base_url=server, message_timeout_s=30) as good,
    ):
        first = await good.reset(seed=11)
        with pytest.raises(RuntimeError, match="no_episode"):
            await bad.step({"text": "1"})
        await bad.reset(seed=11)
        for action, expected in (
            ({"txt": "1"}, "VALIDATION_ERROR"),  # malformed: no text, unknown field
            ({"text": ["1"]}, "VALIDATION_ERROR"),
            ({"text": "1", "seat": "speaker"}, "unknown_seat"),
        ):
            with pytest.raises(RuntimeError, match=expected):
                await bad.step(action)
        done = await bad.step({"text": "1", "seat": "listener"})
        assert done.done
        with pytest.raises(RuntimeError, match="episode_over"):
            await bad.step({"text": "1"})
        # A frame that is not JSON at all, straight on the socket: an error frame, no close.
        await bad._send({"type": "step", "data": "not an action"})
        reply = await bad._receive()
        assert reply["type"] == "error"
        assert (await bad.reset(seed=3)).observation["seat"] == "listener"
        end = await good.step({"text": "1"})
        assert end.done
        assert end.observation["failed"] == ""
        assert first.observation["seat"] == "listener"


def test_http_is_stateless_and_answers_loopback_hosts_only(server: str) -> None:
    def post(path: str, body: dict[str, object], host: str = "") -> tuple[int, dict[str, object]]:
        request = urllib.request.Request(
            server + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **({"Host": host} if host else {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    status, body = post("/reset", {"seed": 4})
    assert status == 200
    assert body["observation"]["seat"] == "listener"  # type: ignore[index]
    status, body = post("/step", {"action": {"text": "1"}})
    assert (status, body["code"]) == (409, "no_episode")
    status, body = post("/reset", {"seed": 4}, host="attacker.example:80")
    assert (status, body["code"]) == (421, "bad_host")


def test_a_non_loopback_bind_needs_insecure() -> None:
    done = subprocess.run(
        [PARLEY, "env-server", SCENARIO, "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--insecure" in done.stderr


async def test_a_session_past_the_cap_is_refused_and_the_others_play_on() -> None:
    with _serving("--max-sessions", "2") as url:
        async with (
            ParleyEnvClient(base_url=url, message_timeout_s=30) as one,
            ParleyEnvClient(base_url=url, message_timeout_s=30) as two,
        ):
            first = await one.reset(seed=1)
            await two.reset(seed=2)
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                async with ParleyEnvClient(base_url=url, message_timeout_s=30) as third:
                    await third.reset(seed=3)
            end = await one.step(ParleyAction(text=_pick(first.observation)))
            assert end.done
            assert end.observation.failed == ""


@pytest.mark.timeout(120)
def test_bench_env_server_json_reports_both_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    """``parley bench env-server --json`` end to end at a tiny size (shape only)."""
    from parley.arena.cli import main

    argv = ["bench", "env-server", "--json", "--sessions", "4", "--episodes", "8"]
    assert main([*argv, "--repeats", "1"]) == 0
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert results["openenv_ratio_vs_arena"] > 0
    assert results["openenv_cpu_ratio_vs_arena"] > 0
    assert results["sessions"] == 4


def _threads(pid: int) -> int:
    """Threads of process ``pid`` (Linux /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("Threads:")).split()[1])


async def test_open_sessions_share_the_servers_threads(server: str) -> None:
    """64 open sessions mid-episode cost the server no thread each (OpenEnv's default is an
    executor per session; parley's environments run on the event loop)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("needs Linux /proc")
    clients = [ParleyEnvClient(base_url=server, message_timeout_s=60) for _ in range(SESSIONS)]
    try:
        await asyncio.gather(*(c.reset(seed=i) for i, c in enumerate(clients)))
        assert _threads(_PIDS[server]) < 16
    finally:
        await asyncio.gather(*(c.close() for c in clients))


async def test_a_stopped_server_does_not_time_out_a_trainer_that_answered_in_time() -> None:
    """``parley env-server --turn-timeout 1`` stopped (SIGSTOP) for 2 s at every learner
    turn, the trainer's step sent at once, during the stop: on resuming the server takes
    the step, and every episode ends as it does unpaused (none failed as a timeout). The
    turn timeout counts the time the server ran; a trainer 2 s late still fails."""
    seeds = [5, 6, 7]
    expected = await _in_process(seeds)
    with _serving("--turn-timeout", "1") as url:
        pid = _PIDS[url]

        async def stopped(env: ParleyEnvClient, action: ParleyAction) -> Any:
            os.kill(pid, signal.SIGSTOP)
            try:
                step = asyncio.ensure_future(env.step(action))
                await asyncio.sleep(2.0)
            finally:
                os.kill(pid, signal.SIGCONT)
            return await step

        async def late(env: ParleyEnvClient, action: ParleyAction) -> Any:
            await asyncio.sleep(2.0)  # (the server running)
            return await env.step(action)

        got = await _episodes(url, seeds, stopped)
        ((_, _, failed),) = await _episodes(url, seeds[:1], late)
    assert got == expected
    assert "timeout" in failed, failed
