"""Scenario step cost beside a bare ParallelEnv, the runner's overhead, and TextArena.

In one run, with N = 8 agents that all act every step and broadcast one line each:

* ``env_step_ratio_vs_bare`` — steps/s of a scenario built on parley's
  :class:`~parley.scenarios.Scenario` machinery (action checks, invalid-move bookkeeping,
  per-component rewards, infos, event log, ``say`` routing) over steps/s of a bare
  ``pettingzoo.ParallelEnv`` that does the same message routing and nothing else
  (target >= 0.8);
* ``pipelined_ratio_vs_sequential`` — the runner playing that scenario, one episode at a
  time, with the 8 scripted agents in another process over ``ipc://`` (every request a real
  bus hop): agent round trips per second of round-trip time (the runner's time waiting for
  actions) when all 8 observations of a step are sent before gathering, over the same run
  asking one agent at a time (``RunConfig.pipeline = False``); target >= 3.
  ``pipelined_episode_ratio_vs_sequential`` is the same over play time (scenario steps and
  bookkeeping included); the ``_inproc`` variants host the agents in the runner's own
  process, which asks them directly (no bus hop, only the messages' copies: there is little
  left for pipelining to hide).

The runner's own overhead, on two workloads, ``--concurrency`` episodes at once, each case
interleaved with a plain Python loop that steps the same env and awaits the same agents'
``act`` directly (no runner, no records, no copies):

* ``runner_ratio_vs_plain_loop`` — agent steps/s of the runner (play time: binding and
  joining excluded) with the agents in its own process over the plain loop's (target
  >= 0.7); ``remote_ratio_vs_plain_loop`` — the same with the agents in another process over
  ``ipc://`` (target >= 0.3). On the 8-seat broadcast the plain loop costs ~2 µs an agent
  step (scenario step included): what the runner must do per step — the observation's
  wire copy, the transcript and trajectories, the failure handling — weighs against almost
  nothing;
* the same with the suffix ``_simple_trade``: ``negotiation/simple-trade-v1`` with its
  scripted baselines (the workload issue 11 measured), one seat acting a step;
* ``remote_batched_ratio_vs_plain_loop`` — ``remote_ratio_vs_plain_loop`` with batched
  frames (``RunConfig.batch_frames``: one message to the agents' process carries every
  episode's observations for its seats, one message comes back; target >= 0.5 on the
  broadcast);
* ``runner_out_ratio_vs_runner`` — the in-process runner writing its records (``--out``, to
  a temporary directory) over the same runner without: agent steps per CPU second of the
  thread running the event loop (the summary's ``play_loop_cpu_s``; target >= 0.8). The
  records are encoded and written by :class:`~parley.arena.run.records.RecordWriter`'s own
  thread, which also builds the transcript's steps and the trajectories' turns from what the
  loop kept of each step (its texts and the env's dicts);
  ``runner_out_process_cpu_ratio_vs_runner`` is the same over the whole process's CPU, that
  thread included (the work moved, not removed: it still costs CPU, on a core the loop does
  not wait for);
* beside each, the plain loop doing only what the runner cannot skip
  (:mod:`~parley.arena.bench.floors`): ``copy_floor_ratio_vs_plain_loop`` (every
  observation a bare msgpack round trip, CPU time: a ceiling for ``runner_ratio_*``) and
  ``raw_pyzmq_ratio_vs_plain_loop`` (every ``act`` a raw pyzmq round trip to another
  process, wall clock: the transport alone, beside ``remote_ratio_*``);
  ``runner_ratio_vs_copy_floor`` is the runner's over the copy floor's (target >= 0.85).

And simple-trade v0/v1 env steps/s beside TextArena 0.7.4's SimpleNegotiation with the
same trivial moves, and with every move a text that never recurs (``_distinct_moves``, as a
model's moves would be); target >= 1 for both (:mod:`parley.arena.bench.textarena`; skipped,
with the line that installs it, when TextArena is missing).

Timings are the best of ``--repeats`` (env steps and TextArena: of ``--repeats`` x 10
short runs, :func:`~parley.arena.bench.textarena.best_rates`), the variants of each pair
interleaved, in CPU time of this process where everything runs in it (env steps, the plain
loop, the runner with in-process agents: its summary's ``play_cpu_s``; a loaded machine
slows the wall clock of both sides unevenly, not the CPU each needs) and in wall-clock time
where agents run in another process (``remote_*``, pipelining over ipc; the plain loop's
wall clock is then the reference). ``--json`` prints one object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec
import numpy as np
from pettingzoo import ParallelEnv

from parley.agents.base import Agent
from parley.arena.bench.floors import ipc_address, raw_pyzmq_steps_per_s
from parley.arena.bench.textarena import best_rates
from parley.protocols.messages import Action, Observation
from parley.scenarios import Scenario, register

__all__ = ["add_arguments", "run"]

SCENARIO_ID = "bench/broadcast-v0"
TRADE_ID = "negotiation/simple-trade-v1"
N_AGENTS = 8
TARGETS = {
    "env_step_ratio_vs_bare": (">=", 0.8),
    "pipelined_ratio_vs_sequential": (">=", 3.0),
    "runner_ratio_vs_plain_loop": (">=", 0.7),
    "remote_ratio_vs_plain_loop": (">=", 0.3),
    "runner_ratio_vs_plain_loop_simple_trade": (">=", 0.7),
    "remote_ratio_vs_plain_loop_simple_trade": (">=", 0.3),
    "runner_out_ratio_vs_runner": (">=", 0.8),
    "runner_ratio_vs_copy_floor": (">=", 0.85),
    "runner_ratio_vs_copy_floor_simple_trade": (">=", 0.85),
    "remote_batched_ratio_vs_plain_loop": (">=", 0.5),
    "runner_out_ratio_vs_runner_simple_trade": (">=", 0.8),
    "simple_trade_v0_ratio_vs_textarena": (">=", 1.0),
    "simple_trade_v1_ratio_vs_textarena": (">=", 1.0),
    "simple_trade_v0_ratio_vs_textarena_distinct_moves": (">=", 1.0),
    "simple_trade_v1_ratio_vs_textarena_distinct_moves": (">=", 1.0),
}

# The reference loop of each runner ratio (the same key with the same workload suffix):
# the plain loop doing only what the contract requires (:mod:`parley.arena.bench.floors`).
REFERENCES = {
    "runner_ratio_vs_plain_loop": "copy_floor_ratio_vs_plain_loop",
    "remote_ratio_vs_plain_loop": "raw_pyzmq_ratio_vs_plain_loop",
    "remote_batched_ratio_vs_plain_loop": "raw_pyzmq_ratio_vs_plain_loop",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agents", type=int, default=N_AGENTS, help="agents per episode")
    parser.add_argument("--steps", type=int, default=50, help="steps per episode")
    parser.add_argument("--env-episodes", type=int, default=200, help="episodes per env case")
    parser.add_argument("--episodes", type=int, default=20, help="episodes per runner case")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")
    parser.add_argument("--no-inproc", action="store_true", help="skip the in-process case")
    parser.add_argument(
        "--trade-episodes", type=int, default=1000, help="simple-trade episodes per runner case"
    )
    parser.add_argument(
        "--concurrency", type=int, default=8, help="episodes at once in the overhead cases"
    )
    parser.add_argument(
        "--ta-episodes", type=int, default=200, help="episodes per TextArena comparison case"
    )
    parser.add_argument("--no-textarena", action="store_true", help="skip the TextArena comparison")


# --- the two envs: same routing, with and without parley's scenario machinery --------------


class Broadcast(Scenario):
    """Every seat acts every step; each action goes to every other seat's next observation."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": SCENARIO_ID,
        "render_modes": ["ansi"],
        "is_parallelizable": True,
    }
    new_episode_draws = False  # (see new_episode)

    def __init__(self, n_agents: int = N_AGENTS, steps: int = 50, **kwargs: Any) -> None:
        super().__init__([f"agent_{i}" for i in range(n_agents)], **kwargs)
        self.steps = steps

    def new_episode(self, rng: np.random.Generator) -> None:
        """Nothing to draw: the bench measures routing, not rules."""

    def acting(self) -> Sequence[str]:
        return list(self.agents)

    def play(self, agent: str, action: str) -> str | None:
        self.say(agent, action)
        return None

    def resolve(self) -> None:
        if self.turn + 1 >= self.steps:
            self.finish()

    def system_prompt(self, agent: str) -> str:
        return "Say one line to everyone."


