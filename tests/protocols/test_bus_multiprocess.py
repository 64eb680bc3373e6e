"""The bus between spawned processes over ipc:// and tcp://: request/reply both ways,
broadcast, a SIGKILLed peer detected with its requests failed, a SIGSTOPped requester not
charging its peer a timeout, CURVE refusing wrong keys."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

import pytest
import zmq

from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import BusError, PeerDead, RequestTimeout
from parley.protocols.messages import Action, Chat, Envelope, Observation
from tests.protocols._peer import PROCESS_CONFIG, run_peer

CONFIG = BusConfig(**PROCESS_CONFIG)
SPAWN = mp.get_context("spawn")
START_TIMEOUT = 60.0  # a spawned interpreter imports numpy and zmq; the machine may be busy


def _address(transport: str) -> str:
    if transport == "ipc":
        return f"ipc://{tempfile.gettempdir()}/parley-mp-{os.urandom(4).hex()}"
    return "tcp://127.0.0.1:0"


class Peer:
    """A child process running :func:`run_peer`, and the pipe it reports on."""

    def __init__(self, role: str, address: str, name: str, config: dict[str, Any]) -> None:
        self.conn, child = SPAWN.Pipe()
        self.process = SPAWN.Process(
            target=run_peer, args=(role, address, name, child, config), daemon=True
        )
        self.process.start()

    async def report(self, timeout: float = START_TIMEOUT) -> tuple[Any, ...]:  # noqa: ASYNC109
        if not await asyncio.to_thread(self.conn.poll, timeout):
            raise AssertionError(f"peer process reported nothing within {timeout} s")
        report: tuple[Any, ...] = self.conn.recv()
        return report

    def stop(self) -> None:
        if self.process.is_alive():
            with suppress(OSError):  # the process may be gone already
                self.conn.send("stop")
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)

    def kill(self) -> None:
        assert self.process.pid is not None
        os.kill(self.process.pid, signal.SIGKILL)


@contextmanager
def peers(*specs: tuple[str, str, str, dict[str, Any]]) -> Iterator[list[Peer]]:
    started = [Peer(*spec) for spec in specs]
    try:
        yield started
    finally:
        for peer in started:
            peer.stop()


@asynccontextmanager
async def arena(transport: str, config: BusConfig = CONFIG) -> AsyncIterator[tuple[Endpoint, str]]:
    ep = Endpoint("arena", config=config)
    try:
        yield ep, await ep.bind(_address(transport))
    finally:
        await ep.close()


async def _upper(env: Envelope) -> Action:
    assert isinstance(env.body, Observation)
    return Action(agent="arena", text=env.body.text.upper())


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
async def test_request_reply_and_broadcast(transport: str) -> None:
    async with arena(transport) as (ep, address):
        ep.on(Observation, _upper)
        echoes: list[str] = []

        async def on_chat(env: Envelope) -> None:
            assert isinstance(env.body, Chat)
            echoes.append(f"{env.body.sender}: {env.body.text}")

        ep.on(Chat, on_chat)
        with peers(*(("connect", address, n, PROCESS_CONFIG) for n in ("alice", "bob"))) as ps:
            reports = sorted([await p.report() for p in ps])
            assert reports == [
                ("connected", "arena", "HI FROM ALICE"),
                ("connected", "arena", "HI FROM BOB"),
            ]
            for name in ("alice", "bob"):
                reply = await asyncio.wait_for(
                    ep.request(name, Observation(agent=name, text="go")), 10
                )
                assert reply == Action(agent=name, text="GO")
            assert await ep.publish("episode/7", Chat(sender="arena", text="deal?")) == 2
            await asyncio.wait_for(_until(lambda: len(echoes) == 2), 10)
            assert sorted(echoes) == ["alice: episode/7 deal?", "bob: episode/7 deal?"]


def _stop_me_for(seconds: float) -> subprocess.Popen[bytes]:
    """Stop this process (SIGSTOP) now, and resume it (SIGCONT) ``seconds`` later, as a
    loaded host or a debugger would: its zmq I/O thread stands still too."""
    pid = os.getpid()
    return subprocess.Popen(["sh", "-c", f"kill -STOP {pid}; sleep {seconds}; kill -CONT {pid}"])


async def test_a_stopped_requester_takes_the_reply_that_came_in_time() -> None:
    """The requesting process is stopped past a request's limit; the peer answers 0.1 s
    after the request, while it is stopped. On SIGCONT the loop runs the deadline timer
    before it has read the reply (zmq's I/O thread was stopped too): the reply must win
    (before the bus put its deadlines off for a late timer, the timeout won most times).
    A silent peer still times out, by at most its limit past the stall, and a request sent
    after the stall gets its own limit."""
    async with arena("ipc") as (ep, address):
        ep.on(Observation, _upper)
        loop = asyncio.get_running_loop()
        with peers(("connect", address, "alice", PROCESS_CONFIG)) as (alice,):
            await alice.report()
            for _ in range(4):
                asked = asyncio.ensure_future(
                    ep.request("alice", Observation(agent="a", text="slow"), timeout=0.3)
                )
                await asyncio.sleep(0)  # (sent)
                stopper = _stop_me_for(1.0)
                reply = await asked
                assert reply == Action(agent="alice", text="SLOW")
                stopper.wait()
            silent = asyncio.ensure_future(
                ep.request("alice", Observation(agent="a", text="hang"), timeout=0.3)
            )
            await asyncio.sleep(0)
            sent = loop.time()
            stopper = _stop_me_for(1.0)
            with pytest.raises(RequestTimeout, match=r"within 0\.3 s"):
                await silent
            stopper.wait()
            assert loop.time() - sent < 1.0 + 2 * 0.3 + 1.0
            took = loop.time()
            with pytest.raises(RequestTimeout):
                await ep.request("alice", Observation(agent="a", text="hang"), timeout=0.2)
            assert 0.19 <= loop.time() - took < 1.2


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
async def test_killed_connecting_peer_fails_its_requests(transport: str) -> None:
    """SIGKILL one of two peers: its pending requests fail with PeerDead within the peer
    timeout, the other peer keeps working, and a new process under the name can join."""
    async with arena(transport) as (ep, address):
        ep.on(Observation, _upper)
        specs = [("connect", address, n, PROCESS_CONFIG) for n in ("victim", "witness")]
        with peers(*specs) as (victim, witness):
            await victim.report()
            await witness.report()
            pending = [
                asyncio.create_task(ep.request("victim", Observation(agent="v", text="hang")))
                for _ in range(3)
            ]
            await asyncio.sleep(0.2)
            loop = asyncio.get_running_loop()
            start = loop.time()
            victim.kill()
            for task in pending:
                with pytest.raises(PeerDead):
                    await asyncio.wait_for(task, CONFIG.peer_timeout + 5)
            assert loop.time() - start <= CONFIG.peer_timeout + 1.0
            assert ep.peers == ["witness"]
            reply = await ep.request("witness", Observation(agent="w", text="still"))
            assert reply == Action(agent="witness", text="STILL")
            with peers(("connect", address, "victim", PROCESS_CONFIG)) as (again,):
                assert (await again.report())[0] == "connected"
                reply = await ep.request("victim", Observation(agent="v", text="back"))
                assert reply == Action(agent="victim", text="BACK")


async def test_killed_bound_peer_fails_its_requests() -> None:
    """The connecting side learns of a killed bound peer from missing heartbeats."""
    with peers(("bind", _address("ipc"), "pool", PROCESS_CONFIG)) as (pool,):
        kind, address = await pool.report()
        assert kind == "bound"
        async with Endpoint("agent", config=CONFIG) as ep:
            assert await ep.connect(address, timeout=10) == "pool"
            pending = asyncio.create_task(ep.request("pool", Observation(agent="a", text="hang")))
            await asyncio.sleep(0.2)
            loop = asyncio.get_running_loop()
            start = loop.time()
            pool.kill()
            with pytest.raises(PeerDead):
                await asyncio.wait_for(pending, CONFIG.peer_timeout + 5)
            assert loop.time() - start <= CONFIG.peer_timeout + 1.0
            assert ep.peers == []


async def test_curve_admits_only_the_right_keys() -> None:
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    wrong_public, wrong_secret = zmq.curve_keypair()
    server_config = BusConfig(
        **PROCESS_CONFIG,
        curve_public_key=server_public,
        curve_secret_key=server_secret,
        curve_allowed_clients=(client_public,),
    )

    def keys(public: bytes, secret: bytes, server: bytes) -> dict[str, Any]:
        return {
            **PROCESS_CONFIG,
            "curve_public_key": public,
            "curve_secret_key": secret,
            "curve_server_key": server,
        }

    async with arena("tcp", server_config) as (ep, address):
        ep.on(Observation, _upper)
        good = ("connect", address, "good", keys(client_public, client_secret, server_public))
        with peers(good) as (peer,):
            assert await peer.report() == ("connected", "arena", "HI FROM GOOD")
            assert await ep.request("good", Observation(agent="g", text="ok")) == Action(
                agent="good", text="OK"
            )
        await asyncio.wait_for(_until(lambda: ep.peers == []), 10)  # it said Bye
        received = ep.stats.received
        specs = [
            ("connect", address, "wrong-key", keys(wrong_public, wrong_secret, server_public)),
            ("connect", address, "wrong-server", keys(client_public, client_secret, wrong_public)),
            ("connect", address, "plain", PROCESS_CONFIG),
        ]
        with peers(*specs) as ps:
            for spec, p in zip(specs, ps, strict=True):
                kind, error, message, got = await p.report()
                # The refused peer received nothing...
                assert (kind, error, got) == ("failed", "RequestTimeout", 0), (spec[2], message)
        # ...and nothing it sent reached the arena, which cannot address it either.
        assert ep.stats.received == received
        assert ep.stats.bad_messages == 0
        with pytest.raises(BusError):
            await ep.request("wrong-key", Observation(agent="x", text=""))


async def _until(condition: Any, step: float = 0.01) -> None:
    while not condition():  # noqa: ASYNC110 -- polls state set by other processes
        await asyncio.sleep(step)
