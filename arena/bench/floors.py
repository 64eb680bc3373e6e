"""Reference loops under the runner's ratios: what the contract costs with nothing around it.

:mod:`parley.arena.bench.env` divides the runner's agent steps/s by a plain loop's that
awaits the same agents directly. Two things the runner must do cost something whatever the
code around them; each is measured as a plain loop that does it and nothing else, in the
same run, so a target can be read against what that alone leaves (the copy floor is the
plain loop of :mod:`~parley.arena.bench.env` with ``copy=True``; the raw loop is here):

* **copy floor** (in-process agents): the plain loop, with every observation handed to its
  agent as a bare msgpack round trip of it (``msgspec``, no envelope, no checks) — the
  cheapest way an in-process agent can see what a remote one would (the guarantee that
  keeps the two interchangeable and their transcripts identical). A runner that keeps the
  guarantee does this and more: its ratio stays under this one's;
* **raw pyzmq reference** (agents in another process): the plain loop's episodes,
  ``concurrency`` at once, with every ``act`` a raw ZeroMQ DEALER/ROUTER round trip over
  ``ipc://`` to a child process hosting the same agents — msgpack bodies, no envelope, no
  event loop on the arena side, no timeouts, heartbeats or failure handling. It is the
  transport with nothing around it, not a strict floor: the bus, which sends a step's
  requests before it waits and drains its socket in batches, can land near or above it.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from parley.protocols.messages import Action, Observation

if TYPE_CHECKING:
    from parley.arena.bench.env import Workload

__all__ = ["raw_pyzmq_steps_per_s"]

_READY = b"ready"
_STOP = b"stop"
_JOIN_TIMEOUT_MS = 60_000


def _raw_agents(address: str, agents: dict[str, str], keep: int) -> None:
    """Child process: answer each ``[tag, observation]`` with ``[tag, action]``; an agent per
    tag (episode and seat), the ``keep`` newest kept."""
    from parley.arena.run.agent_specs import load_object
    from parley.arena.run.gather import _drive

    factories = {seat: load_object(path) for seat, path in agents.items()}
    decode = msgspec.msgpack.Decoder(Observation).decode
    encode = msgspec.msgpack.Encoder().encode
    loop = asyncio.new_event_loop()
    live: dict[bytes, Any] = {}
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(address)
    sock.send(_READY)
    try:
        while True:
            frames = sock.recv_multipart()
            if frames[0] == _STOP:
                return
            tag, data = frames
            obs = decode(data)
            agent = live.get(tag)
            if agent is None:
                agent = live[tag] = factories[obs.agent]()
                agent.reset(int(tag.split(b":", 1)[0]))
                if len(live) > keep:
                    del live[next(iter(live))]
            act = agent.act(obs)
            try:
                yielded = act.send(None)
            except StopIteration as stop:
                action = stop.value
            else:  # an agent that suspends: finished on this process's loop
                action = loop.run_until_complete(_drive(act, yielded))
            sock.send_multipart([tag, encode(action)])
    finally:
        sock.close()
        context.term()
        loop.close()


class _Slot:
    """One of the ``concurrency`` episodes in flight in the raw loop."""

    def __init__(self, env: Any, episode: int) -> None:
        self.env = env
        self.episode = episode
        self.observations, self.infos = env.reset(seed=episode)
        self.rewards: dict[str, float] = {}
        self.actions: dict[str, str] = {}
        self.waiting = 0


@contextlib.contextmanager
def ipc_address(name: str) -> Iterator[str]:
    """An ``ipc://`` address in a private temporary directory, removed with what the
    socket left there on exit (the socket files stayed in /tmp after every bench)."""
    with tempfile.TemporaryDirectory(prefix="parley-bench-") as directory:
        yield f"ipc://{os.path.join(directory, name)}"


def raw_pyzmq_steps_per_s(work: Workload, concurrency: int) -> tuple[float, float]:
    """Agent steps per CPU second (this process) and per wall-clock second of ``work``'s
    episodes, ``concurrency`` at once, every ``act`` a raw pyzmq round trip to a child
    process (its start and imports are not timed)."""
    with ipc_address("floor") as address:
        return _raw_pyzmq_steps_per_s(work, concurrency, address)


def _raw_pyzmq_steps_per_s(work: Workload, concurrency: int, address: str) -> tuple[float, float]:
    from parley.scenarios import make

    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    router.rcvtimeo = _JOIN_TIMEOUT_MS
    router.bind(address)
    keep = 2 * concurrency * len(work.agents)
    child = mp.get_context("spawn").Process(
        target=_raw_agents, args=(address, work.agents, keep), daemon=True
    )
    child.start()
    encode = msgspec.msgpack.Encoder().encode
    decode = msgspec.msgpack.Decoder(Action).decode
    try:
        try:
            peer, hello = router.recv_multipart()
        except zmq.Again:
            raise RuntimeError(
                f"the raw pyzmq floor's agent process did not connect within "
                f"{_JOIN_TIMEOUT_MS // 1000} s (exit code {child.exitcode})"
            ) from None
        if hello != _READY:
            raise RuntimeError(f"the raw pyzmq floor's agent process sent {hello!r}")
        started, cpu_started = time.perf_counter(), time.process_time()
        steps, next_episode = 0, 0
        slots: dict[bytes, _Slot] = {}

        def ask(slot: _Slot) -> bool:
            """Send the requests of ``slot``'s acting seats; False if no seat acts."""
            for seat in slot.env.agents:
                info = slot.infos.get(seat, {})
                if not info.get("to_act", True):
                    continue
                obs = Observation(
                    agent=seat,
                    text=slot.observations.get(seat, ""),
                    scenario=work.scenario,
                    reward=slot.rewards.get(seat, 0.0),
                    info=info,
                )
                tag = f"{slot.episode}:{seat}".encode()
                slots[tag] = slot
                router.send_multipart([peer, tag, encode(obs)])
                slot.waiting += 1
            return slot.waiting > 0

        def drive(slot: _Slot | None) -> None:
            """Step ``slot`` (or a new episode) on until a request is out or none is left."""
            nonlocal next_episode
            while True:
                if slot is None or not slot.env.agents:
                    if slot is not None:
                        slot.env.close()
                    if next_episode >= work.episodes:
                        return
                    slot = _Slot(make(work.scenario, **work.kwargs), next_episode)
                    next_episode += 1
                if ask(slot):
                    return
                step(slot)

        def step(slot: _Slot) -> None:
            slot.observations, slot.rewards, _, _, slot.infos = slot.env.step(slot.actions)
            slot.actions = {}

        for _ in range(concurrency):
            drive(None)
        while slots:  # (one entry per request in flight)
            _, tag, data = router.recv_multipart()
            slot = slots.pop(tag)
            action = decode(data)
            slot.actions[action.agent] = action.text
            steps += 1
            slot.waiting -= 1
            if not slot.waiting:
                step(slot)
                drive(slot)
        cpu, wall = time.process_time() - cpu_started, time.perf_counter() - started
        router.send_multipart([peer, _STOP])
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
        router.close()
        context.term()
    return steps / cpu, steps / wall
