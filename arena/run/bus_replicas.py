"""Seat replicas as plain processes: several ``parley agent`` processes behind one seat.

The agent spec ``replicas:N:ADDRESS`` (``replicas:3:tcp://127.0.0.1:5600``,
``replicas:2:ipc:///tmp/listener``) plays a seat with the ``parley agent`` processes that
connect to ``ADDRESS``, where the arena's process listens for them when the run plays its
first episode (a listener of the seat's own, beside the arena's ``--listen``)::

    parley run SCENARIO --agents scripted,replicas:3:tcp://127.0.0.1:5600
    parley agent --connect tcp://127.0.0.1:5600 --seat listener --name agent-listener-1 ...
    parley agent --connect tcp://127.0.0.1:5600 --seat listener --name agent-listener-2 ...

Each replica joins under a name of its own that starts with ``agent-SEAT`` (the bus refuses a
second live peer with a name it knows); other names are refused with that hint. The run's
first episodes wait up to ``join_timeout`` (agent option ``replicas_join_timeout``, else the
run's ``--join-timeout``) for ``N`` replicas to join; later ones use whoever is connected,
and replicas may join at any time. A replica that joined and left before the N-th joined
counts among the N.

Each episode's agent is a :class:`ReplicaSession`: it sends the episode's observations to one
replica (the live one with the fewest episodes in flight) under a session id of its own, so
episodes spread over the replicas and one replica serves many at once. A replica that dies
(killed: the bus notices its closed connection within about a second; or it said goodbye)
fails the requests it had pending with ``PeerDead``; each of its sessions moves to another live
replica, which gets a fresh session with the same agent seed and the episode's earlier
observations (their actions are discarded) before the pending one is sent again. Every
observation thus gets exactly one action, from one replica; a deterministic agent gives the
same actions as if nothing had happened. An episode fails only when no replica is left
within ``join_timeout``.

Transport security is the bus's: a non-loopback ``tcp://`` address needs CURVE, the agent
options ``replicas_curve_key`` (this listener's ``.key_secret`` file) and
``replicas_client_keys`` (the replicas' public key files, a list); the replicas pass
``--curve-key`` and ``--server-key``.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Sequence
from typing import Any

from parley.agents.base import Agent
from parley.arena.run.agent_specs import SeatContext, remote_peer_name
from parley.arena.run.security import arena_endpoint_config
from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import BusError, ConfigError, PeerDead, RemoteError, RequestTimeout
from parley.protocols.messages import Action, Observation

__all__ = ["BusReplicas", "ReplicaSession", "resolve_bus_replicas"]

JOIN_TIMEOUT = 60.0
"""Seconds to wait for replicas (the first episode: all N; later: any one) when neither the
run's ``join_timeout`` (``--join-timeout``) nor ``replicas_join_timeout`` says."""

REPLICA_HEARTBEAT_S = 0.5
"""Heartbeat interval towards the replicas: a killed replica's closed connection is noticed
after 2.5 of them (1.25 s); a busy one, whose connection stays open, is waited for up to
the bus's ``peer_timeout``."""


