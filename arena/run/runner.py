"""The episode runner: plays a scenario with agents in seats, many episodes at once.

The runner owns one :class:`Endpoint` named ``"arena"`` bound at ``RunConfig.listen`` (a
private ``inproc://`` address by default); remote agents (``parley agent``) connect from
other processes or hosts and are waited for by name. In-process agents live in an
:class:`~parley.arena.run.agent_host.AgentHost` that the runner calls directly, through the
wire codec (:mod:`parley.arena.run.direct`: the same messages and failures without the bus
hops), or, with ``RunConfig.local_agents_over_bus``, on a second endpoint of the process.

Every seat is reached through the :class:`~parley.arena.run.seats.SeatTransport` chosen for
it when the runner opens: :class:`~parley.arena.run.seats.InProcessSeats` or
:class:`~parley.arena.run.seats.BusSeats` (batched frames included). Seats acting together
on one transport are asked in one call; in-process and remote seats in one step are all sent
before any is awaited. The runner itself keeps only what to do with the answers: retrying a
refusal, and the reason an episode failed (:mod:`parley.arena.run.asking`).

One step of one episode::

    acting = [seat for seat in env.agents if infos[seat].get("to_act", True)]
    send an Observation request to every acting seat      # all sent first (pipelined)
    gather the Actions                                    # then awaited together
    env.step({seat: action or "" for seat in env.agents})

An agent that times out, dies or raises ends its episode as *failed* with the reason
(never scored); the run goes on. The framework's own limits never fail an episode: the bus
bounds of the run (handlers, pending requests, high-water marks) are derived from
``concurrency x seats`` (:mod:`parley.arena.run.backpressure`), and a request a peer refuses as
``overloaded`` (retryable: the agent did not see it) is sent again with exponential backoff
until ``act_timeout`` runs out. The summary is folded record by record
(:class:`~parley.arena.run.summary.SummaryBuilder`): a run keeps no record once written,
unless asked to (``keep_records``). Seeds: task ``t`` is reset with
``derive_seed(run_seed, 0, t)``; the agent in seat ``i`` of trial ``r`` of task ``t`` with
``derive_seed(run_seed, 1, t, r, i)`` — so a run is reproducible and trials of one task see
the same scenario with fresh agent randomness. Output files: :mod:`parley.arena.run.records`
and ``arena/run/SCHEMA.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import fields
from typing import Any

import zmq.asyncio
from rich.console import Console

from parley.arena.run.agent_host import AGENT_ACCEPTS, AGENT_SEED_KEY, AgentHost
from parley.arena.run.agent_specs import (
    AgentSource,
    RemoteSeat,
    SeatContext,
    resolve_agent_spec,
    seat_specs,
)
from parley.arena.run.asking import EpisodeFailed, SeatAsking
from parley.arena.run.backpressure import bus_config_for
from parley.arena.run.config import RunConfig
from parley.arena.run.direct import DirectAgents, seeds_carried
from parley.arena.run.episode import (
    FROZEN_AFTER,
    EpisodeLog,
    EpisodePlan,
    derive_seed,
    plan_episodes,
)
from parley.arena.run.frames import FrameBatcher
from parley.arena.run.judge import ModelRewards
from parley.arena.run.peers import AbsentPeers
from parley.arena.run.process import PlayClock, frozen_heap
from parley.arena.run.progress import progress_bar
from parley.arena.run.records import EpisodeRecord, RecordWriter, RunResult
from parley.arena.run.seats import (
    ARENA_NAME,
    LOCAL_HOST_NAME,
    BusSeats,
    InProcessSeats,
    SeatTransport,
)
from parley.arena.run.security import (
    ARENA_ACCEPTS,
    SeatKeys,
    admission_policy,
    arena_bus_config,
    arena_endpoint_config,
)
from parley.arena.run.summary import SummaryBuilder, plain_json
from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.codec import Codec
from parley.protocols.errors import RequestTimeout
from parley.protocols.messages import Action, Observation
from parley.scenarios import spec as scenario_spec
from parley.scenarios.base import ORACLE_KEY, Scenario

__all__ = [
    "EpisodePlan",
    "RunResult",
    "Runner",
    "bus_config_for",
    "derive_seed",
    "plan_episodes",
    "run",
]

_NO_INFO: Mapping[str, Any] = {}


def _scenario(what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(...)``, a scenario hook; a scenario bug fails the episode, never the run."""
    try:
        return call(*args, **kwargs)
    except Exception as exc:
        raise EpisodeFailed(f"scenario_error: {what} raised {exc!r}") from exc


