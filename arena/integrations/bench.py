"""Learner steps/s through ``parley env-server`` (OpenEnv over loopback) ÷ the in-process arena.

In one run, on the same episodes (the scenario seeds of a ``parley run`` plan) of
``--scenario`` with the learner seat played by its scripted baseline:

* ``openenv``: a ``parley env-server --protocol openenv`` process on 127.0.0.1 and
  ``--sessions`` concurrent OpenEnv ``EnvClient`` sessions (WebSocket) in this process,
  each playing its share of the episodes; the baseline answers each observation here;
* ``arena``: the in-process runner (``Runner.run``) playing the same episodes with every
  seat scripted, ``--sessions`` episodes at once.

``openenv_ratio_vs_arena`` is learner steps/s over the arena's on the same episodes (the
issue's target: >= 0.5 at 64 sessions), wall clock; ``openenv_cpu_ratio_vs_arena`` the same
per CPU second (this process and the server's, against the runner's play CPU): a loaded
machine stretches the wall clock of a two-process round trip far more than the CPU it
needs. Best of ``--repeats``, the two sides interleaved; the server's start and the
sessions' connections are not timed. ``--json`` prints one object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from parley.protocols.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default="collaboration/referential-v1", help="scenario")
    parser.add_argument("--learner", default="listener", help="the seat the trainer plays")
    parser.add_argument("--sessions", type=int, default=64, help="concurrent sessions")
    parser.add_argument("--episodes", type=int, default=512, help="episodes per side")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")


def _start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    parley = str(Path(sys.executable).with_name("parley"))
    cmd = [parley, "env-server", args.scenario, "--learner", args.learner, "--port", "0"]
    cmd += ["--max-sessions", str(args.sessions)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("openenv: serving"):
        proc.kill()
        raise ConfigError(f"parley env-server did not start: {line.strip()}")
    return proc, line.split(" at ")[1].split()[0]


async def _openenv(
    url: str, args: argparse.Namespace, seeds: list[int], server_pid: int
) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (this process and the server's) and learner steps of
    ``seeds`` over ``args.sessions`` sessions, connected before the clock starts (a
    trainer's sessions are long-lived)."""
    from parley.arena.integrations.openenv import ParleyAction, ParleyEnvClient
    from parley.arena.run.agent_specs import load_object
    from parley.protocols.messages import Observation
    from parley.scenarios import spec

    baseline = load_object(spec(args.scenario).baselines[args.learner])
    shares = [share for i in range(args.sessions) if (share := seeds[i :: args.sessions])]
    clients = [ParleyEnvClient(base_url=url, message_timeout_s=120) for _ in shares]
    await asyncio.gather(*(client.connect() for client in clients))
    steps = 0

    async def session(env: ParleyEnvClient, share: list[int]) -> None:
        nonlocal steps
        agent = baseline()
        for seed in share:
            agent.reset(seed)
            result = await env.reset(seed=seed)
            while not result.done:
                turn = result.observation
                obs = Observation(
                    agent=args.learner, text=turn.text, scenario=args.scenario, info=turn.info
                )
                action = await agent.act(obs)
                result = await env.step(ParleyAction(text=action.text))
                steps += 1
            if result.observation.failed:
                raise ConfigError(f"episode failed: {result.observation.failed}")

    try:
        cpu, server, started = time.process_time(), _cpu_s(server_pid), time.perf_counter()
        pairs = zip(clients, shares, strict=True)
        await asyncio.gather(*(session(env, share) for env, share in pairs))
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu + _cpu_s(server_pid) - server
    finally:
        await asyncio.gather(*(client.close() for client in clients))
    return wall, cpu, steps


def _cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has used (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _arena(args: argparse.Namespace) -> tuple[float, float, int]:
    """Wall and CPU seconds of play and the learner seat's steps, the in-process runner."""
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import Runner

    config = RunConfig(
        scenario=args.scenario, episodes=args.episodes, concurrency=args.sessions, progress=False
    )
    result = asyncio.run(Runner(config, keep_records=True).run())
    steps = sum(
        len(t.turns) for r in result.records for t in r.trajectories if t.agent == args.learner
    )
    timing = result.summary["timing"]
    return float(timing["play_s"]), float(timing["play_cpu_s"]), steps


def run(args: argparse.Namespace) -> int:
    from parley.arena.run.config import RunConfig
    from parley.arena.run.episode import plan_episodes
    from parley.scenarios import make

    probe = make(args.scenario)
    seats = list(probe.possible_agents)
    probe.close()
    config = RunConfig(scenario=args.scenario, episodes=args.episodes)
    seeds = [plan.seed for plan in plan_episodes(config, seats)]
    proc, url = _start_server(args)
    walls: dict[str, float] = {}
    cpus: dict[str, float] = {}
    steps: dict[str, int] = {}
    try:
        for _ in range(args.repeats):
            for name in ("openenv", "arena"):
                if name == "openenv":
                    wall, cpu, steps[name] = asyncio.run(_openenv(url, args, seeds, proc.pid))
                else:
                    wall, cpu, steps[name] = _arena(args)
                walls[name] = min(walls.get(name, wall), wall)
                cpus[name] = max(min(cpus.get(name, cpu), cpu), 1e-9)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    wall_rate = {name: steps[name] / wall for name, wall in walls.items()}
    cpu_rate = {name: steps[name] / cpu for name, cpu in cpus.items()}
    results: dict[str, Any] = {
        "scenario": args.scenario,
        "learner": args.learner,
        "sessions": args.sessions,
        "episodes": args.episodes,
        "openenv_learner_steps_per_s": round(wall_rate["openenv"], 1),
        "arena_learner_steps_per_s": round(wall_rate["arena"], 1),
        "openenv_ratio_vs_arena": round(wall_rate["openenv"] / wall_rate["arena"], 3),
        "openenv_learner_steps_per_cpu_s": round(cpu_rate["openenv"], 1),
        "arena_learner_steps_per_cpu_s": round(cpu_rate["arena"], 1),
        "openenv_cpu_ratio_vs_arena": round(cpu_rate["openenv"] / cpu_rate["arena"], 3),
        "cpu_count": os.cpu_count(),
        "load_1m": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(results))
    else:
        for key, value in results.items():
            print(f"{key:32} {value}")
    return 0
