"""Scenario step cost beside a bare ParallelEnv, and pipelined vs one-at-a-time agent requests.

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
  ``pipelined_episode_ratio_vs_sequential`` is the same over whole-episode time (scenario
  steps and bookkeeping included); the ``_inproc`` variants host the agents in the runner's
  own process, which asks them directly (no bus hop, only the messages' encoding: there is
  little left for pipelining to hide).

* ``runner_ratio_vs_plain_loop`` — agent steps/s of the runner playing the scenario with the
  scripted agents in its own process (pipelined, whole-episode time) over a plain Python loop
  that calls the same agents' ``act`` directly and steps the same env (target >= 0.7);
  ``remote_ratio_vs_plain_loop`` is the same with the agents in another process over
  ``ipc://`` (target >= 0.3).

Timings are the best of ``--repeats``, the two variants of each pair interleaved.
``--json`` prints one object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
from pettingzoo import ParallelEnv

from parley.agents.base import Agent
from parley.protocols.messages import Action, Observation
from parley.scenarios import Scenario, register

__all__ = ["add_arguments", "run", "BareBroadcast", "Broadcast", "Chatter"]

SCENARIO_ID = "bench/broadcast-v0"
N_AGENTS = 8
TARGETS = {
    "env_step_ratio_vs_bare": (">=", 0.8),
    "pipelined_ratio_vs_sequential": (">=", 3.0),
    "runner_ratio_vs_plain_loop": (">=", 0.7),
    "remote_ratio_vs_plain_loop": (">=", 0.3),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agents", type=int, default=N_AGENTS, help="agents per episode")
    parser.add_argument("--steps", type=int, default=50, help="steps per episode")
    parser.add_argument("--env-episodes", type=int, default=200, help="episodes per env case")
    parser.add_argument("--episodes", type=int, default=6, help="episodes per runner case")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")
    parser.add_argument("--no-inproc", action="store_true", help="skip the in-process case")


# --- the two envs: same routing, with and without parley's scenario machinery --------------


class Broadcast(Scenario):
    """Every seat acts every step; each action goes to every other seat's next observation."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": SCENARIO_ID,
        "render_modes": ["ansi"],
        "is_parallelizable": True,
    }

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
    started = time.perf_counter()
    for episode in range(episodes):
        env.reset(seed=episode)
        while env.agents:
            env.step(lines)
            steps += 1
    return steps / (time.perf_counter() - started)


# --- (b) the plain loop: the same agents called directly, no runner, no bus ----------------


def _plain_loop_steps_per_s(args: argparse.Namespace) -> float:
    """Agent steps/s of ``env.step`` fed by awaiting each acting agent's ``act`` in turn."""
    from parley.scenarios import make

    async def play() -> tuple[int, float]:
        steps = 0
        started = time.perf_counter()
        for episode in range(args.episodes):
            env = make(SCENARIO_ID, n_agents=args.agents, steps=args.steps)
            observations, infos = env.reset(seed=episode)
            agents = {seat: Chatter() for seat in env.possible_agents}
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
                        scenario=SCENARIO_ID,
                        reward=rewards.get(seat, 0.0),
                        info=infos.get(seat, {}),
                    )
                    actions[seat] = (await agents[seat].act(obs)).text
                    steps += 1
                observations, rewards, _, _, infos = env.step(actions)
            env.close()
        return steps, time.perf_counter() - started

    steps, seconds = asyncio.run(play())
    return steps / seconds


# --- (c) runner agent steps/s, pipelined or not --------------------------------------------

REMOTE_NAME = "bench-agents"
"""Bus name of the child process hosting every seat in the ipc case (``remote:NAME``)."""


def _serve_agents(address: str, n_agents: int) -> None:
    """Child process: host every seat's agent on one endpoint and join the arena."""
    from parley.arena.run.agent_host import join_arena

    seats: dict[str, Any] = {f"agent_{i}": Chatter for i in range(n_agents)}
    names = dict.fromkeys(seats, REMOTE_NAME)
    asyncio.run(join_arena(address, seats, names=names, connect_timeout=60))