class Runner(SeatAsking):
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
    ``bus`` is used as given for the arena and the in-process agent host; without it the
    bounds come from :func:`bus_config_for`. ``keep_records`` makes :meth:`run` return
    every record (``RunResult.records``); without it memory stays flat over any length.
    """

    def __init__(
        self,
        config: RunConfig,
        *,
        agents: Mapping[str, AgentSource] | None = None,
        bus: BusConfig | None = None,
        console: Console | None = None,
        on_listen: Callable[[str], None] | None = None,
        keep_records: bool = False,
    ) -> None:
        self.config = config
        self.console = console or Console(stderr=True)
        self.on_listen = on_listen
        self.keep_records = keep_records
        self.rewards = ModelRewards(config)  # the judge and similarity components, if any
        probe = self.rewards.make_env(self.config)
        self.seats: list[str] = list(probe.possible_agents)
        probe.close()
        self.bus_config = bus or bus_config_for(config, len(self.seats))
        self._jitter = random.Random()  # backoff jitter only: never reaches an episode
        self.overloaded_retries = 0
        """Requests a peer refused as ``overloaded`` and this runner sent again."""
        self.specs = seat_specs(config.scenario, config.agents, self.seats)
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
                join_timeout=config.join_timeout,
            )
            self.sources[seat] = resolve_agent_spec(self.specs[seat], context)
        # Seats whose in-process agent class reads the scenario's privileged oracle data
        # (Scenario.oracle); remote seats never get it, whatever they claim.
        self._privileged = {
            seat
            for seat, source in self.sources.items()
            if not isinstance(source, RemoteSeat) and getattr(source, "privileged", False) is True
        }
        self._peers: dict[str, str] = {
            seat: source.peer if isinstance(source, RemoteSeat) else LOCAL_HOST_NAME
            for seat, source in self.sources.items()
        }
        # In-process seats asked directly (through the wire codec), not over the bus.
        self._in_process = frozenset(
            () if config.local_agents_over_bus else set(self.sources) - set(self._remote())
        )
        # How each seat is reached (open() chooses; None while closed), and the transport
        # every seat shares when there is one (the usual case: one call per step).
        self._transports: dict[str, SeatTransport] | None = None
        self._shared: SeatTransport | None = None
        self._local: InProcessSeats | None = None  # _shared, when every seat is in-process
        self._away_checks: list[SeatTransport] = []  # transports whose agents may be away
        self._keys = SeatKeys.load(config, self._remote())
        self.bus_config = arena_bus_config(self.bus_config, self._keys, insecure=config.insecure)
        self._absent = AbsentPeers(config.join_timeout, self.console)
        self.keep_steps = True
        """Records hold every step (transcript, trajectories' turns); :meth:`run` turns it
        off while no step is read (no ``out``, no ``keep_records``): only the summary is."""
        self.frozen_steps = False
        """Records keep each step's env dicts as their JSON (``EpisodeLog.frozen_steps``):
        :meth:`run` turns it on while only its records' writer reads the steps (``out``,
        no ``keep_records``, no judge)."""
        self._long_episodes = False  # the latest finished episode: over FROZEN_AFTER steps

    # ------------------------------------------------------------------ the run

    async def run(self) -> RunResult:
        """Play every planned episode and write the output files; returns the summary
        (and the records, with ``keep_records``)."""
        read = self.keep_records or self.rewards.judged  # (steps read by more than the writer)
        self.keep_steps = self.config.out is not None or read
        self.frozen_steps = self.config.out is not None and not read
        try:
            return await self._play_plans()
        finally:
            self.keep_steps, self.frozen_steps = True, False

    async def _play_plans(self) -> RunResult:
        plans = plan_episodes(self.config, self.seats)
        started = time.perf_counter()
        kept: list[EpisodeRecord] | None = [] if self.keep_records else None
        builder = SummaryBuilder(trials=self.config.trials)
        clock = PlayClock()
        async with self.open() as address:
            with RecordWriter(self.config.out) as writer, self._progress(len(plans)) as advance:
                todo = iter(plans)  # shared by the workers; nothing is copied per plan

                async def worker() -> None:
                    for plan in todo:
                        await asyncio.sleep(0)  # in-process episodes may never yield: signals
                        clock.start()
                        record = await self.play(plan)
                        clock.agents_s += record.agents_s
                        builder.add(record)
                        await writer.put(record)  # encoded and written by its thread
                        advance(record)
                        if kept is not None:
                            kept.append(record)

                workers = min(self.config.concurrency, len(plans))
                # The event loop's own CPU time (the records' writer thread is not in it).
                loop_cpu = time.thread_time()
                try:
                    await asyncio.gather(*(worker() for _ in range(workers)))
                    await writer.drain()  # a run's time includes writing its records
                except asyncio.CancelledError:  # SIGINT/SIGTERM: the files hold whole episodes
                    self.partial_summary = self._summary(
                        builder, time.perf_counter() - started, clock
                    )
                    self.partial_summary.update(partial=True, episodes_planned=len(plans))
                    writer.write_summary(self.partial_summary)
                    raise
                wall = time.perf_counter() - started
                summary = self._summary(builder, wall, clock, time.thread_time() - loop_cpu)
                writer.write_summary(summary)
        if kept is not None:
            kept.sort(key=lambda r: r.index)
        return RunResult(summary, address, wall, self.config.out, kept_records=kept)

    def _summary(
        self,
        builder: SummaryBuilder,
        wall: float,
        clock: PlayClock | None = None,
        loop_cpu_s: float | None = None,
    ) -> dict[str, Any]:
        summary: dict[str, Any] = builder.summary()
        summary["scenario"] = self.config.scenario
        summary["agents"] = dict(self.specs)
        # Not asdict(): it deep-copies, and agent_options may hold live objects (a pool).
        summary["config"] = plain_json(
            {f.name: getattr(self.config, f.name) for f in fields(self.config)}
        )
        steps = summary["agent_steps"]
        summary["timing"] = {
            "wall_s": round(wall, 3),
            "episodes_per_s": round(builder.total / wall, 3) if wall else None,
            "agent_steps_per_s": round(steps / wall, 1) if wall else None,
            "overloaded_retries": self.overloaded_retries,
        }
        if clock is not None:
            summary["timing"]["play_s"] = round(clock.play_s(), 6)
            summary["timing"]["play_cpu_s"] = round(clock.play_cpu_s(), 6)
            summary["timing"]["agents_s"] = round(clock.agents_s, 6)
        if loop_cpu_s is not None:
            summary["timing"]["play_loop_cpu_s"] = round(loop_cpu_s, 6)
        return summary

    def _expected_peers(self) -> dict[str, bytes | None]:
        """Peer name -> the CURVE key it must connect with (``None``: no key)."""
        seat_keys = self._keys.seats if self._keys is not None else {}
        return {
            self._peers[seat]: seat_keys.get(seat)
            for seat in self.seats
            if seat not in self._in_process  # no endpoint may take an in-process seat's name
        }

    def _remote(self) -> set[str]:
        return {seat for seat, source in self.sources.items() if isinstance(source, RemoteSeat)}

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[str]:
        """Bind the arena, host the in-process agents, wait for remote ones; yield the
        address agents connect to. :meth:`play` works only inside this context."""
        context = zmq.asyncio.Context()
        arena_bus = self.bus_config
        if self.config.batch_frames:  # the replies to batched frames come as `actions`
            arena_bus = arena_bus.accepting(ARENA_ACCEPTS | {"actions"})
        transports: list[SeatTransport] = []
        heap = frozen_heap()
        # Closed in reverse order of opening, each whatever the others raise (a second
        # Ctrl-C in one close still closes the sockets and the context).
        async with contextlib.AsyncExitStack() as closing:
            closing.callback(context.destroy, linger=0)
            closing.callback(heap.close)
            closing.callback(self._forget_transports)
            arena = Endpoint(ARENA_NAME, config=arena_endpoint_config(arena_bus), context=context)
            closing.push_async_callback(arena.close)
            arena.set_admission(admission_policy(self._expected_peers()))
            # In-process agents join over a private inproc address, before anything else
            # is bound: no remote peer can race them for their name.
            inproc = await arena.bind(f"inproc://parley-arena-{uuid.uuid4().hex}")
            local = {
                seat: source
                for seat, source in self.sources.items()
                if not isinstance(source, RemoteSeat)
            }
            if local and self._in_process:
                codec = Codec(max_message_bytes=self.bus_config.max_message_bytes)
                direct = DirectAgents(AgentHost(None, local), codec, name=LOCAL_HOST_NAME)
                transports.append(InProcessSeats(direct))
                closing.push_async_callback(transports[-1].close)
            elif local:
                own = dataclasses.replace(self.bus_config, accept=AGENT_ACCEPTS)
                host_endpoint = Endpoint(LOCAL_HOST_NAME, config=own, context=context)
                closing.push_async_callback(host_endpoint.close)
                host = AgentHost(host_endpoint, local)  # the in-process agents over the bus
                closing.push_async_callback(host.close)
                await host_endpoint.connect(inproc)
            over_bus = {s: peer for s, peer in self._peers.items() if s not in self._in_process}
            if over_bus:
                batched = self.config.batch_frames and bool(self._remote())
                bus = BusSeats(
                    arena,
                    over_bus,
                    scenario=self.config.scenario,
                    absent=self._absent,
                    frames=FrameBatcher(arena) if batched else None,
                )
                transports.append(bus)
                closing.push_async_callback(bus.close)  # (its batched frames first)
            self._transports = {
                seat: transport for transport in transports for seat in transport.seats
            }
            self._shared = transports[0] if len(transports) == 1 else None
            if isinstance(self._shared, InProcessSeats):
                self._local = self._shared
            self._away_checks = [transport for transport in transports if transport.remote]
            address = await arena.bind(self.config.listen) if self.config.listen else inproc
            if self.on_listen is not None:
                self.on_listen(address)
            # Give remote agents join_timeout to arrive before the first episode, so that
            # joining is not timed as play; one that never comes fails its episodes.
            for peer in sorted({self._peers[seat] for seat in self._remote()}):
                with contextlib.suppress(RequestTimeout):
                    await self._absent.wait_for(arena, peer)
            yield address

    def _forget_transports(self) -> None:
        self._transports, self._shared, self._away_checks = None, None, []
        self._local = None

    def _progress(self, total: int) -> contextlib.AbstractContextManager[Any]:
        return progress_bar(self.console, self.config.scenario, total, enabled=self.config.progress)

    # ------------------------------------------------------------------ one episode

    async def play(self, plan: EpisodePlan) -> EpisodeRecord:
        """Play one planned episode to its end (or its failure) and return its record.

        Call it inside :meth:`open`; ``plan.agent_seeds`` must name every seat. Episodes
        played at the same time need distinct ``(task, trial)`` pairs (the episode id).
        """
        started = time.perf_counter()
        env = self.rewards.make_env(self.config)
        episode = EpisodeLog(plan, self.config.scenario, self.seats, self.specs)
        episode.copy_steps = type(env).step is not Scenario.step  # (Scenario's are fresh)
        episode.keep_steps, episode.frozen_steps = self.keep_steps, self.frozen_steps
        episode.frozen_after = 0 if self._long_episodes else FROZEN_AFTER
        asked: set[str] = set()
        try:
            await self._play(env, episode, asked)
        except EpisodeFailed as exc:
            episode.failed = str(exc)
        else:
            self._long_episodes = episode.steps_played > FROZEN_AFTER
        finally:
            await self._notify_end(episode, asked)
            env.close()
        record = await self.rewards.judged_record(episode.record())
        record.wall_s = time.perf_counter() - started
        return record

    async def _play(self, env: Any, episode: EpisodeLog, asked: set[str]) -> None:
        plan = episode.plan
        observations, infos = _scenario("reset", env.reset, seed=plan.seed)
        rewards: dict[str, float] = {}
        turn = 0
        blocking = bool(getattr(env, "metadata", {}).get("blocking_step", False))
        # Hot path (every step): lookups hoisted; one pass over the live seats.
        scenario, seeds, max_steps = self.config.scenario, plan.agent_seeds, self.config.max_steps
        episode_id, clock, step_env = plan.episode_id, time.perf_counter, env.step
        # Every seat in-process and pipelined (and none privileged: the oracle goes in the
        # info after the seed): the seeds go beside the requests, and DirectAgents sets each
        # in its agent's copy as if sent in it (no dict per seat and step to merge, encode
        # and decode). A seed the wire cannot carry goes in, to fail as over the bus.
        beside = bool(self._local and self.config.pipeline and not self._privileged)
        beside = beside and seeds_carried(seeds)
        given = seeds if beside else None
        n_seats = len(self.seats)
        while env.agents:
            if turn >= max_steps:
                raise EpisodeFailed(f"max_steps: no end after {turn} steps")
            requests: dict[str, Observation] = {}
            for seat in env.agents:
                info = infos.get(seat, _NO_INFO)
                if info.get("to_act", True):
                    requests[seat] = Observation(
                        agent=seat,
                        text=observations.get(seat, ""),
                        scenario=scenario,
                        reward=rewards.get(seat, 0.0),
                        info=info if beside else {**info, AGENT_SEED_KEY: seeds[seat]},
                    )
            if self._privileged:
                for seat in self._privileged.intersection(requests):
                    requests[seat].info[ORACLE_KEY] = _scenario("oracle", env.oracle, seat)
            if len(asked) < n_seats:  # (once every seat was asked, none is new)
                asked.update(requests)
            asked_at = clock()
            local = self._local
            if given is not None and local is not None:
                # Every seat in-process (see `beside`): DirectAgents.ask_all's two halves
                # called here, each act run to its first suspension on this thread (a
                # scripted agent's to its answer), those that suspended then awaited: the
                # same copies, sends and waits, without a coroutine and the transport's
                # calls per step (issue 33 §5).
                results, waiting = local.direct.start_all(
                    list(requests.values()), episode=episode_id, sender=ARENA_NAME, seeds=given
                )
                if waiting:
                    await local.direct.finish(waiting, results, self.config.act_timeout)
            else:
                results = await self._ask(requests, episode_id, turn, given)
            # Each result an Action, its text for env.step (in env.agents' order: requests
            # was built in it); otherwise every action as _retry gives it.
            actions: dict[str, Action] = {}
            full: dict[str, str] = {}
            for seat, result in zip(requests, results, strict=True):
                if type(result) is not Action:  # the episode fails, or they are asked again
                    actions = await self._retry(
                        requests, results, asked_at, episode_id, turn, given
                    )
                    full = {}  # (seats asked again come last: rebuilt below)
                    break
                actions[seat] = result
                full[seat] = result.text
            episode.agents_s += clock() - asked_at
            if len(full) != len(env.agents):  # seats that sit out (or asked again) say ""
                full = {seat: actions[seat].text if seat in actions else "" for seat in env.agents}
            if blocking:  # its step runs subprocesses: keep other episodes going meanwhile
                step = await asyncio.to_thread(_scenario, "step", step_env, full)
            else:
                try:
                    step = step_env(full)
                except Exception as exc:  # (what _scenario does, without a call per step)
                    raise EpisodeFailed(f"scenario_error: step raised {exc!r}") from exc
            episode.add_step(turn, requests, actions, *step)
            observations, rewards, _, _, infos = step
            turn += 1
        episode.metrics = dict(_scenario("episode_metrics", env.episode_metrics))

    async def _notify_end(self, episode: EpisodeLog, asked: set[str]) -> None:
        """Tell every seat that was asked something that its episode is over (one-way)."""
        transports = self._transports
        if transports is None:
            return
        failed = episode.failed or None
        local = self._local
        if local is not None:  # every seat in-process: ended now, no coroutine per seat
            for seat in sorted(asked):
                local.direct.end_now(episode.plan.episode_id, seat, failed)
            return
        for seat in sorted(asked):
            await transports[seat].end(episode.plan.episode_id, seat, failed)


def _baseline(scenario: str, seat: str) -> str:
    """The seat's registered scripted baseline (``"*"`` covers unnamed seats), or ""."""
    baselines = scenario_spec(scenario).baselines
    return str(baselines.get(seat, baselines.get("*", "")))


def run(config: RunConfig, **kwargs: Any) -> RunResult:
    """Play ``config`` to the end in a fresh event loop (``Runner(config, **kwargs).run()``)."""
    return asyncio.run(Runner(config, **kwargs).run())