class BusReplicas:
    """The replicas of one seat: the listener they connect to, who is live, who is busy."""

    def __init__(
        self,
        seat: str,
        address: str,
        replicas: int,
        *,
        bus: BusConfig | None = None,
        join_timeout: float = JOIN_TIMEOUT,
        act_timeout: float = 600.0,
    ) -> None:
        if replicas < 1:
            raise ConfigError(f"a seat needs at least 1 replica, got {replicas}")
        self.seat = seat
        self.address = address
        self.replicas = replicas
        self.prefix = remote_peer_name(seat)
        self.bus = bus or BusConfig(heartbeat_interval=REPLICA_HEARTBEAT_S)
        self.join_timeout = join_timeout
        self.act_timeout = act_timeout
        self.endpoint: Endpoint | None = None
        self.bound = ""
        self.sessions: dict[str, int] = {}
        """Episodes in flight per replica."""
        self.served: dict[str, int] = {}
        """Requests answered per replica (its bus name)."""
        self.failovers = 0
        """Sessions moved to another replica after theirs died."""
        self.lost: list[str] = []
        """Replicas seen dead, in order."""
        self.joined: set[str] = set()
        """Names of the replicas admitted since the listener was bound, live or not."""
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._turn = itertools.count()

    def __call__(self) -> ReplicaSession:
        return ReplicaSession(self)

    async def start(self) -> Endpoint:
        """Bind the listener (once) and, the first time, wait for ``replicas`` to join.

        Every episode waits for that first start, not only the one that began it: the
        listener is not in use before it. A replica that joined and died during the wait
        counts as joined (a wait for ``replicas`` live ones could then never end)."""
        if self._started:
            assert self.endpoint is not None
            return self.endpoint
        self._start_lock = self._start_lock or asyncio.Lock()
        async with self._start_lock:
            if self.endpoint is None:
                config = arena_endpoint_config(self.bus)  # (replicas send actions only)
                endpoint = Endpoint(f"arena-replicas-{self.seat}", config=config)
                endpoint.set_admission(self._admit)
                try:
                    self.bound = await endpoint.bind(self.address)
                except BaseException:
                    await endpoint.close()
                    raise
                self.endpoint = endpoint
                try:
                    await self._wait_for(self.replicas, joined=True)
                finally:  # (timed out: this episode fails; later ones use who is there)
                    self._started = True
        assert self.endpoint is not None
        return self.endpoint

    def _admit(self, name: str, key: str | None) -> str | None:
        if name == self.prefix or name.startswith(f"{self.prefix}-"):
            self.joined.add(name)
            return None
        return (
            f"this listener takes replicas of seat {self.seat!r}: join as {self.prefix}-K "
            f"(parley agent --seat {self.seat} --name {self.prefix}-2), not {name!r}"
        )

    def live(self) -> list[str]:
        """Names of the replicas connected and alive."""
        return sorted(self.endpoint.peers) if self.endpoint is not None else []

    async def _wait_for(self, count: int, *, joined: bool = False) -> None:
        """Wait ``join_timeout`` for ``count`` live replicas, or, ``joined``, for ``count``
        that joined since the listener was bound, live or not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.join_timeout
        while len(self.joined if joined else self.live()) < count:
            if loop.time() >= deadline:
                needed = "all" if count == self.replicas else f"at least {count}"
                raise RequestTimeout(
                    f"{len(self.joined)} of the {self.replicas} replicas of seat {self.seat!r} "
                    f"joined {self.bound} within {self.join_timeout:g} s ({len(self.live())} "
                    f"connected; waited for {needed}; --join-timeout); start them with `parley "
                    f"agent --connect {self.bound} --seat {self.seat} --name {self.prefix}-K` "
                    f"for K in 1..{self.replicas}"
                )
            await asyncio.sleep(0.05)  # the bus has no join event to await

    async def pick(self) -> str:
        """The live replica with the fewest sessions in flight (round-robin among equals);
        waits ``join_timeout`` for one when none is live."""
        live = self.live()
        if not live:
            await self._wait_for(1)
            live = self.live()
        turn = next(self._turn)
        order = {name: (i - turn) % len(live) for i, name in enumerate(live)}
        return min(live, key=lambda name: (self.sessions.get(name, 0), order[name]))

    def lost_replica(self, endpoint: Endpoint, name: str, exc: BusError) -> bool:
        """Whether ``exc``, raised by a request to replica ``name``, means the replica is
        gone (its session moves on) rather than that it answered (an agent's ``Error``
        fails the episode). A replica declared dead between two observations of a session
        is no longer a peer at all: the bus says it "has no peer named" it."""
        if isinstance(exc, PeerDead):
            return True
        return not isinstance(exc, RemoteError) and name not in endpoint.peers

    def died(self, name: str) -> None:
        if name not in self.lost:
            self.lost.append(name)

    async def close(self) -> None:
        """Close the listener (the replicas see the arena leave and exit)."""
        endpoint, self.endpoint = self.endpoint, None
        self._started, self.joined = False, set()  # (started again: bound and waited for anew)
        if endpoint is not None:
            await endpoint.close()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("seat replicas over the bus live in the arena's process (not on Ray)")


class ReplicaSession(Agent):
    """One episode's agent of a replicated seat: a session on one replica at a time."""

    def __init__(self, replicas: BusReplicas) -> None:
        self.set = replicas
        self.session = ""
        self.history: list[Observation] = []
        self.replica: str | None = None

    def reset(self, seed: int | None = None) -> None:
        self.session = uuid.uuid4().hex
        self.history, self.replica = [], None

    async def act(self, observation: Observation) -> Action:
        endpoint = await self.set.start()
        while True:
            catch_up: list[Observation] = []
            if self.replica is None:  # a new or moved session: same seed, the episode so far
                self.replica, catch_up = await self.set.pick(), self.history
                self.set.sessions[self.replica] = self.set.sessions.get(self.replica, 0) + 1
            name = self.replica
            try:
                for earlier in catch_up:
                    await self._ask(endpoint, name, earlier)
                action = await self._ask(endpoint, name, observation)
            except BusError as exc:
                if not self.set.lost_replica(endpoint, name, exc):
                    raise
                self._leave()
                self.set.died(name)
                self.set.failovers += 1
                continue
            self.history.append(observation)
            self.set.served[name] = self.set.served.get(name, 0) + 1
            return action

    def _leave(self) -> str | None:
        replica, self.replica = self.replica, None
        if replica is not None:
            self.set.sessions[replica] -= 1
        return replica

    async def _ask(self, endpoint: Endpoint, name: str, observation: Observation) -> Action:
        reply = await endpoint.request(
            name, observation, timeout=self.set.act_timeout, episode=self.session
        )
        if not isinstance(reply, Action):
            raise RemoteError(
                "bad_message", f"expected an Action, got {type(reply).__name__}", peer=name
            )
        return reply

    async def close(self) -> None:
        replica = self._leave()
        endpoint = self.set.endpoint
        if replica is None or endpoint is None or replica not in endpoint.peers:
            return
        end = Observation(agent=self.set.seat, text="The episode is over.", terminated=True)
        try:
            await endpoint.send(replica, end, episode=self.session)
        except PeerDead:  # it died meanwhile: nothing of the session is left to free
            return