class BareBroadcast(ParallelEnv[str, str, str]):  # type: ignore[misc]  # pettingzoo is untyped
    """The same routing as :class:`Broadcast` with plain dicts: the reference path."""

    metadata: ClassVar[dict[str, Any]] = {"name": "bare-broadcast", "render_modes": []}

    def __init__(self, n_agents: int = N_AGENTS, steps: int = 50) -> None:
        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        self.agents: list[str] = []
        self.steps = steps

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        self.agents = list(self.possible_agents)
        self.turn = 0
        self.inbox: dict[str, list[str]] = {a: [] for a in self.agents}
        return dict.fromkeys(self.agents, "Your move."), {a: {"to_act": True} for a in self.agents}

    def step(self, actions: dict[str, str]) -> tuple[Any, Any, Any, Any, Any]:
        for sender in self.agents:
            line = f"{sender}: {actions[sender]}"
            for agent in self.agents:
                if agent != sender:
                    self.inbox[agent].append(line)
        self.turn += 1
        done = self.turn >= self.steps
        observations = {}
        for agent in self.agents:
            observations[agent] = "\n".join(self.inbox[agent])
            self.inbox[agent] = []
        rewards = dict.fromkeys(self.agents, 0.0)
        terminations = dict.fromkeys(self.agents, done)
        truncations = dict.fromkeys(self.agents, False)
        infos = {a: {"to_act": not done} for a in self.agents}
        if done:
            self.agents = []
        return observations, rewards, terminations, truncations, infos


