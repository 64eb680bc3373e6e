"""The episode runner: plays a scenario with agents in seats, many episodes at once.

Every agent is reached through the bus. The runner owns one :class:`Endpoint` named
``"arena"`` bound at ``RunConfig.listen`` (a private ``inproc://`` address by default).
In-process agents live in an :class:`~parley.arena.run.agent_host.AgentHost` on a second
endpoint of the same process that connects to it; remote agents (``parley agent``) connect
from other processes or hosts and are waited for by name.

One step of one episode::

    acting = [seat for seat in env.agents if infos[seat].get("to_act", True)]
    send an Observation request to every acting seat      # all sent first (pipelined)
    gather the Actions                                    # then awaited together
    env.step({seat: action or "" for seat in env.agents})

An agent that times out, dies or raises ends its episode as *failed* with the reason
(never scored); the run goes on. Seeds: task ``t`` is reset with
``derive_seed(run_seed, 0, t)``; the agent in seat ``i`` of trial ``r`` of task ``t`` with
``derive_seed(run_seed, 1, t, r, i)`` — so a run is reproducible and trials of one task see
the same scenario with fresh agent randomness. Output files: :mod:`parley.arena.run.records`
and ``arena/run/SCHEMA.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import zmq.asyncio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from parley.arena.run.agent_host import AGENT_SEED_KEY, FAILED_KEY, AgentHost
from parley.arena.run.agent_specs import (
    AgentFactory,
    AgentSource,
    RemoteSeat,
    SeatContext,
    resolve_agent_spec,
)
from parley.arena.run.config import RunConfig
from parley.arena.run.episode import EpisodeLog, EpisodePlan, derive_seed, plan_episodes
from parley.arena.run.gather import send_all_then_gather
from parley.arena.run.records import EpisodeRecord, RecordWriter
from parley.arena.run.summary import summarize
from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import (
    BusError,
    ConfigError,
    PeerDead,
    ProtocolError,
    RemoteError,
    RequestTimeout,
)
from parley.protocols.messages import Action, Body, Observation
from parley.scenarios import make
from parley.scenarios import spec as scenario_spec

__all__ = ["EpisodePlan", "RunResult", "Runner", "derive_seed", "plan_episodes", "run"]

ARENA_NAME = "arena"
"""Bus name of the runner's endpoint."""
LOCAL_HOST_NAME = "arena-agents"
"""Bus name of the endpoint hosting the run's in-process agents."""


@dataclass
class RunResult:
    """What :meth:`Runner.run` returns: every episode record and the summary mapping."""

    records: list[EpisodeRecord]
    summary: dict[str, Any]
    endpoint: str
    wall_s: float
    out: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)


class _EpisodeFailed(Exception):
    """Internal: ends an episode early; ``str(exc)`` is the recorded reason."""


