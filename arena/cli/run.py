"""``parley run SCENARIO``: play episodes with agents in seats; print and write the results."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import sys
from typing import TYPE_CHECKING, Any

import yaml
from rich.console import Console

from parley.arena.run.config import RunConfig, load_run_config
from parley.protocols.errors import ConfigError

if TYPE_CHECKING:
    from parley.arena.run.ray_runner import RayWorkersLost

__all__ = ["add_parser", "parse_agents", "parse_assignments"]

_SEAT_ASSIGNMENT = re.compile(r"^[A-Za-z0-9_.-]+=")


def add_parser(sub: Any) -> None:
    from parley.arena.cli.common import add_scenario_and_agent_options

    p = sub.add_parser(
        "run",
        help="play episodes of a scenario with agents in seats",
        description="Play episodes of SCENARIO concurrently, agents reached over the bus; "
        "print a summary table and write transcripts.jsonl, trajectories.jsonl, "
        "timings.jsonl and summary.json to --out (schema: arena/run/SCHEMA.md). Options "
        "given here override the --config file.",
    )
    p.add_argument("scenario", nargs="?", help="scenario id (or `scenario:` in --config)")
    p.add_argument("--config", help="YAML file of RunConfig fields")
    p.add_argument(
        "--agents",
        help="comma-separated agent specs in seat order, or seat=spec items; specs: "
        "scripted (the seat's baseline), module:Class, remote[:NAME], llm:PATH. "
        "Default: every seat's scripted baseline",
    )
    p.add_argument("--episodes", type=int, help="tasks (distinct scenario seeds) to play")
    p.add_argument("--trials", type=int, help="plays per task; reports pass^k for k=1..n")
    p.add_argument("--seed", type=int, help="run seed (every episode seed derives from it)")
    p.add_argument("--concurrency", type=int, help="episodes played at once")
    p.add_argument("--out", help="directory for the JSONL files and summary.json")
    p.add_argument(
        "--listen", help="address for remote agents to connect to (tcp://127.0.0.1:5555)"
    )
    p.add_argument(
        "--curve-key",
        metavar="FILE",
        help="the arena's CURVE secret key file (parley keys new arena): tcp is encrypted "
        "and admits only the --seat-key keys",
    )
    p.add_argument(
        "--seat-key",
        action="append",
        default=[],
        metavar="SEAT=FILE",
        help="public key file of the agent allowed to play SEAT (with --curve-key); repeatable",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow --listen on a non-loopback tcp address without keys (plain text)",
    )
    p.add_argument("--act-timeout", type=float, help="seconds an agent has per action")
    p.add_argument("--join-timeout", type=float, help="seconds to wait for remote agents")
    p.add_argument(
        "--peer-timeout",
        type=float,
        metavar="SECONDS",
        help="seconds a bus peer whose connection is still open (a remote agent, a --pool) "
        "may stay silent, busy or paused, before the arena counts it as gone; one whose "
        "connection closed is gone within a few seconds whatever this is",
    )
    p.add_argument("--max-steps", type=int, help="steps after which an episode fails")
    p.add_argument(
        "--judge",
        metavar="SPEC",
        help="an llm: spec of a judge model: each finished episode gets the reward component "
        "'judge' from its verdict (asked through the seats' pool); needs --judge-rubric",
    )
    p.add_argument(
        "--judge-rubric",
        metavar="FILE_OR_TEXT",
        help="the judge's rubric: YAML {rubric: TEXT, verdicts: {good: 1, bad: 0}}, a text "
        "file, or the text itself",
    )
    p.add_argument(
        "--judge-scope", choices=("seat", "episode"), help="a verdict per seat (default) or one"
    )
    p.add_argument(
        "--reward-model",
        metavar="DIR",
        help="a reward model directory (parley train-rm): each finished episode gets the "
        "reward component 'rm', its score of each seat's text (through --pool, where "
        "parley serve --reward-model DIR serves it, or loaded here)",
    )
    p.add_argument("--rm-weight", type=float, help="the rm component is the score times this")
    p.add_argument(
        "--rm-scope", choices=("seat", "episode"), help="a score per seat (default) or one"
    )
    p.add_argument(
        "--similarity",
        metavar="chrf|MODEL_DIR",
        help="reward component 'similarity' against a reference: chrF, or embedding cosine "
        "with a local model directory",
    )
    p.add_argument(
        "--similarity-key",
        metavar="KEY",
        help="compare this key of JSON actions with the scenario oracle's (e.g. answer)",
    )
    add_scenario_and_agent_options(p)
    p.add_argument("--pool", help="bus address of an inference pool for llm: agents")
    p.add_argument(
        "--pool-key",
        metavar="KEY",
        help="public key (.key file or Z85) of a pool started with --curve-key; this side "
        "authenticates with --curve-key",
    )
    p.add_argument(
        "--max-failed-fraction",
        type=float,
        metavar="F",
        help="fraction of episodes (0..1) allowed to fail before the exit status is 1 "
        "(default 0: any failed episode fails the run)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="play the episodes on Ray worker actors: a cluster address (auto, HOST:6379, "
        "ray://HOST:10001) or none for a local Ray (pip install 'parley[ray]')",
    )
    p.add_argument("--ray-workers", type=int, help="Ray worker actors (default: one per CPU)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print summary.json instead of a table")
    p.set_defaults(func=main)
    _show_config_defaults(p)


def _show_config_defaults(p: argparse.ArgumentParser) -> None:
    """Options default to ``None`` (then ``--config``, then RunConfig decide): say in their
    help what RunConfig's own default is."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    for action in p._actions:
        default = defaults.get(action.dest)
        hidden = default is None or default is False or default == ""
        said = not action.help or "default" in action.help.lower()
        if not (hidden or said or default is dataclasses.MISSING):
            action.help = f"{action.help} (default: {default})"