class Chatter(Agent):
    """Says one fixed-shape line per turn (what a scripted agent costs, roughly nothing)."""

    async def act(self, observation: Observation) -> Action:
        return Action(agent=observation.agent, text=f"hello from {observation.agent}")


def _register() -> None:
    register(
        SCENARIO_ID,
        "parley.arena.bench.env:Broadcast",
        baselines={"*": "parley.arena.bench.env:Chatter"},
        description="bench: N seats broadcasting one line each step",
        override=True,
    )


# --- (a) env steps/s ------------------------------------------------------------------------


def _env_steps_per_s(make_env: Callable[[], Any], episodes: int) -> float:
    env = make_env()
    lines = {a: f"hello from {a}" for a in env.possible_agents}
    steps = 0
    started = time.process_time()
    for episode in range(episodes):
        env.reset(seed=episode)
        while env.agents:
            env.step(lines)
            steps += 1
    return steps / (time.process_time() - started)


# --- (b) the plain loop: the same agents called directly, no runner, no bus ----------------


@dataclass(frozen=True)
class Workload:
    """A scenario and the agents of its seats (``module:Class`` paths, for a child process)."""

    name: str
    scenario: str
    kwargs: dict[str, Any]
    agents: dict[str, str]
    episodes: int

    def factories(self) -> dict[str, Any]:
        from parley.arena.run.agent_specs import load_object

        return {seat: load_object(path) for seat, path in self.agents.items()}


def _workloads(args: argparse.Namespace) -> list[Workload]:
    """Broadcast (8 seats, nothing to amortise the runner over: pure overhead) and the
    issue's workload, simple-trade-v1 with its scripted baselines (one seat acts a step)."""
    seats = [f"agent_{i}" for i in range(args.agents)]
    broadcast = Workload(
        "broadcast",
        SCENARIO_ID,
        {"n_agents": args.agents, "steps": args.steps},
        dict.fromkeys(seats, "parley.arena.bench.env:Chatter"),
        args.episodes,
    )
    trader = "parley.agents.scripted.negotiation:SpiralTrader"
    trade = Workload(
        "simple_trade",
        TRADE_ID,
        {},
        {"player_0": trader, "player_1": trader},
        args.trade_episodes,
    )
    return [broadcast, trade]


def _plain_loop_steps_per_s(work: Workload, *, copy: bool = False) -> tuple[float, float]:
    """Agent steps per CPU second and per wall-clock second of ``env.step`` fed by
    awaiting each acting agent's ``act`` in turn; with ``copy``, each agent gets a bare
    msgpack round trip of its observation (the copy floor, :mod:`~parley.arena.bench.floors`)."""
    from parley.scenarios import make

    factories = work.factories()
    encode = msgspec.msgpack.Encoder().encode
    decode = msgspec.msgpack.Decoder(Observation).decode

    async def play() -> tuple[int, float, float]:
        steps = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        for episode in range(work.episodes):
            env = make(work.scenario, **work.kwargs)
            observations, infos = env.reset(seed=episode)
            agents = {seat: factories[seat]() for seat in env.possible_agents}
            for agent in agents.values():
                agent.reset(episode)
            rewards: dict[str, float] = {}
            while env.agents:
                actions = {}
                for seat in env.agents:
                    if not infos.get(seat, {}).get("to_act", True):
                        continue
                    obs = Observation(
                        agent=seat,
                        text=observations.get(seat, ""),
                        scenario=work.scenario,
                        reward=rewards.get(seat, 0.0),
                        info=infos.get(seat, {}),
                    )
                    if copy:
                        obs = decode(encode(obs))
                    actions[seat] = (await agents[seat].act(obs)).text
                    steps += 1
                observations, rewards, _, _, infos = env.step(actions)
            env.close()
        return steps, time.process_time() - cpu_started, time.perf_counter() - started

    steps, cpu, wall = asyncio.run(play())
    return steps / cpu, steps / wall


