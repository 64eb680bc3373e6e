"""Seat replicas on Ray: several copies of one seat's agent as Ray actors behind that seat.

The agent spec ``replicas:N:SPEC`` (``replicas:3:scripted``, ``replicas:2:my_pkg.bots:Greedy``)
plays a seat with ``N`` Ray actors (:class:`AgentReplica`), each hosting agents built from
``SPEC``. Each episode's agent is a :class:`ReplicatedAgent` proxy that opens a session on the
least-busy live replica, sends it every observation of the episode, and returns its actions:
episodes are spread across the replicas, and one replica serves many episodes at once.

A replica that dies (killed, crashed, its node gone) is dropped from the set; each episode it
was serving moves to another live replica: the proxy opens a new session there with the same
agent seed and replays the episode's earlier observations (their actions are discarded)
before sending the current one. A deterministic agent thus gives the same actions as if
nothing had happened; an agent that samples gives a fresh, equally valid continuation. The
episode fails (as any agent failure) only when no replica is left.

``replicas:N:tcp://…`` / ``replicas:N:ipc://…`` is the same idea without Ray: ``N`` plain
``parley agent`` processes behind the seat (:mod:`parley.arena.run.bus_replicas`).

Ray is started locally on first use when this process is not connected
(:func:`~parley.arena.run.ray_runner.init_ray`). Under ``parley run --ray`` every worker
resolves the spec itself, so each worker has its own ``N`` replicas.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from parley.agents.base import Agent
from parley.arena.run.agent_specs import AgentFactory, SeatContext, resolve_agent_spec
from parley.protocols.errors import ConfigError
from parley.protocols.messages import Action, Observation

__all__ = ["SeatReplicas", "resolve_replicas"]


class AgentReplica:
    """Body of one replica actor: agents of one seat, one per open session."""

    def __init__(self, factory: AgentFactory) -> None:
        self.factory = factory
        self.sessions: dict[str, Agent] = {}
        self.served = 0

    async def open(self, session: str, seed: int | None) -> None:
        """Start ``session`` with a fresh agent reset with ``seed``."""
        agent = self.factory()
        agent.reset(seed)
        self.sessions[session] = agent

    async def act(self, session: str, observation: Observation) -> Action:
        """The session's agent's action for ``observation``."""
        agent = self.sessions.get(session)
        if agent is None:
            raise ConfigError(f"no open session {session!r} on this replica")
        self.served += 1
        return await agent.act(observation)

    async def close(self, session: str) -> None:
        """End ``session`` and close its agent."""
        agent = self.sessions.pop(session, None)
        if agent is not None:
            await agent.close()

    def stats(self) -> dict[str, int]:
        """Requests served and sessions open."""
        return {"served": self.served, "open": len(self.sessions)}


class SeatReplicas:
    """``replicas`` actors of one seat's agent, started on first use; picks the least busy."""

    def __init__(
        self, factory: AgentFactory, replicas: int, actor_options: dict[str, Any] | None = None
    ) -> None:
        if replicas < 1:
            raise ConfigError(f"a seat needs at least 1 replica, got {replicas}")
        self.factory = factory
        self.replicas = replicas
        self.actor_options = {"num_cpus": 0, "max_restarts": 0, **(actor_options or {})}
        self.actors: list[Any] = []
        self.busy: dict[int, int] = {}
        self.dead: set[int] = set()
        self.failovers = 0
        """Sessions moved to another replica after theirs died."""
        self._turn = itertools.count()

    def start(self) -> None:
        """Start the replica actors (Ray is started locally if this process is not on one)."""
        if self.actors:
            return
        from parley.arena.run.ray_runner import import_ray, init_ray

        init_ray()
        ray = import_ray()
        cls = ray.remote(**self.actor_options)(AgentReplica)
        self.actors = [cls.remote(self.factory) for _ in range(self.replicas)]
        self.busy = dict.fromkeys(range(self.replicas), 0)

    def pick(self) -> int:
        """The live replica with the fewest sessions in flight (round-robin among equals)."""
        self.start()
        live = [i for i in range(len(self.actors)) if i not in self.dead]
        if not live:
            raise ConfigError(f"every one of the seat's {self.replicas} replicas has died")
        turn = next(self._turn)
        return min(live, key=lambda i: (self.busy[i], (i - turn) % len(self.actors)))

    def __getstate__(self) -> dict[str, Any]:
        # Travels unstarted (to Ray workers): each process starts its own replicas.
        state = dict(self.__dict__)
        state.update(actors=[], busy={}, dead=set(), failovers=0, _turn=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._turn = itertools.count()

    def __call__(self) -> ReplicatedAgent:
        return ReplicatedAgent(self)


class ReplicatedAgent(Agent):
    """One episode's agent of a replicated seat: a session on one replica at a time."""

    def __init__(self, replicas: SeatReplicas) -> None:
        self.set = replicas
        self.session = uuid.uuid4().hex
        self.seed: int | None = None
        self.history: list[Observation] = []
        self.replica: int | None = None

    def reset(self, seed: int | None = None) -> None:
        self.seed, self.history, self.replica = seed, [], None

    async def act(self, observation: Observation) -> Action:
        from ray.exceptions import RayActorError

        while True:
            index = self.replica if self.replica is not None else self.set.pick()
            actor = self.set.actors[index]
            self.set.busy[index] += 1
            try:
                if self.replica is None:
                    await actor.open.remote(self.session, self.seed)
                    for earlier in self.history:  # a moved session catches up
                        await actor.act.remote(self.session, earlier)
                    self.replica = index
                action: Action = await actor.act.remote(self.session, observation)
            except RayActorError:
                if index not in self.set.dead:
                    self.set.dead.add(index)
                self.set.failovers += 1
                self.replica = None
                continue
            finally:
                self.set.busy[index] -= 1
            self.history.append(observation)
            return action

    async def close(self) -> None:
        if self.replica is not None and self.replica not in self.set.dead:
            self.set.actors[self.replica].close.remote(self.session)  # one-way
        self.replica = None


def resolve_replicas(arg: str, seat: SeatContext) -> SeatReplicas | Any:
    """Resolver of ``replicas:N:SPEC`` (registered in ``AGENT_KINDS``); ``replicas:N:ADDRESS``
    (``tcp://``, ``ipc://``) is a seat of ``N`` plain ``parley agent`` processes instead
    (:mod:`parley.arena.run.bus_replicas`, no Ray)."""
    count, _, inner = arg.partition(":")
    if not count.isdigit() or int(count) < 1 or not inner:
        raise ConfigError(
            f"bad agent spec replicas:{arg} for seat {seat.seat!r}: write replicas:N:SPEC "
            "with N >= 1, e.g. replicas:3:scripted or replicas:3:tcp://127.0.0.1:5600"
        )
    if inner.startswith(("tcp://", "ipc://")):
        from parley.arena.run.bus_replicas import resolve_bus_replicas

        return resolve_bus_replicas(int(count), inner, seat)
    source = resolve_agent_spec(inner, seat)
    if not callable(source) or inner.startswith("remote"):
        raise ConfigError(f"replicas:{arg}: only in-process agents can be replicated")
    return SeatReplicas(source, int(count))
