"""``parley env-server``: a scenario served to an outside trainer that plays the learner seat(s).

``parley env-server collaboration/referential-v1 --protocol openenv --learner listener``
serves the scenario as an OpenEnv environment (:mod:`parley.arena.integrations.openenv`):
the trainer connects OpenEnv's ``EnvClient`` to the printed URL and plays the learner seats;
parley plays the others with ``--agents`` (specs as ``parley run``'s, over the seats parley
plays, in seat order or ``seat=spec``). Many sessions at once (``--max-sessions``), one
episode at a time each. The server binds loopback (127.0.0.1) unless ``--host`` names
another address and ``--insecure`` says the network is trusted: it has no authentication,
like the pool's HTTP front.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from parley.protocols.errors import ConfigError

OPENENV_MISSING = (
    "OpenEnv is not installed; install it with: pip install 'parley[integrations]' && "
    "pip install --no-deps openenv==0.10.0"
)
PROTOCOLS = ("openenv",)
"""Environment protocols ``--protocol`` serves."""


def add_parser(sub: Any) -> None:
    from parley.arena.cli.common import add_scenario_and_agent_options

    p = sub.add_parser(
        "env-server",
        help="serve a scenario to an outside trainer playing its learner seat (OpenEnv)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("scenario", help="scenario id")
    p.add_argument("--protocol", choices=PROTOCOLS, default="openenv", help="what to speak")
    p.add_argument(
        "--learner",
        action="append",
        default=[],
        metavar="SEAT",
        help="a seat the trainer plays; repeatable (default: the scenario's first seat)",
    )
    p.add_argument(
        "--agents",
        help="comma-separated agent specs for the seats parley plays, in seat order, or "
        "seat=spec items (default: each seat's scripted baseline)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (loopback default)")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed)")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow --host off loopback (no authentication), and a plain-text tcp --listen",
    )
    p.add_argument("--max-sessions", type=int, default=64, help="sessions open at once")
    p.add_argument(
        "--turn-timeout",
        type=float,
        default=600.0,
        help="seconds any seat (the trainer's too) may take for one action before its "
        "episode fails",
    )
    p.add_argument("--max-steps", type=int, default=10_000, help="steps before an episode fails")
    p.add_argument("--seed", type=int, default=0, help="seeds of resets without one derive from it")
    add_scenario_and_agent_options(p)
    p.add_argument("--pool", help="bus address of an inference pool for llm: agents")
    p.add_argument("--listen", default="", help="bus address remote agents connect to")
    p.set_defaults(func=main)


def check_bind(host: str, *, insecure: bool) -> None:
    """Refuse a non-loopback ``host`` without ``insecure`` (the server has no auth)."""
    from parley.arena.inference.http_guard import http_is_loopback

    if not insecure and not http_is_loopback(host):
        raise ConfigError(
            f"refusing to serve the environment on {host!r}: it has no authentication, so "
            "anyone who can reach it could play sessions and drive the agents behind it. "
            "Serve it on 127.0.0.1 (and tunnel to it), or pass --insecure on a network you "
            "trust"
        )


def build_arena(args: argparse.Namespace) -> Any:
    """The :class:`~parley.arena.integrations.learner.LearnerArena` the options describe."""
    from parley.arena.cli.common import check_agent_spec, check_scenario_kwargs, load_agent_kinds
    from parley.arena.cli.run import parse_agents, parse_assignments
    from parley.arena.integrations.learner import LearnerArena

    load_agent_kinds()
    scenario_kwargs = parse_assignments(args.scenario_arg, "--scenario-arg")
    check_scenario_kwargs(args.scenario, scenario_kwargs)
    options = parse_assignments(args.agent_option, "--agent-option")
    if args.pool:
        options["pool"] = args.pool
    agents = parse_agents(args.agents)
    specs = list(agents.values()) if isinstance(agents, dict) else list(agents or [])
    if not args.listen and any(s == "remote" or s.startswith("remote:") for s in specs):
        raise ConfigError(
            "--agents remote needs --listen ADDRESS (e.g. --listen tcp://127.0.0.1:5555) so "
            "that `parley agent` in another process can connect"
        )
    if isinstance(agents, dict):
        agents = {seat: check_agent_spec(spec) for seat, spec in agents.items()}
    elif agents:
        agents = [check_agent_spec(spec) for spec in agents]
    return LearnerArena(
        args.scenario,
        learners=[seat for item in args.learner for seat in item.split(",") if seat],
        agents=agents,
        scenario_kwargs=scenario_kwargs,
        agent_options=options,
        max_sessions=args.max_sessions,
        turn_timeout=args.turn_timeout,
        max_steps=args.max_steps,
        seed=args.seed,
        listen=args.listen,
        insecure=args.insecure,
    )


async def serve_openenv(arena: Any, host: str, port: int, *, loopback_only: bool) -> None:
    """Open ``arena`` and serve it over OpenEnv on ``host:port`` until stopped; prints the
    URL (``openenv: serving SCENARIO at http://HOST:PORT``) once bound."""
    import uvicorn

    from parley.arena.inference.http_guard import bind_tcp
    from parley.arena.integrations.openenv import create_openenv_app

    async with arena:
        app = create_openenv_app(arena, loopback_only=loopback_only)
        sock = bind_tcp(host, port)
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        print(
            f"openenv: serving {arena.scenario} at http://{shown}:{bound} "
            f"(learner seats {','.join(arena.learners)}; ws://{shown}:{bound}/ws)",
            flush=True,
        )
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        try:
            await server.serve(sockets=[sock])
        finally:
            from parley.arena.inference.llm_spec import close_shared_pools

            await close_shared_pools()  # the in-process pools llm: seats started


def main(args: argparse.Namespace) -> int:
    """Serve until interrupted (SIGINT/SIGTERM stop the server cleanly)."""
    check_bind(args.host, insecure=args.insecure)
    try:
        import openenv  # noqa: F401 -- the extra's presence, checked before any work
    except ImportError as exc:
        raise ConfigError(f"{OPENENV_MISSING} ({exc})") from exc
    from parley.arena.inference.http_guard import http_is_loopback

    arena = build_arena(args)
    asyncio.run(
        serve_openenv(arena, args.host, args.port, loopback_only=http_is_loopback(args.host))
    )
    return 0
