"""Learner steps/s through ``parley env-server`` (OpenEnv over loopback) ÷ the in-process arena.

In one run, on the same episodes (the scenario seeds of a ``parley run`` plan) of
``--scenario`` with the learner seat played by its scripted baseline:

* ``openenv``: a ``parley env-server --protocol openenv`` process on 127.0.0.1 and
  ``--sessions`` concurrent OpenEnv ``EnvClient`` sessions (WebSocket) in this process,
  each playing its share of the episodes; the baseline answers each observation here;
* ``arena``: the in-process runner (``Runner.run``) playing the same episodes with every
  seat scripted, ``--sessions`` episodes at once.

``openenv_ratio_vs_arena`` is learner steps/s over the arena's on the same episodes (the
issue's target: >= 0.5 at 64 sessions). Wall clock, best of ``--repeats``, the two sides
interleaved; the server's start is not timed. ``--json`` prints one object.
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


async def _openenv(url: str, args: argparse.Namespace, seeds: list[int]) -> tuple[float, int]:
    """Wall seconds and learner steps of ``seeds`` over ``args.sessions`` sessions."""
    from parley.arena.integrations.openenv import ParleyAction, ParleyEnvClient
    from parley.arena.run.agent_specs import load_object
    from parley.protocols.messages import Observation
    from parley.scenarios import spec

    baseline = load_object(spec(args.scenario).baselines[args.learner])
    steps = 0

    async def session(share: list[int]) -> None:
        nonlocal steps
        agent = baseline()
        async with ParleyEnvClient(base_url=url, message_timeout_s=120) as env:
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

    shares = [seeds[i :: args.sessions] for i in range(args.sessions)]
    started = time.perf_counter()
    await asyncio.gather(*(session(share) for share in shares if share))
    return time.perf_counter() - started, steps


def _arena(args: argparse.Namespace) -> tuple[float, int]:
    """Wall seconds of play and the learner seat's steps, the in-process runner."""
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import Runner

    config = RunConfig(
        scenario=args.scenario, episodes=args.episodes, concurrency=args.sessions, progress=False
    )
    result = asyncio.run(Runner(config, keep_records=True).run())
    steps = sum(
        len(t.turns) for r in result.records for t in r.trajectories if t.agent == args.learner
    )
    return float(result.summary["timing"]["play_s"]), steps


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
    best: dict[str, tuple[float, int]] = {}
    try:
        for _ in range(args.repeats):
            for name, measure in (
                ("openenv", lambda: asyncio.run(_openenv(url, args, seeds))),
                ("arena", lambda: _arena(args)),
            ):
                seconds, steps = measure()
                if name not in best or steps / seconds > best[name][1] / best[name][0]:
                    best[name] = (seconds, steps)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    rates = {name: steps / seconds for name, (seconds, steps) in best.items()}
    results: dict[str, Any] = {
        "scenario": args.scenario,
        "learner": args.learner,
        "sessions": args.sessions,
        "episodes": args.episodes,
        "openenv_learner_steps_per_s": round(rates["openenv"], 1),
        "arena_learner_steps_per_s": round(rates["arena"], 1),
        "openenv_ratio_vs_arena": round(rates["openenv"] / rates["arena"], 3),
        "cpu_count": os.cpu_count(),
        "load_1m": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(results))
    else:
        for key, value in results.items():
            print(f"{key:32} {value}")
    return 0