# --- (c) runner agent steps/s, pipelined or not --------------------------------------------

REMOTE_NAME = "bench-agents"
"""Bus name of the child process hosting every seat in the ipc case (``remote:NAME``)."""


def _serve_agents(address: str, agents: dict[str, str]) -> None:
    """Child process: host every seat's agent on one endpoint and join the arena."""
    from parley.arena.run.agent_host import join_arena
    from parley.arena.run.agent_specs import load_object

    seats = {seat: load_object(path) for seat, path in agents.items()}
    names = dict.fromkeys(seats, REMOTE_NAME)
    asyncio.run(join_arena(address, seats, names=names, connect_timeout=60))


def _runner_rates(
    work: Workload,
    *,
    pipeline: bool,
    ipc: bool,
    concurrency: int = 1,
    out: bool = False,
    batch: bool = False,
) -> tuple[float, float, float, float]:
    """Agent steps per second of round-trip time, per second of play, per CPU second of
    play in this process, per CPU second of play of its event loop's thread; with ``out``,
    the runner writes its records (``--out``) to a temporary directory; with ``batch``, it
    asks the agents' process in batched frames (``RunConfig.batch_frames``)."""
    from parley.arena.run.agent_specs import AgentSource, RemoteSeat
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import Runner

    config = RunConfig(
        scenario=work.scenario,
        scenario_kwargs=work.kwargs,
        episodes=work.episodes,
        concurrency=concurrency,
        pipeline=pipeline,
        progress=False,
        batch_frames=batch,
    )
    agents: dict[str, AgentSource] = work.factories()
    procs: list[Any] = []

    def spawn(address: str) -> None:
        process = mp.get_context("spawn").Process(
            target=_serve_agents, args=(address, work.agents), daemon=True
        )
        process.start()
        procs.append(process)

    if ipc:
        agents = {seat: RemoteSeat(REMOTE_NAME) for seat in work.agents}
    try:
        with ipc_address("arena") as address, tempfile.TemporaryDirectory() as records:
            if ipc:
                config = config.replace(listen=address, join_timeout=120.0)
            if out:
                config = config.replace(out=records)
            runner = Runner(config, agents=agents, on_listen=spawn if ipc else None)
            result = asyncio.run(runner.run())
    finally:
        for process in procs:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    failed = result.summary["episodes"]["failed"]
    if failed:
        raise RuntimeError(f"{failed} bench episodes failed: {result.summary['failures'][:1]}")
    # Play starts with the first episode: binding and joining are not play.
    steps = float(result.summary["agent_steps"])
    timing = result.summary["timing"]
    return (
        steps / timing["agents_s"],
        steps / timing["play_s"],
        steps / timing["play_cpu_s"],
        steps / timing["play_loop_cpu_s"],
    )


def _pipelining(args: argparse.Namespace, work: Workload, results: dict[str, Any]) -> None:
    """Pipelined vs one-at-a-time requests, one episode at a time (nothing hides a round
    trip), over ipc and in-process."""
    for ipc in [True] if args.no_inproc else [True, False]:
        suffix = "" if ipc else "_inproc"
        rates: dict[bool, list[tuple[float, float, float, float]]] = {True: [], False: []}
        for _ in range(args.repeats):
            for pipeline in (True, False):
                rates[pipeline].append(_runner_rates(work, pipeline=pipeline, ipc=ipc))
        for pipeline, name in ((True, "pipelined"), (False, "sequential")):
            results[f"round_trips_per_s_{name}{suffix}"] = max(r[0] for r in rates[pipeline])
            results[f"agent_steps_per_s_{name}{suffix}"] = max(r[1] for r in rates[pipeline])
        results[f"pipelined_ratio_vs_sequential{suffix}"] = (
            results[f"round_trips_per_s_pipelined{suffix}"]
            / results[f"round_trips_per_s_sequential{suffix}"]
        )
        results[f"pipelined_episode_ratio_vs_sequential{suffix}"] = (
            results[f"agent_steps_per_s_pipelined{suffix}"]
            / results[f"agent_steps_per_s_sequential{suffix}"]
        )