def parse_assignments(items: list[str], what: str) -> dict[str, Any]:
    """``["k=v", ...]`` -> ``{k: yaml(v)}``; raises :class:`ConfigError` on a bad item."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} {item!r} must look like KEY=VALUE")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{what} {item!r}: VALUE is not valid YAML ({exc})") from exc
    return out


def parse_agents(text: str | None) -> list[str] | dict[str, str] | None:
    """``"a,b"`` -> ``["a", "b"]``; ``"seat=spec,..."`` -> ``{seat: spec}``."""
    if not text:
        return None
    items = [item.strip() for item in text.split(",") if item.strip()]
    # "seat=spec" names a seat; "llm:PATH?k=v" is a spec whose query has "=" in it.
    named = [("=" in item and ":" not in item.partition("=")[0]) for item in items]
    if all(named):
        return {k.strip(): v.strip() for k, _, v in (i.partition("=") for i in items)}
    if any(named):
        raise ConfigError("--agents: give every seat as seat=spec, or none (specs in seat order)")
    return items


def build_config(args: argparse.Namespace) -> RunConfig:
    """The run's config: ``--config`` file, then the options given on the command line."""
    overrides: dict[str, Any] = {
        "scenario": args.scenario,
        "agents": parse_agents(args.agents),
        "episodes": args.episodes,
        "trials": args.trials,
        "seed": args.seed,
        "concurrency": args.concurrency,
        "out": args.out,
        "listen": args.listen,
        "act_timeout": args.act_timeout,
        "join_timeout": args.join_timeout,
        "peer_timeout": args.peer_timeout,
        "max_steps": args.max_steps,
        "judge": args.judge,
        "judge_rubric": args.judge_rubric,
        "judge_scope": args.judge_scope,
        "reward_model": args.reward_model,
        "rm_weight": args.rm_weight,
        "rm_scope": args.rm_scope,
        "similarity": args.similarity,
        "similarity_key": args.similarity_key,
        "max_failed_fraction": args.max_failed_fraction,
        "curve_key": args.curve_key,
        "insecure": True if args.insecure else None,
        "progress": False if args.no_progress else None,
        "ray": args.ray,
        "ray_workers": args.ray_workers,
    }
    config = load_run_config(args.config, overrides)
    if args.seat_key:
        seat_keys = {k: str(v) for k, v in parse_assignments(args.seat_key, "--seat-key").items()}
        config = config.replace(seat_keys={**config.seat_keys, **seat_keys})
    scenario_kwargs = parse_assignments(args.scenario_arg, "--scenario-arg")
    options = parse_assignments(args.agent_option, "--agent-option")
    if args.pool:
        options["pool"] = args.pool
    if args.pool_key:
        options["pool_key"] = args.pool_key
        if not config.curve_key and "pool_client_key" not in options:
            raise ConfigError("--pool-key needs --curve-key: this side's secret key file")
        options.setdefault("pool_client_key", config.curve_key)
    if scenario_kwargs or options:
        config = config.replace(
            scenario_kwargs={**config.scenario_kwargs, **scenario_kwargs},
            agent_options={**config.agent_options, **options},
        )
    return check_config(config)


