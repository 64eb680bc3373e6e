"""``parley agent --connect ENDPOINT --seat SEAT --agent module:Class``: join a running arena.

The arena (``parley run ... --agents ...,remote --listen tcp://127.0.0.1:5555``) prints
the address to connect to and waits for an endpoint named ``agent-SEAT``. This command
connects one, answers the seat's observations in every episode of the run with a fresh
agent per episode, and exits 0 when the arena says goodbye. An arena lost without one (a
stall past ``--peer-timeout``, a crash, a restart) is waited for ``--rejoin-window``
seconds: the agent joins it again when it is back, and exits 1 when it is not.

Several processes may serve one seat: the arena names the seat ``replicas:N:ADDRESS`` and
each process connects to ``ADDRESS`` with ``--name agent-SEAT-K``
(:mod:`parley.arena.run.bus_replicas`: episodes spread over them, a dead one's move on).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from typing import Any

from parley.protocols.errors import BusError, ConfigError

REJOIN_WINDOW = 60.0
"""Default of ``--rejoin-window`` (:data:`parley.arena.run.agent_host.REJOIN_WINDOW`)."""

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    from parley.arena.cli.common import add_peer_timeout, add_scenario_and_agent_options

    p = sub.add_parser(
        "agent",
        help="join a running arena and play a seat",
        description="Connect to an arena started with `parley run ... --listen ADDRESS` whose "
        "seat is given as `remote`, and play that seat until the run ends.",
    )
    p.add_argument("--connect", required=True, metavar="ENDPOINT", help="the arena's address")
    p.add_argument("--seat", required=True, help="the seat to play (a scenario agent name)")
    p.add_argument(
        "--agent",
        default="scripted",
        help="agent spec: module:Class, scripted (needs --scenario), llm:PATH, ...",
    )
    p.add_argument("--scenario", default="", help="scenario id (for the `scripted` spec)")
    p.add_argument(
        "--name",
        help="bus name to join as (default agent-SEAT; each replica of a replicas:N:ADDRESS "
        "seat joins as agent-SEAT-K)",
    )
    p.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait for the arena to answer"
    )
    p.add_argument(
        "--rejoin-window",
        type=float,
        default=REJOIN_WINDOW,
        metavar="SECONDS",
        help="seconds to wait for an arena lost without a goodbye (it died, restarted or "
        f"stayed silent past --peer-timeout) to come back (default {REJOIN_WINDOW:g})",
    )
    add_peer_timeout(p)
    p.add_argument(
        "--curve-key", metavar="FILE", help="this agent's CURVE secret key file (tcp with keys)"
    )
    p.add_argument(
        "--server-key", metavar="KEY", help="the arena's public key: a .key file or 40 Z85 chars"
    )
    add_scenario_and_agent_options(
        p, scenario=False, agent_help="option for the agent-spec resolver"
    )
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Play the seat until the arena says goodbye (exit status 0); 2 for a bad spec or
    flag, 1 when no arena answered or the arena was lost (no goodbye) and did not come back
    within ``--rejoin-window``, 128 + N when signal N (SIGINT, SIGTERM) stopped it."""
    from parley.arena.cli.common import console, error_line
    from parley.arena.cli.run import parse_assignments
    from parley.arena.run.agent_host import join_arena
    from parley.arena.run.agent_specs import RemoteSeat, SeatContext, resolve_agent_spec

    err = console(stderr=True)
    try:
        baseline = ""
        if args.scenario:
            from parley.scenarios import spec

            baselines = spec(args.scenario).baselines
            baseline = baselines.get(args.seat, baselines.get("*", ""))
        seat = SeatContext(
            scenario=args.scenario,
            seat=args.seat,
            baseline=baseline,
            options=parse_assignments(args.agent_option, "--agent-option"),
        )
        from parley.arena.cli.common import check_agent_spec, load_agent_kinds

        load_agent_kinds()
        source = resolve_agent_spec(check_agent_spec(args.agent), seat)
        if isinstance(source, RemoteSeat):
            raise ConfigError("an agent cannot be `remote` itself: give module:Class")
        from parley.protocols.bus import BusConfig
        from parley.protocols.keys import client_bus_config

        base = BusConfig(peer_timeout=args.peer_timeout)
        try:
            bus = client_bus_config(args.curve_key, args.server_key, base=base)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (--curve-key, --server-key)") from exc
        if not args.rejoin_window >= 0:  # (NaN fails every comparison)
            raise ConfigError(f"--rejoin-window must be 0 or more, got {args.rejoin_window}")
    except ConfigError as exc:
        error_line("agent", str(exc))
        return 2
    names = {args.seat: args.name} if args.name else None
    err.print(f"joining {args.connect} as seat {args.seat} ({args.agent})")
    play = join_arena(args.connect, {args.seat: source}, names=names, bus=bus,
                      connect_timeout=args.wait, rejoin_window=args.rejoin_window)  # fmt: skip
    try:
        stopped_by = asyncio.run(_until_signal(play))
    except BusError as exc:
        error_line("agent", str(exc))
        return 1
    if stopped_by is not None:
        name = signal.Signals(stopped_by).name
        error_line("agent", f"stopped by {name}; left the arena at {args.connect}")
        return 128 + stopped_by
    err.print("the arena said goodbye; done")
    return 0


async def _until_signal(play: Coroutine[Any, Any, None]) -> int | None:
    """Run ``play`` until it ends (``None``) or SIGINT/SIGTERM arrives: then cancel it,
    wait for it to close its sockets, and return the signal's number."""
    loop = asyncio.get_running_loop()
    got: asyncio.Future[int] = loop.create_future()

    def stop(signum: int) -> None:
        if not got.done():
            got.set_result(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, int(sig))
    task: asyncio.Future[Any] = asyncio.ensure_future(play)
    waited: list[asyncio.Future[Any]] = [task, got]
    try:
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # BusError when no arena answered
            return None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, BusError):
            await task
        return got.result()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