class Runner:
    """Plays the episodes of one :class:`RunConfig`.

    :meth:`run` plays the whole plan and writes the files. To drive episodes yourself (a
    sampler that keeps episodes running), open the bus and play plans one by one, as many
    at once as you like::

        runner = Runner(config)
        async with runner.open() as address:
            record = await runner.play(EpisodePlan(0, task=0, trial=0, seed=7,
                                                   agent_seeds={"a": 1, "b": 2}))

    ``agents`` (seat -> factory or :class:`RemoteSeat`) overrides the config's specs for
    the seats it names, for programmatic use. ``on_listen`` is called with the arena's
    bound address before any episode starts (the CLI prints it for remote agents).
    """

    def __init__(
        self,
        config: RunConfig,
        *,
        agents: Mapping[str, AgentSource] | None = None,
        bus: BusConfig | None = None,
        console: Console | None = None,
        on_listen: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.bus_config = bus or BusConfig()
        self.console = console or Console(stderr=True)
        self.on_listen = on_listen
        probe = make(config.scenario, **config.scenario_kwargs)
        self.seats: list[str] = list(probe.possible_agents)
        probe.close()
        self.specs = _seat_specs(config, self.seats)
        self.sources: dict[str, AgentSource] = {}
        for seat in self.seats:
            if agents is not None and seat in agents:
                self.sources[seat] = agents[seat]
                continue
            context = SeatContext(
                scenario=config.scenario,
                seat=seat,
                baseline=_baseline(config.scenario, seat),
                options=config.agent_options,
            )
            self.sources[seat] = resolve_agent_spec(self.specs[seat], context)
        self._peers: dict[str, str] = {}
        self._arena: Endpoint | None = None

    # ------------------------------------------------------------------ the run

    async def run(self) -> RunResult:
        """Play every planned episode and write the output files; returns the records."""
        plans = plan_episodes(self.config, self.seats)
        started = time.perf_counter()
        records: list[EpisodeRecord] = []
        async with self.open() as address:
            with RecordWriter(self.config.out) as writer, self._progress(len(plans)) as advance:
                queue: asyncio.Queue[EpisodePlan] = asyncio.Queue()
                for plan in plans:
                    queue.put_nowait(plan)

                async def worker() -> None:
                    while not queue.empty():
                        record = await self.play(queue.get_nowait())
                        records.append(record)
                        writer.add(record)
                        advance(record)

                workers = min(self.config.concurrency, len(plans))
                await asyncio.gather(*(worker() for _ in range(workers)))
                records.sort(key=lambda r: r.index)
                wall = time.perf_counter() - started
                summary = self._summary(records, wall)
                writer.write_summary(summary)
        return RunResult(records, summary, address, wall, self.config.out)

    def _summary(self, records: list[EpisodeRecord], wall: float) -> dict[str, Any]:
        summary: dict[str, Any] = summarize(records, trials=self.config.trials)
        summary["scenario"] = self.config.scenario
        summary["agents"] = dict(self.specs)
        # Not asdict(): it deep-copies, and agent_options may hold live objects (a pool).
        summary["config"] = _plain(
            {f.name: getattr(self.config, f.name) for f in fields(self.config)}
        )
        steps = summary["agent_steps"]
        summary["timing"] = {
            "wall_s": round(wall, 3),
            "episodes_per_s": round(len(records) / wall, 3) if wall else None,
            "agent_steps_per_s": round(steps / wall, 1) if wall else None,
        }
        return summary

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[str]:
        """Bind the arena, host the in-process agents, wait for remote ones; yield the
        address agents connect to. :meth:`play` works only inside this context."""
        context = zmq.asyncio.Context()
        arena = Endpoint(ARENA_NAME, config=self.bus_config, context=context)
        host_endpoint: Endpoint | None = None
        host: AgentHost | None = None
        try:
            # In-process agents join over a private inproc address, whatever else is bound.
            inproc = await arena.bind(f"inproc://parley-arena-{uuid.uuid4().hex}")
            address = await arena.bind(self.config.listen) if self.config.listen else inproc
            self._arena = arena
            local: dict[str, AgentFactory] = {}
            for seat, source in self.sources.items():
                if isinstance(source, RemoteSeat):
                    self._peers[seat] = source.peer
                else:
                    local[seat] = source
                    self._peers[seat] = LOCAL_HOST_NAME
            if local:
                host_endpoint = Endpoint(LOCAL_HOST_NAME, config=self.bus_config, context=context)
                host = AgentHost(host_endpoint, local)
                await host_endpoint.connect(inproc)
            if self.on_listen is not None:
                self.on_listen(address)
            # Give remote agents join_timeout to arrive before the first episode, so that
            # joining is not timed as play; one that never comes fails its episodes.
            for peer in sorted(set(self._peers.values()) - {LOCAL_HOST_NAME}):
                with contextlib.suppress(RequestTimeout):
                    await arena.wait_for_peer(peer, timeout=self.config.join_timeout)
            yield address
        finally:
            self._arena = None
            if host is not None:
                await host.close()
            if host_endpoint is not None:
                await host_endpoint.close()
            await arena.close()
            context.destroy(linger=0)

    @contextlib.contextmanager
    def _progress(self, total: int) -> Any:
        if not self.config.progress:
            yield lambda record: None
            return
        columns = (
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("failed {task.fields[failed]}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=self.console, transient=False) as progress:
            task = progress.add_task(self.config.scenario, total=total, failed=0)
            failed = 0

            def advance(record: EpisodeRecord) -> None:
                nonlocal failed
                failed += bool(record.failed)
                progress.update(task, advance=1, failed=failed)

            yield advance

    # ------------------------------------------------------------------ one episode

    async def play(self, plan: EpisodePlan) -> EpisodeRecord:
        """Play one planned episode to its end (or its failure) and return its record.

        Call it inside :meth:`open`; ``plan.agent_seeds`` must name every seat. Episodes
        played at the same time need distinct ``(task, trial)`` pairs (the episode id).
        """
        started = time.perf_counter()
        env = make(self.config.scenario, **self.config.scenario_kwargs)
        episode = EpisodeLog(plan, self.config.scenario, self.seats, self.specs)
        asked: set[str] = set()
        try:
            await self._play(env, episode, asked)
        except _EpisodeFailed as exc:
            episode.failed = str(exc)
        finally:
            await self._notify_end(episode, asked)
            env.close()
        record = episode.record()
        record.wall_s = time.perf_counter() - started
        return record

    async def _play(self, env: Any, episode: EpisodeLog, asked: set[str]) -> None:
        plan = episode.plan
        try:
            observations, infos = env.reset(seed=plan.seed)
        except Exception as exc:  # a scenario bug: record it, keep the run going
            raise _EpisodeFailed(f"scenario_error: reset raised {exc!r}") from exc
        rewards: dict[str, float] = {}
        turn = 0
        while env.agents:
            if turn >= self.config.max_steps:
                raise _EpisodeFailed(f"max_steps: no end after {turn} steps")
            acting = [a for a in env.agents if infos.get(a, {}).get("to_act", True)]
            requests = {
                seat: Observation(
                    agent=seat,
                    text=observations.get(seat, ""),
                    scenario=self.config.scenario,
                    reward=rewards.get(seat, 0.0),
                    info={**infos.get(seat, {}), AGENT_SEED_KEY: plan.agent_seeds[seat]},
                )
                for seat in acting
            }
            asked.update(acting)
            asked_at = time.perf_counter()
            actions = await self._ask(requests, plan.episode_id, turn)
            episode.agents_s += time.perf_counter() - asked_at
            full = {seat: actions[seat].text if seat in actions else "" for seat in env.agents}
            try:
                step = env.step(full)
            except Exception as exc:  # a scenario bug: record it, keep the run going
                raise _EpisodeFailed(f"scenario_error: step raised {exc!r}") from exc
            episode.add_step(turn, observations, actions, *step)
            observations, rewards, _, _, infos = step
            turn += 1
        episode.metrics = dict(env.episode_metrics())

    async def _ask(
        self, requests: Mapping[str, Observation], episode: str, turn: int
    ) -> dict[str, Action]:
        """Every acting seat's action; raises :class:`_EpisodeFailed` naming a failure."""
        arena = self._arena
        if arena is None:
            raise BusError("the runner's bus is not open: play episodes inside Runner.open()")
        seats = list(requests)
        peers, timeout = self._peers, self.config.act_timeout
        # One look at the peer list per step (it is built on every read), not one per seat.
        live = arena.peers
        missing = [seat for seat in seats if peers[seat] not in live]
        if missing:
            await self._join(arena, missing)
        results: list[Body | BaseException] = []
        if self.config.pipeline:
            # Every request goes out before any reply is awaited (no task per request).
            results = await send_all_then_gather(
                [
                    arena.request(
                        peers[seat], requests[seat], timeout=timeout, episode=episode, turn=turn
                    )
                    for seat in seats
                ]
            )
        else:
            for seat in seats:
                try:
                    reply = await arena.request(
                        peers[seat], requests[seat], timeout=timeout, episode=episode, turn=turn
                    )
                except (BusError, ProtocolError) as exc:
                    results.append(exc)
                    break  # the episode has failed: ask nobody else
                results.append(reply)
                if not isinstance(reply, Action):
                    break
        actions: dict[str, Action] = {}
        failures = []
        for seat, result in zip(seats, results, strict=False):
            if isinstance(result, Action):
                actions[seat] = result
            else:
                failures.append(_failure(seat, result))
        if failures:
            raise _EpisodeFailed("; ".join(failures))
        return actions

    async def _join(self, arena: Endpoint, seats: Sequence[str]) -> None:
        """Wait up to ``join_timeout`` for the peers of ``seats`` (remote seats join late);
        raises :class:`_EpisodeFailed` naming every seat whose peer did not come."""
        peers = sorted({self._peers[seat] for seat in seats})
        waits = [arena.wait_for_peer(peer, timeout=self.config.join_timeout) for peer in peers]
        outcomes = await asyncio.gather(*waits, return_exceptions=True)
        absent: dict[str, BaseException] = {}
        for peer, outcome in zip(peers, outcomes, strict=True):
            if isinstance(outcome, RequestTimeout):
                absent[peer] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
        if absent:
            raise _EpisodeFailed(
                "; ".join(
                    f"{seat}: not_joined: {absent[self._peers[seat]]}"
                    for seat in seats
                    if self._peers[seat] in absent
                )
            )

    async def _notify_end(self, episode: EpisodeLog, asked: set[str]) -> None:
        """Tell every seat that was asked something that its episode is over (one-way)."""
        arena = self._arena
        if arena is None:
            return
        for seat in sorted(asked):
            peer = self._peers[seat]
            if peer not in arena.peers:
                continue
            info: dict[str, Any] = {FAILED_KEY: episode.failed} if episode.failed else {}
            body = Observation(
                agent=seat,
                text="The episode is over.",
                scenario=self.config.scenario,
                terminated=True,
                info=info,
            )
            # A peer that died between the check and the send cannot be told; that is fine.
            with contextlib.suppress(BusError):
                await arena.send(peer, body, episode=episode.plan.episode_id)


def _failure(seat: str, result: object) -> str:
    """The recorded reason of a request that did not bring an action back.

    Bus and protocol failures (and a reply that is not an action) fail the episode; any
    other exception is a runner bug and is raised.
    """
    if isinstance(result, RequestTimeout):
        return f"{seat}: timeout: {result}"
    if isinstance(result, PeerDead):
        return f"{seat}: peer_dead: {result}"
    if isinstance(result, RemoteError):
        return f"{seat}: agent_error: {result.remote_message}"
    if isinstance(result, BusError):
        return f"{seat}: bus_error: {result}"
    if isinstance(result, ProtocolError):  # e.g. infos holding a value msgpack cannot carry
        return f"{seat}: protocol_error: {result}"
    if isinstance(result, BaseException):
        raise result
    return f"{seat}: bad_reply: expected an action, got {type(result)}"


def _seat_specs(config: RunConfig, seats: Sequence[str]) -> dict[str, str]:
    """The agent spec of every seat: config list (seat order) or mapping; default scripted."""
    agents = config.agents
    if agents is None:
        return dict.fromkeys(seats, "scripted")
    if isinstance(agents, list):
        if len(agents) != len(seats):
            raise ConfigError(
                f"{config.scenario} has {len(seats)} seats {seats}; got {len(agents)} agent "
                "specs (give one per seat, in that order, or a mapping seat: spec)"
            )
        return dict(zip(seats, agents, strict=True))
    unknown = sorted(set(agents) - set(seats))
    if unknown:
        raise ConfigError(f"{config.scenario} has no seats {unknown}; its seats are {seats}")
    return {seat: agents.get(seat, "scripted") for seat in seats}


def _baseline(scenario: str, seat: str) -> str:
    """The seat's registered scripted baseline (``"*"`` covers unnamed seats), or ""."""
    baselines = scenario_spec(scenario).baselines
    return str(baselines.get(seat, baselines.get("*", "")))


def _plain(value: Any) -> Any:
    """``value`` with anything JSON cannot hold (a pool object in agent_options) as repr."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def run(config: RunConfig, **kwargs: Any) -> RunResult:
    """Play ``config`` to the end in a fresh event loop (``Runner(config, **kwargs).run()``)."""
    return asyncio.run(Runner(config, **kwargs).run())
