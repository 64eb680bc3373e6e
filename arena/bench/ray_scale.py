"""Episodes through Ray worker actors beside the local runner, and 2 workers beside 1.

In one run (a local Ray with ``--cpus`` CPUs is started unless this process is connected):

* ``ray_ratio_vs_local`` — episodes/s of ``--episodes`` scripted episodes
  (``negotiation/deal-or-no-deal-v0``) on one Ray worker over episodes/s of the local runner
  (same plan, same concurrency; target >= 0.8). Ray's rate is counted from when the worker
  has started (``startup_s`` is reported apart: it is paid once per run, not per episode);
  ``ray_ratio_vs_local_with_startup`` counts it in.
* ``scaling_2_workers`` — episodes/s with 2 workers over 1 worker on a CPU-bound workload:
  the same scripted agents, each burning ``--work-ms`` ms of CPU per action (target >= 1.6 on
  2 cores; the driver shares those cores, and so does anything else running on them).
* ``cpu_ms_per_episode`` and ``rss_kb_per_concurrent_episode`` — what one episode costs on
  the local runner (CPU of the whole process over the episodes; the growth of peak RSS while
  ``--concurrent`` episodes wait on agents at once), the figures docs/scaling.md builds on.

Timings are the best of ``--repeats``. ``--json`` prints one object.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import resource
import time
from typing import Any

from parley.agents.base import Agent
from parley.protocols.messages import Action, Observation

SCENARIO = "negotiation/deal-or-no-deal-v0"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=2000, help="episodes per timed run")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes at once (per worker)")
    parser.add_argument("--work-ms", type=float, default=2.0, help="CPU ms per action (scaling)")
    parser.add_argument("--scaling-episodes", type=int, default=400, help="episodes (scaling)")
    parser.add_argument("--concurrent", type=int, default=1024, help="episodes at once (RSS)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray")
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant (best kept)")


class _Busy(Agent):
    """A seat's scripted baseline that first burns ``work_s`` of CPU per action (or, with
    ``sleep_s``, waits that long without using any)."""

    def __init__(self, make: Any, work_s: float = 0.0, sleep_s: float = 0.0) -> None:
        self.inner, self.work_s, self.sleep_s = make(), work_s, sleep_s

    def reset(self, seed: int | None = None) -> None:
        self.inner.reset(seed)

    async def act(self, observation: Observation) -> Action:
        if self.sleep_s:
            await asyncio.sleep(self.sleep_s)
        end = time.process_time() + self.work_s
        while time.process_time() < end:
            pass
        action: Action = await self.inner.act(observation)
        return action


def busy_agents(work_s: float = 0.0, sleep_s: float = 0.0) -> dict[str, Any]:
    """Seat -> factory of :class:`_Busy` around the scenario's scripted baselines."""
    from parley.arena.run.agent_specs import SeatContext, resolve_agent_spec
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import Runner, _baseline

    agents = {}
    for seat in Runner(RunConfig(scenario=SCENARIO, progress=False)).seats:
        context = SeatContext(
            scenario=SCENARIO, seat=seat, baseline=_baseline(SCENARIO, seat), options={}
        )
        make = resolve_agent_spec("scripted", context)
        agents[seat] = functools.partial(_Busy, make, work_s, sleep_s)
    return agents


def _local(config: Any, agents: dict[str, Any] | None = None) -> tuple[float, float]:
    from parley.arena.run.runner import run

    cpu = time.process_time()
    result = run(config, agents=agents)
    return result.summary["episodes"]["total"] / result.wall_s, time.process_time() - cpu


def _on_ray(config: Any, workers: int, agents: dict[str, Any] | None = None) -> dict[str, float]:
    from parley.arena.run.ray_runner import run_on_ray

    result = run_on_ray(config.replace(ray="auto", ray_workers=workers), agents=agents)
    figures = result.summary["ray"]
    return {
        "after_startup": float(figures["episodes_per_s_after_startup"] or 0.0),
        "with_startup": result.summary["episodes"]["total"] / result.wall_s,
        "startup_s": float(figures["startup_s"]),
    }


def _rss_per_episode(concurrent: int) -> float:
    """KiB of peak RSS per episode while ``concurrent`` episodes wait on agents at once."""
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import run

    config = RunConfig(scenario=SCENARIO, episodes=concurrent, concurrency=concurrent,
                       progress=False, act_timeout=600)  # fmt: skip
    run(config.replace(episodes=8, concurrency=8))  # warm: imports, first allocations
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run(config, agents=busy_agents(sleep_s=0.5))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (after - before) / concurrent


def _measure(args: argparse.Namespace, step: Any) -> dict[str, Any]:
    from parley.arena.run.config import RunConfig
    from parley.arena.run.ray_runner import import_ray, init_ray

    ray = import_ray()
    started = time.perf_counter()
    init_ray("local", num_cpus=args.cpus)
    ray_start_s = time.perf_counter() - started
    config = RunConfig(scenario=SCENARIO, episodes=args.episodes, concurrency=args.concurrency,
                       progress=False)  # fmt: skip
    busy = busy_agents(work_s=args.work_ms / 1000)
    heavy = config.replace(episodes=args.scaling_episodes)
    local: list[float] = []
    cpu: list[float] = []
    one: list[dict[str, float]] = []
    scale: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.repeats):
        step("local runner")
        rate, used = _local(config)
        local.append(rate)
        cpu.append(used)
        step("ray, 1 worker")
        one.append(_on_ray(config, 1))
        for workers in (1, 2):
            step(f"ray, {workers} worker(s), CPU-bound")
            scale[workers].append(_on_ray(heavy, workers, busy)["after_startup"])
    step("RSS per concurrent episode")
    rss = _rss_per_episode(args.concurrent)
    best_one = max(one, key=lambda r: r["after_startup"])
    results: dict[str, Any] = {
        "ray_ratio_vs_local": best_one["after_startup"] / max(local),
        "ray_ratio_vs_local_with_startup": max(r["with_startup"] for r in one) / max(local),
        "scaling_2_workers": max(scale[2]) / max(scale[1]),
        "local_episodes_per_s": max(local),
        "ray_1_worker_episodes_per_s": best_one["after_startup"],
        "ray_worker_startup_s": best_one["startup_s"],
        "ray_init_s": ray_start_s,
        "cpu_bound_1_worker_episodes_per_s": max(scale[1]),
        "cpu_bound_2_workers_episodes_per_s": max(scale[2]),
        "cpu_ms_per_episode": 1000 * min(cpu) / args.episodes,
        "rss_kb_per_concurrent_episode": rss,
        "episodes": args.episodes,
        "cpus": int(ray.cluster_resources().get("CPU", 0)),
    }
    return results


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    console = Console(stderr=args.json)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("ray bench", total=4 * args.repeats + 1)

        def step(label: str) -> None:
            progress.update(task, description=label, advance=1)

        results = _measure(args, step)
    if args.json:
        print(json.dumps(results))
        return 0
    table = Table(title="episodes on Ray beside the local runner")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in results.items():
        table.add_row(key, f"{value:,.3f}" if isinstance(value, float) else str(value))
    console.print(table)
    return 0
