"""``parley serve``: an inference pool that arenas in other processes and hosts connect to.

    parley serve --model models/tiny --backend transformers --listen tcp://127.0.0.1:5557
    parley run negotiation/deal-or-no-deal-v0 --agents llm:models/tiny,scripted \\
        --pool tcp://127.0.0.1:5557

The pool answers ``GenerateRequest`` and ``WeightUpdate`` on the bus under the endpoint
name ``pool``; with ``--http HOST:PORT`` it also serves the OpenAI-compatible API
(:mod:`parley.arena.inference.http`). It runs until interrupted (Ctrl-C / SIGTERM), then
answers what is still waiting with ``closed`` and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from parley.protocols.errors import ConfigError, ParleyError

__all__ = ["add_parser", "ServeOptions", "serving"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="start an inference pool that arenas connect to over the bus (and HTTP)",
        description=(__doc__ or "").strip().splitlines()[0],
    )
    p.add_argument("--model", required=True, help="model path or hub id (or URL for openai)")
    p.add_argument(
        "--backend",
        default="transformers",
        choices=["transformers", "vllm", "openai"],
        help="inference backend (default transformers)",
    )
    p.add_argument(
        "--listen",
        default="tcp://127.0.0.1:5557",
        help="bus address to bind (tcp://HOST:PORT, ipc://PATH; port 0 picks one)",
    )
    p.add_argument("--http", metavar="HOST:PORT", help="also serve the OpenAI API there")
    p.add_argument("--policy", default="default", help="policy name the model serves under")
    p.add_argument("--max-batch-size", type=int, default=32, help="requests per backend call")
    p.add_argument("--max-wait", type=float, default=0.005, help="seconds to fill a batch")
    p.add_argument("--max-queue", type=int, default=1024, help="waiting requests before 429")
    p.add_argument(
        "-b",
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="backend keyword argument (VALUE read as YAML), e.g. device=cuda; repeatable",
    )
    p.set_defaults(func=main)


@dataclass(frozen=True)
class ServeOptions:
    """What ``parley serve`` starts (the command-line options, typed)."""

    model: str
    """Model path or hub id (for the ``openai`` backend: the served model's name)."""
    backend: str = "transformers"
    """Backend kind (:data:`parley.arena.inference.backends.BACKENDS`)."""
    listen: str = "tcp://127.0.0.1:5557"
    """Bus address the pool endpoint binds."""
    http: str = ""
    """``HOST:PORT`` of the OpenAI-compatible front; empty: none."""
    policy: str = "default"
    """Policy name requests must carry to reach this model."""
    max_batch_size: int = 32
    """:attr:`parley.arena.inference.pool.PoolConfig.max_batch_size`."""
    max_wait: float = 0.005
    """:attr:`parley.arena.inference.pool.PoolConfig.max_wait`."""
    max_queue: int = 1024
    """:attr:`parley.arena.inference.pool.PoolConfig.max_queue`."""
    backend_options: tuple[tuple[str, Any], ...] = ()
    """Keyword arguments of the backend's ``create``."""


@contextlib.asynccontextmanager
async def serving(options: ServeOptions) -> AsyncIterator[tuple[str, str]]:
    """Start the pool, its bus endpoint and the HTTP front; yield (bus address, HTTP URL).

    Everything is closed on exit, the pool first so waiting requests get their answer.
    """
    from parley.arena.inference.backends import load_backend
    from parley.arena.inference.pool import POOL_ENDPOINT, InferencePool, PoolConfig
    from parley.protocols.bus import BusConfig, Endpoint

    config = PoolConfig(
        max_batch_size=options.max_batch_size,
        max_wait=options.max_wait,
        max_queue=options.max_queue,
    )
    backend = await load_backend(options.backend, options.model, **dict(options.backend_options))
    pool = InferencePool({options.policy: backend}, config)
    # Room for every waiting and running request, so the pool (not the bus) says when it
    # is overloaded, with its own retryable error.
    bus = BusConfig(max_handlers=config.max_queue + config.max_in_flight + config.max_batch_size)
    endpoint = Endpoint(POOL_ENDPOINT, config=bus)
    runner = None
    try:
        await pool.start()
        pool.serve(endpoint)
        address = await endpoint.bind(options.listen)
        url = ""
        if options.http:
            from parley.arena.inference.http import serve_http

            host, _, port = options.http.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"--http must be HOST:PORT, got {options.http!r}")
            runner, url = await serve_http(pool, host, int(port))
        yield address, url
    finally:
        await pool.close()
        if runner is not None:
            await runner.cleanup()
        await endpoint.close()


async def _serve(options: ServeOptions) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serving(options) as (address, url):
        # Machine-readable first lines: scripts and tests read the addresses from here.
        print(f"pool listening on {address}", flush=True)
        if url:
            print(f"openai api on {url}", flush=True)
        await stop.wait()
    print("pool closed", flush=True)


def main(args: argparse.Namespace) -> int:
    """Serve until interrupted; exit status 2 on a bad configuration."""
    from parley.arena.cli.run import parse_assignments

    try:
        options = ServeOptions(
            model=args.model,
            backend=args.backend,
            listen=args.listen,
            http=args.http or "",
            policy=args.policy,
            max_batch_size=args.max_batch_size,
            max_wait=args.max_wait,
            max_queue=args.max_queue,
            backend_options=tuple(
                parse_assignments(args.backend_option, "--backend-option").items()
            ),
        )
        asyncio.run(_serve(options))
    except ConfigError as exc:
        print(f"parley serve: {exc}", file=sys.stderr)
        return 2
    except ParleyError as exc:  # the model would not load, the address is taken, ...
        print(f"parley serve: {exc}", file=sys.stderr)
        return 1
    return 0