def _overhead(args: argparse.Namespace, work: Workload, results: dict[str, Any]) -> None:
    """The plain loop, the runner with in-process agents and with agents in another process
    over ipc (``--concurrency`` episodes at once), and the reference loop of each
    (:mod:`~parley.arena.bench.floors`), interleaved; ratios of the best: CPU time for the
    runner and the copy floor (everything in this process), wall clock for remote agents and
    the raw pyzmq reference."""
    cases: dict[str, Callable[[], tuple[float, float]]] = {
        "plain_loop": lambda: _plain_loop_steps_per_s(work)
    }

    loop_cpu: dict[str, float] = {}  # the runner's event-loop thread, per case

    def play_rates(ipc: bool, out: bool = False, batch: bool = False) -> tuple[float, float]:
        _, wall, cpu, loop = _runner_rates(
            work, pipeline=True, ipc=ipc, concurrency=args.concurrency, out=out, batch=batch
        )
        name = "runner_out" if out else "runner"
        loop_cpu[name] = max(loop_cpu.get(name, 0.0), loop)
        return cpu, wall

    if not args.no_inproc:
        cases["runner"] = lambda: play_rates(False)
        cases["runner_out"] = lambda: play_rates(False, out=True)
        cases["copy_floor"] = lambda: _plain_loop_steps_per_s(work, copy=True)
    cases["remote"] = lambda: play_rates(True)
    cases["remote_batched"] = lambda: play_rates(True, batch=True)
    cases["raw_pyzmq"] = lambda: raw_pyzmq_steps_per_s(work, args.concurrency)
    best = {name: [0.0, 0.0] for name in cases}  # (per CPU second, per wall second)
    for _ in range(args.repeats):
        for name, case in cases.items():
            best[name] = [max(old, new) for old, new in zip(best[name], case(), strict=True)]
    suffix = "" if work.name == "broadcast" else f"_{work.name}"
    for name, (cpu, wall) in best.items():
        results[f"agent_steps_per_s_{name}{suffix}"] = wall
        if name in ("plain_loop", "runner", "runner_out", "copy_floor"):
            results[f"agent_steps_per_cpu_s_{name}{suffix}"] = cpu
    for name, rate in loop_cpu.items():
        if name.startswith("runner"):
            results[f"agent_steps_per_loop_cpu_s_{name}{suffix}"] = rate
    plain_cpu, plain_wall = best["plain_loop"]
    if "runner" in best:
        results[f"runner_ratio_vs_plain_loop{suffix}"] = best["runner"][0] / plain_cpu
        results[f"copy_floor_ratio_vs_plain_loop{suffix}"] = best["copy_floor"][0] / plain_cpu
        results[f"runner_ratio_vs_copy_floor{suffix}"] = best["runner"][0] / best["copy_floor"][0]
        # --out: what the event loop's thread spends (the target: encoding and writing run
        # on the records' writer thread) and what the whole process spends, writer included.
        results[f"runner_out_ratio_vs_runner{suffix}"] = loop_cpu["runner_out"] / loop_cpu["runner"]
        results[f"runner_out_process_cpu_ratio_vs_runner{suffix}"] = (
            best["runner_out"][0] / best["runner"][0]
        )
    results[f"remote_ratio_vs_plain_loop{suffix}"] = best["remote"][1] / plain_wall
    results[f"remote_batched_ratio_vs_plain_loop{suffix}"] = best["remote_batched"][1] / plain_wall
    results[f"raw_pyzmq_ratio_vs_plain_loop{suffix}"] = best["raw_pyzmq"][1] / plain_wall