def _client_keys(value: Any) -> Sequence[Any]:
    if value is None:
        return ()
    return [value] if isinstance(value, str) else list(value)


def resolve_bus_replicas(count: int, address: str, seat: SeatContext) -> BusReplicas:
    """``replicas:N:ADDRESS`` (through :func:`~parley.arena.run.ray_agents.resolve_replicas`)."""
    from parley.protocols.keys import load_public_key, load_secret_key

    options = seat.options
    bus = BusConfig(heartbeat_interval=REPLICA_HEARTBEAT_S)
    secret_file = options.get("replicas_curve_key")
    clients = _client_keys(options.get("replicas_client_keys"))
    if secret_file:
        if not clients:
            raise ConfigError(
                "replicas_curve_key needs replicas_client_keys: the replicas' public key files"
            )
        public, secret = load_secret_key(secret_file)
        bus = BusConfig(
            heartbeat_interval=REPLICA_HEARTBEAT_S,
            curve_public_key=public,
            curve_secret_key=secret,
            curve_allowed_clients=tuple(load_public_key(c) for c in clients),
        )
    timeout = options.get("replicas_join_timeout", seat.join_timeout or JOIN_TIMEOUT)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError(f"replicas_join_timeout must be a positive number, got {timeout!r}")
    return BusReplicas(seat.seat, address, count, bus=bus, join_timeout=float(timeout))