def _runner_rates(args: argparse.Namespace, *, pipeline: bool, ipc: bool) -> tuple[float, float]:
    """(agent steps per second of round-trip time, per second of episode time)."""
    from parley.arena.run.agent_specs import AgentSource, RemoteSeat
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import Runner

    seats = [f"agent_{i}" for i in range(args.agents)]
    config = RunConfig(
        scenario=SCENARIO_ID,
        scenario_kwargs={"n_agents": args.agents, "steps": args.steps},
        episodes=args.episodes,
        concurrency=1,  # one episode at a time: no other episode hides the round trips
        pipeline=pipeline,
        progress=False,
    )
    agents: dict[str, AgentSource] = dict.fromkeys(seats, Chatter)
    procs: list[Any] = []

    def spawn(address: str) -> None:
        process = mp.get_context("spawn").Process(
            target=_serve_agents, args=(address, args.agents), daemon=True
        )
        process.start()
        procs.append(process)

    if ipc:
        path = os.path.join(tempfile.gettempdir(), f"parley-bench-env-{os.urandom(3).hex()}")
        config = config.replace(listen=f"ipc://{path}", join_timeout=120.0)
        agents = {seat: RemoteSeat(REMOTE_NAME) for seat in seats}
    try:
        runner = Runner(config, agents=agents, on_listen=spawn if ipc else None, keep_records=True)
        result = asyncio.run(runner.run())
    finally:
        for process in procs:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    failed = result.summary["episodes"]["failed"]
    if failed:
        raise RuntimeError(f"{failed} bench episodes failed: {result.summary['failures'][:1]}")
    # Per-episode times start at the first request: binding and joining are not play.
    steps = float(result.summary["agent_steps"])
    round_trips = sum(r.agents_s for r in result.records)
    episodes = sum(r.wall_s for r in result.records)
    return steps / round_trips, steps / episodes


def _best(measure: Callable[[], float], repeats: int) -> float:
    return max(measure() for _ in range(repeats))


def _measure(args: argparse.Namespace, step: Callable[[str], None]) -> dict[str, Any]:
    _register()
    results: dict[str, Any] = {"agents": args.agents, "steps_per_episode": args.steps}
    step("scenario vs bare env steps")
    scenario: list[float] = []
    bare: list[float] = []
    for _ in range(args.repeats):  # interleaved, so load changes hit both alike
        scenario.append(
            _env_steps_per_s(lambda: Broadcast(args.agents, args.steps), args.env_episodes)
        )
        bare.append(
            _env_steps_per_s(lambda: BareBroadcast(args.agents, args.steps), args.env_episodes)
        )
    results["env_steps_per_s_scenario"] = max(scenario)
    results["env_steps_per_s_bare"] = max(bare)
    results["env_step_ratio_vs_bare"] = max(scenario) / max(bare)
    step("plain loop over the same agents")
    plain = _best(lambda: _plain_loop_steps_per_s(args), args.repeats)
    results["agent_steps_per_s_plain_loop"] = plain
    for ipc in [True] if args.no_inproc else [True, False]:
        suffix = "" if ipc else "_inproc"
        step(f"runner round trips over {'ipc' if ipc else 'inproc'}")
        rates: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(args.repeats):
            for pipeline in (True, False):
                rates[pipeline].append(_runner_rates(args, pipeline=pipeline, ipc=ipc))
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
    results["remote_ratio_vs_plain_loop"] = results["agent_steps_per_s_pipelined"] / plain
    if not args.no_inproc:
        results["runner_ratio_vs_plain_loop"] = (
            results["agent_steps_per_s_pipelined_inproc"] / plain
        )
    return results


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    console = Console(stderr=args.json)
    cases = 3 if args.no_inproc else 4
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("env bench", total=cases)
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
    table = Table(title=f"scenario steps and agent round trips, {args.agents} agents")
    table.add_column("measure")
    table.add_column("ipc", justify="right")
    table.add_column("inproc", justify="right")
    rows = [
        ("env steps/s, parley Scenario", "env_steps_per_s_scenario", False),
        ("env steps/s, bare ParallelEnv", "env_steps_per_s_bare", False),
        ("round trips/s, pipelined", "round_trips_per_s_pipelined", True),
        ("round trips/s, one at a time", "round_trips_per_s_sequential", True),
        ("agent steps/s (whole episode), pipelined", "agent_steps_per_s_pipelined", True),
        ("agent steps/s (whole episode), one at a time", "agent_steps_per_s_sequential", True),
        ("agent steps/s, plain loop (no runner)", "agent_steps_per_s_plain_loop", False),
    ]
    for label, key, per_transport in rows:
        if not per_transport:
            table.add_row(label, f"{results[key]:,.0f}", "")
            continue
        inproc = results.get(f"{key}_inproc")
        table.add_row(label, f"{results[key]:,.0f}", "" if inproc is None else f"{inproc:,.0f}")
    console.print(table)
    ratios = Table(title="ratios")
    ratios.add_column("ratio")
    ratios.add_column("value", justify="right")
    ratios.add_column("target", justify="right")
    ratios.add_column("met")
    for key in (
        "env_step_ratio_vs_bare",
        "pipelined_ratio_vs_sequential",
        "pipelined_episode_ratio_vs_sequential",
        "pipelined_ratio_vs_sequential_inproc",
        "pipelined_episode_ratio_vs_sequential_inproc",
        "runner_ratio_vs_plain_loop",
        "remote_ratio_vs_plain_loop",
    ):
        if key not in results:
            continue
        value = results[key]
        if key in TARGETS:
            op, target = TARGETS[key]
            met = value >= target
            ratios.add_row(key, f"{value:.2f}", f"{op} {target}", "yes" if met else "no")
        else:
            ratios.add_row(key, f"{value:.2f}", "—", "")
    console.print(ratios)
    return 0