def _measure(args: argparse.Namespace, step: Callable[[str], None]) -> dict[str, Any]:
    _register()
    results: dict[str, Any] = {
        "agents": args.agents,
        "steps_per_episode": args.steps,
        "concurrency": args.concurrency,
    }
    step("scenario vs bare env steps")
    env_cases: dict[str, Callable[[int], float]] = {
        "scenario": lambda n: _env_steps_per_s(lambda: Broadcast(args.agents, args.steps), n),
        "bare": lambda n: _env_steps_per_s(lambda: BareBroadcast(args.agents, args.steps), n),
    }
    env = best_rates(env_cases, args.env_episodes, args.repeats)
    results["env_steps_per_s_scenario"] = env["scenario"]
    results["env_steps_per_s_bare"] = env["bare"]
    results["env_step_ratio_vs_bare"] = env["scenario"] / env["bare"]
    broadcast, trade = _workloads(args)
    step("runner round trips, pipelined vs one at a time")
    _pipelining(args, broadcast, results)
    for work in (broadcast, trade):
        step(f"{work.name}: plain loop, runner, remote agents")
        _overhead(args, work, results)
    step("simple-trade beside TextArena")
    if args.no_textarena:
        results["textarena_skipped"] = "--no-textarena"
    else:
        from parley.arena.bench.textarena import measure

        results.update(measure(args.ta_episodes, args.repeats))
    return results


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    console = Console(stderr=args.json)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("env bench", total=5)
        started = False

        def step(label: str) -> None:
            nonlocal started
            if started:
                progress.advance(task)
            started = True
            progress.update(task, description=label)

        results = _measure(args, step)
    if args.json:
        print(json.dumps(results))
        return 0
    table = Table(title=f"steps/s ({args.agents}-agent broadcast unless named)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    labels = {
        "env_steps_per_s_scenario": "env steps/s, parley Scenario",
        "env_steps_per_s_bare": "env steps/s, bare ParallelEnv",
        "round_trips_per_s_pipelined": "round trips/s, pipelined (ipc)",
        "round_trips_per_s_sequential": "round trips/s, one at a time (ipc)",
        "round_trips_per_s_pipelined_inproc": "round trips/s, pipelined (in-process)",
        "round_trips_per_s_sequential_inproc": "round trips/s, one at a time (in-process)",
        "agent_steps_per_s_plain_loop": "agent steps/s, plain loop (no runner)",
        "agent_steps_per_s_runner": "agent steps/s, runner, in-process agents",
        "agent_steps_per_loop_cpu_s_runner_out": "agent steps per loop CPU s, runner with --out",
        "agent_steps_per_s_remote": "agent steps/s, runner, agents over ipc",
        "agent_steps_per_s_remote_batched": "agent steps/s, runner, agents over ipc, batched",
        "agent_steps_per_s_raw_pyzmq": "agent steps/s, raw pyzmq loop, agents over ipc",
        "agent_steps_per_s_plain_loop_simple_trade": "simple-trade-v1: plain loop",
        "agent_steps_per_s_runner_simple_trade": "simple-trade-v1: runner, in-process",
        "agent_steps_per_s_remote_simple_trade": "simple-trade-v1: runner, over ipc",
        "agent_steps_per_s_raw_pyzmq_simple_trade": "simple-trade-v1: raw pyzmq loop, over ipc",
        "env_steps_per_s_simple_trade_v0": "env steps/s, simple-trade-v0",
        "env_steps_per_s_simple_trade_v1": "env steps/s, simple-trade-v1",
        "env_steps_per_s_textarena_bare": "env steps/s, TextArena SimpleNegotiation",
        "env_steps_per_s_textarena_wrapped": "env steps/s, TextArena, as textarena.make wraps it",
    }
    for key, label in labels.items():
        if key in results:
            table.add_row(label, f"{results[key]:,.0f}")
    console.print(table)
    ratios = Table(title=f"ratios (runner and remote: {args.concurrency} episodes at once)")
    ratios.add_column("ratio", overflow="fold")
    ratios.add_column("value", justify="right")
    ratios.add_column("target", justify="right")
    ratios.add_column("met")
    ratios.add_column("reference", justify="right")
    ratios.caption = (
        "reference: the plain loop doing only what the runner must — each observation's "
        "msgpack copy (in-process; a floor), raw pyzmq round trips (ipc)"
    )
    for key, value in results.items():
        if "ratio" not in key or key.startswith(("copy_floor_", "raw_pyzmq_")):
            continue
        base = key.removesuffix("_simple_trade")
        ref = results.get(REFERENCES[base] + key[len(base) :]) if base in REFERENCES else None
        shown = "" if ref is None else f"{ref:.2f}"
        if key in TARGETS:
            op, target = TARGETS[key]
            met = value >= target
            ratios.add_row(key, f"{value:.2f}", f"{op} {target}", "yes" if met else "no", shown)
        else:
            ratios.add_row(key, f"{value:.2f}", "—", "", shown)
    console.print(ratios)
    if "textarena_skipped" in results:
        console.print(f"TextArena comparison skipped: {results['textarena_skipped']}")
    return 0