HUMAN_ACT_TIMEOUT = 1800.0
"""``act_timeout`` of a run with a human seat when it is left at RunConfig's default (60 s):
30 minutes a move."""


def check_config(config: RunConfig) -> RunConfig:
    """Refuse, before any work, what would fail later with a traceback or a long wait:
    bad scenario arguments, an unwritable ``--out``, ``remote`` seats without ``--listen``,
    missing ``llm:`` models (``~`` is expanded; the default tiny model is built)."""
    from parley.arena.cli.common import (
        check_agent_spec,
        check_out_dir,
        check_scenario_kwargs,
        load_agent_kinds,
    )

    load_agent_kinds()
    if config.scenario:
        check_scenario_kwargs(config.scenario, config.scenario_kwargs)
    if config.out:
        check_out_dir(config.out)
    agents = config.agents
    specs = list(agents.values()) if isinstance(agents, dict) else list(agents or [])
    remote = [s for s in specs if s == "remote" or s.startswith("remote:")]
    if remote and not config.listen:
        raise ConfigError(
            "--agents remote needs --listen ADDRESS (e.g. --listen tcp://127.0.0.1:5555) so "
            "that `parley agent` in another process can connect"
        )
    human = any(s == "human" or s.startswith("human:") for s in specs)
    if human and config.act_timeout == RunConfig(scenario="-").act_timeout:
        # A person takes minutes, not seconds: the agents' default would fail the episode
        # while they read. Any other --act-timeout is kept.
        config = config.replace(act_timeout=HUMAN_ACT_TIMEOUT)
    if isinstance(agents, dict):
        return config.replace(agents={k: check_agent_spec(v) for k, v in agents.items()})
    if agents:
        return config.replace(agents=[check_agent_spec(v) for v in agents])
    return config


class RunInterrupted(Exception):
    """SIGINT or SIGTERM stopped the run; ``summary`` is the partial one written (``None``
    when the run stopped before its episodes started)."""

    def __init__(self, signum: int, summary: dict[str, Any] | None) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum, self.summary = signum, summary


def _stop_on_signals() -> list[int]:
    """Make SIGINT and SIGTERM cancel the current task (the run then ends on a whole
    episode and writes a partial summary); returns the list the signals are noted in."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    stopped: list[int] = []

    def stop(signum: int) -> None:
        stopped.append(signum)
        if task is not None:
            task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        # Not in the main thread: no handlers (the caller's own handling applies).
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signum, stop, signum)
    return stopped


async def _run(config: RunConfig, console: Console) -> Any:
    from parley.arena.run.agent_specs import RemoteSeat
    from parley.arena.run.runner import Runner

    def announce(address: str) -> None:
        remote = [seat for seat, s in runner.sources.items() if isinstance(s, RemoteSeat)]
        if config.listen or remote:
            console.print(f"arena listening on [bold]{address}[/bold]")
        keys = ""
        if config.curve_key:
            from parley.protocols.keys import load_secret_key

            server = load_secret_key(config.curve_key)[0].decode()
            keys = f" --curve-key agent-SEAT.key_secret --server-key '{server}'"
        for seat in remote:
            command = f"parley agent --connect {address} --seat {seat} --agent module:Class"
            console.print(f"  waiting for seat {seat}: {command}{keys.replace('SEAT', seat)}")

    if config.ray is not None:
        from parley.arena.run.ray_runner import RayRunner

        runner: Runner = RayRunner(config, console=console, on_listen=announce)
    else:
        runner = Runner(config, console=console, on_listen=announce)
    stopped = _stop_on_signals()
    try:
        if isinstance(config.agent_options.get("pool"), str):
            # Check the pool once, before any episode waits for it (fails in seconds).
            from parley.arena.inference.llm_spec import check_llm_pools

            judge = {"judge": config.judge} if config.judge else {}  # (its policy too)
            await check_llm_pools({**runner.specs, **judge}, config.agent_options)
            if config.reward_model:  # (and that it serves the reward model)
                from parley.arena.inference.backends.scorer import check_score_pool

                await check_score_pool(config.reward_model, config.agent_options)
        return await runner.run()
    except asyncio.CancelledError:
        if not stopped:
            raise
        raise RunInterrupted(stopped[0], getattr(runner, "partial_summary", None)) from None
    finally:
        # llm: agents may have started in-process pools in this event loop; close them here.
        llm_spec = sys.modules.get("parley.arena.inference.llm_spec")
        close = getattr(llm_spec, "close_shared_pools", None)
        if close is not None:
            await close()


def main(args: argparse.Namespace) -> int:
    """Run the arena; exit status 1 when more episodes failed than ``max_failed_fraction``
    allows (any, by default), 2 on a bad configuration, 3 when a ``--ray`` run lost every
    worker and could start none, 4 when it lost the Ray head, 128 + N on signal N."""
    from parley.arena.cli.common import console, error_line
    from parley.arena.run.ray_runner import RayWorkersLost  # (imports no Ray)
    from parley.arena.run.records import encode_json
    from parley.arena.run.summary import summary_table

    err = console(stderr=True)
    try:
        config = build_config(args)
        result = asyncio.run(_run(config, err))
    except ConfigError as exc:
        error_line("run", str(exc))
        return 2
    except RunInterrupted as stop:
        return _interrupted(stop, config.out, summary_table)
    except RayWorkersLost as lost:
        return _ray_lost(lost, config.out, summary_table)
    if args.json:
        sys.stdout.write(encode_json(result.summary).decode() + "\n")
    else:
        seats = ", ".join(f"{seat}={spec}" for seat, spec in result.summary["agents"].items())
        title = f"{config.scenario} — {seats}"
        console().print(summary_table(result.summary, title=title))
        if "ray" in result.summary:
            from parley.arena.run.ray_runner import ray_table

            console().print(ray_table(result.summary["ray"]))
        if config.out:
            err.print(f"wrote {config.out}/transcripts.jsonl, trajectories.jsonl, summary.json")
    episodes = result.summary["episodes"]
    if result.failed_fraction > config.max_failed_fraction:
        err.print(
            f"[red]parley run: {episodes['failed']} of {episodes['total']} episodes failed "
            f"({result.failed_fraction:.1%}; allowed: {config.max_failed_fraction:.1%}, "
            "--max-failed-fraction)[/red]"
        )
        return 1
    return 0


RAY_LOST = 3
"""Exit status of a ``--ray`` run that lost every worker and could start none (4: its
head)."""


def _interrupted(stop: RunInterrupted, out: str | None, summary_table: Any) -> int:
    """Show what an interrupted run kept, say where; exit status 128 + the signal."""
    _partial(stop.summary, f"stopped by {stop}", out, summary_table)
    return 128 + stop.signum


def _ray_lost(lost: RayWorkersLost, out: str | None, summary_table: Any) -> int:
    """A ``--ray`` run with no worker left (exit status 3) or no head (4): what it kept,
    why it stopped."""
    _partial(lost.summary, f"stopped ({lost})", out, summary_table)
    if lost.exit_status != RAY_LOST:  # the head is gone: leave before Ray's client does
        # Ray's exit handlers wait on the dead head, and its C++ client ends the process
        # itself (rc 1, its own error lines) 60 s after the head went: exit now, files
        # closed and streams flushed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(lost.exit_status)
    return RAY_LOST


def _partial(summary: dict[str, Any] | None, why: str, out: str | None, table: Any) -> None:
    """The partial summary's table on stdout and one ``parley run:`` line on stderr."""
    from parley.arena.cli.common import console, error_line

    if summary is None:
        error_line("run", f"{why} before any episode finished; nothing written")
        return
    done, planned = summary["episodes"]["total"], summary["episodes_planned"]
    console().print(table(summary, title=f"{summary['scenario']} (partial)"))
    where = (
        f"{out}/transcripts.jsonl, trajectories.jsonl and timings.jsonl hold them, whole; "
        f"{out}/summary.json is marked partial"
        if out
        else "no --out, nothing written"
    )
    error_line("run", f"{why} after {done} of {planned} episodes; {where}")
