"""``parley serve``: an inference pool that arenas in other processes and hosts connect to.

    parley serve --model models/tiny --backend transformers --listen tcp://127.0.0.1:5557
    parley run negotiation/deal-or-no-deal-v0 --agents llm:models/tiny,scripted \\
        --pool tcp://127.0.0.1:5557

    parley serve --model models/tiny --backend vllm --adapter alice=out/checkpoints/alice \\
        --adapter bob=out/checkpoints/bob --http 127.0.0.1:8000

With ``--adapter NAME=DIR`` (repeatable; a PEFT LoRA adapter directory of the model) the
pool also serves each adapter as the policy ``NAME``, batched with the base and the other
adapters on one model (transformers: one forward pass per step; vLLM: its multi-LoRA
serving, the engine started with ``max_loras`` = the number of adapters and the smallest
``max_lora_rank`` that holds them, unless ``-b`` sets them); ``WeightUpdate`` messages for
``NAME`` replace that adapter only. Adapter directories are checked before the model
loads: a missing or malformed one exits 2.

With ``--reward-model [NAME=]DIR`` (repeatable; a reward model directory, ``parley train-rm``
or TRL's RewardTrainer) the pool also scores texts with it: ``ScoreRequest`` on the bus and
``POST /v1/score`` over HTTP name it ``NAME``, by default the directory's name (what ``parley
run --pool ADDRESS --reward-model DIR`` asks for). Concurrent score requests run as one
batch. A directory without a model exits 2 before anything loads.

The pool answers ``GenerateRequest``, ``ScoreRequest`` and ``WeightUpdate`` on the bus
under the endpoint name ``pool``; with ``--http HOST:PORT`` it also serves the OpenAI-compatible API
(:mod:`parley.arena.inference.http`). It runs until interrupted (Ctrl-C / SIGTERM), then
answers what is still waiting with ``closed`` and exits 0. If its backend fails for good
(the vLLM engine process died) it answers the waiting requests, prints the reason and
exits 1, so that clients fail fast and a supervisor can restart it, rather than serving
``backend_failed`` forever.
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

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    from parley.arena.cli.common import add_peer_timeout

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
    p.add_argument(
        "--curve-key",
        metavar="FILE",
        help="the pool's CURVE secret key file: tcp is encrypted and admits only --client-key",
    )
    p.add_argument(
        "--client-key",
        action="append",
        default=[],
        metavar="FILE",
        help="public key file of a client allowed to connect (with --curve-key); repeatable",
    )
    p.add_argument(
        "--weights-key",
        action="append",
        default=[],
        metavar="FILE",
        help="public key file of a trainer allowed to change weights over the bus (with "
        "--curve-key; repeatable). Without it a CURVE pool takes no weights over the bus: its "
        "clients may generate only",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow --listen on a non-loopback tcp address without keys (plain text), and --http "
        "on a non-loopback host (no authentication)",
    )
    p.add_argument("--policy", default="default", help="policy name the model serves under")
    p.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also serve the PEFT LoRA adapter in DIR as policy NAME (transformers, vllm); "
        "repeatable",
    )
    p.add_argument(
        "--reward-model",
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="also serve the reward model in DIR (parley train-rm) for score requests on the "
        "bus and /v1/score, named NAME (default: the directory's name); repeatable",
    )
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
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="serve from pool replicas on Ray (a cluster address, or none for a local Ray; "
        "pip install 'parley[ray]')",
    )
    p.add_argument("--replicas", type=int, default=1, help="pool replicas on Ray (with --ray)")
    p.add_argument(
        "--routing",
        choices=("cache_aware", "least_busy"),
        default="cache_aware",
        help="how requests pick a replica (with --ray): cache_aware (default: a session's later "
        "turns go where its prefix is cached, unless that replica is overloaded) or least_busy",
    )
    add_peer_timeout(p)
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
    curve_key: str = ""
    """The pool's CURVE secret key file; its ``tcp://`` bind then admits only ``client_keys``."""
    client_keys: tuple[str, ...] = ()
    """Public key files (or Z85 keys) of the clients a CURVE pool admits."""
    weights_keys: tuple[str, ...] = ()
    """Public key files (or Z85 keys) of the trainers a CURVE pool takes weight updates
    from (they are admitted too); none: a CURVE pool takes no weights over the bus."""
    insecure: bool = False
    """Allow a non-loopback ``tcp://`` listen address without CURVE keys (plain text)."""
    ray: str | None = None
    """Serve from :class:`~parley.arena.inference.ray_pool.RayPool` replicas on the Ray
    cluster at this address (``local``: a local Ray); ``None``: one in-process pool."""
    replicas: int = 1
    """Pool replicas on Ray (with ``ray``), one GPU each where the cluster has GPUs."""
    routing: str = "cache_aware"
    """How a request picks a replica (with ``ray``; :mod:`~parley.arena.inference.routing`):
    ``cache_aware`` or ``least_busy``."""
    adapters: tuple[tuple[str, str], ...] = ()
    """(policy name, PEFT adapter directory) pairs served on the model next to ``policy``."""
    peer_timeout: float = 60.0
    """Seconds a client whose connection is open may stay silent before the pool gives it up
    (``BusConfig.peer_timeout``; a client whose connection closed is gone within seconds)."""
    reward_models: tuple[tuple[str, str], ...] = ()
    """(name, reward model directory) pairs the pool scores texts with."""

    def check_reward_models(self) -> None:
        """Check the reward model options and directories (before any model loads)."""
        from parley.arena.inference.backends.scorer import check_reward_model_dir

        if self.reward_models and self.ray is not None:
            raise ConfigError("--reward-model is not served with --ray yet: use one pool")
        names = [name for name, _ in self.reward_models]
        for name, path in self.reward_models:
            if names.count(name) > 1:
                raise ConfigError(f"two reward models named {name!r}: give one NAME=DIR")
            check_reward_model_dir(path)

    def check_adapters(self) -> dict[str, Any]:
        """Check the adapter options and directories (before any model loads); return the
        backend options they need (vLLM: ``max_loras`` and ``max_lora_rank``)."""
        from parley.arena.inference.backends.vllm_lora import read_adapter

        if not self.adapters:
            return {}
        if self.ray is not None:
            raise ConfigError("--adapter is not served with --ray yet: use one pool")
        if self.backend not in ("transformers", "vllm"):
            raise ConfigError(f"--adapter needs --backend transformers or vllm, not {self.backend}")
        names = [name for name, _ in self.adapters]
        for name in names:
            if not name or name == self.policy or names.count(name) > 1:
                raise ConfigError(
                    f"adapter name {name!r} is empty, the base's --policy or given twice"
                )
        ranks = [read_adapter(path).rank for _, path in self.adapters]
        if self.backend != "vllm":
            return {}
        given = dict(self.backend_options)
        return {
            "max_loras": given.get("max_loras") or len(self.adapters),
            "max_lora_rank": given.get("max_lora_rank") or max(ranks),
        }

    def bus_security(self) -> dict[str, Any]:
        """The :class:`~parley.protocols.bus.BusConfig` fields for these keys."""
        from parley.arena.inference.pool import POOL_ACCEPTS
        from parley.protocols.bus.auth import is_loopback
        from parley.protocols.keys import load_public_key, load_secret_key

        if not self.curve_key:
            if self.client_keys or self.weights_keys:
                raise ConfigError(
                    "--client-key and --weights-key need --curve-key (the pool's secret key file)"
                )
            tcp = self.listen.startswith("tcp://")
            if tcp and not self.insecure and not is_loopback(self.listen):
                raise ConfigError(
                    f"refusing to serve on {self.listen} without CURVE keys: anyone who can "
                    "reach it could use the pool and replace its weights. Make keys "
                    "(parley keys new pool CLIENT) and pass --curve-key/--client-key, "
                    "or --insecure on a network you trust"
                )
            # Without CURVE, every client may change weights (loopback or --insecure).
            return {"allow_insecure_tcp": self.insecure, "accept": POOL_ACCEPTS}
        if not self.client_keys and not self.weights_keys:
            raise ConfigError("with --curve-key, list the clients it admits (--client-key)")
        public, secret = load_secret_key(self.curve_key)
        clients = (*self.client_keys, *self.weights_keys)
        return {
            "curve_public_key": public,
            "curve_secret_key": secret,
            "curve_allowed_clients": tuple(load_public_key(k) for k in clients),
            "allow_insecure_tcp": self.insecure,
            # With CURVE, only --weights-key clients may change weights: without one, no one.
            "accept": POOL_ACCEPTS if self.weights_keys else frozenset({"generate", "score"}),
        }

    def weights_from(self) -> frozenset[str] | None:
        """:meth:`PoolService.serve`'s ``weights_keys``: ``None`` (anyone) without CURVE."""
        from parley.protocols.keys import load_public_key

        if not self.curve_key:
            return None
        return frozenset(load_public_key(k).decode() for k in self.weights_keys)


@contextlib.asynccontextmanager
async def serving(options: ServeOptions) -> AsyncIterator[tuple[str, str, Any]]:
    """Start the pool, its bus endpoint and the HTTP front; yield (bus address, HTTP URL,
    the :class:`~parley.arena.inference.pool.InferencePool`).

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
    pool: Any
    if options.ray is not None:
        from parley.arena.inference.ray_pool import RayPool, ReplicaSpec
        from parley.arena.run.ray_runner import init_ray

        if options.http:
            raise ConfigError("--http is not served with --ray yet: use the bus front")
        init_ray(options.ray)
        spec = ReplicaSpec(options.backend, options.model, options.policy,
                           options.backend_options, config)  # fmt: skip
        pool = RayPool(spec, options.replicas, routing=options.routing)
    else:
        backend_options = {**dict(options.backend_options), **options.check_adapters()}
        backend = await load_backend(options.backend, options.model, **backend_options)
        pool = InferencePool({options.policy: backend}, config)
    # Room for every waiting and running request, so the pool (not the bus) says when it
    # is overloaded, with its own retryable error.
    bus = BusConfig(
        max_handlers=config.max_queue + config.max_in_flight + config.max_batch_size,
        peer_timeout=options.peer_timeout,
        **options.bus_security(),
    )
    endpoint = Endpoint(POOL_ENDPOINT, config=bus)
    runner = None
    try:
        await pool.start()
        for name, path in options.adapters:
            await pool.add_adapter(name, options.policy, path)
        await _add_reward_models(pool, options)
        pool.serve(endpoint, weights_keys=options.weights_from())
        address = await endpoint.bind(options.listen)
        url = ""
        if options.http:
            from parley.arena.inference.http import serve_http

            host, _, port = options.http.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"--http must be HOST:PORT, got {options.http!r}")
            runner, url = await serve_http(pool, host, int(port))
        yield address, url, pool
    finally:
        await pool.close()
        if runner is not None:
            await runner.cleanup()
        await endpoint.close()


async def _add_reward_models(pool: Any, options: ServeOptions) -> None:
    """Load each ``--reward-model`` (in a worker thread) and serve it by its name, on the
    backend's ``device`` option (cpu without one)."""
    from parley.arena.inference.backends.scorer import SequenceScorer

    device = str(dict(options.backend_options).get("device") or "cpu")
    for name, path in options.reward_models:
        pool.add_scorer(name, await asyncio.to_thread(SequenceScorer.load, path, device=device))


async def _serve(options: ServeOptions) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serving(options) as (address, url, pool):
        # Machine-readable first lines: scripts and tests read the addresses from here.
        print(f"pool listening on {address}", flush=True)
        if url:
            print(f"openai api on {url}", flush=True)
        if options.ray is not None:
            print(f"policy {options.policy!r}: {options.replicas} {options.backend} replicas "
                  f"on Ray ({options.routing} routing), {options.model}", flush=True)  # fmt: skip
        else:
            backend = pool.backend(options.policy)
            print(
                f"policy {options.policy!r}: {options.backend} backend, {options.model}, "
                f"dtype {backend.dtype or 'unknown'}",
                flush=True,
            )
            for name, path in options.adapters:
                print(f"policy {name!r}: adapter {path} on {options.policy!r}", flush=True)
            for name, path in options.reward_models:
                print(f"reward model {name!r}: {path}", flush=True)
        watch = loop.create_task(_watch(pool, stop))
        await stop.wait()
        watch.cancel()
        failure = next((b.failure for b in pool.backends if b.failure), "")
    print("pool closed", flush=True)
    if failure:
        raise BackendDied(failure)


class BackendDied(ParleyError):
    """The backend can serve nothing any more (its engine died); ``parley serve`` exits 1."""


async def _watch(pool: Any, stop: asyncio.Event, every: float = 1.0) -> None:
    """Stop serving when a backend has failed for good: a pool that can only answer
    ``backend_failed`` is worse than none (clients fail fast and a supervisor restarts it)."""
    while not stop.is_set():
        if any(b.failure for b in pool.backends):
            stop.set()
            return
        await asyncio.sleep(every)


def _reward_model_option(text: str) -> tuple[str, str]:
    """``NAME=DIR``, or ``DIR`` named by
    :func:`~parley.arena.run.model_rewards.reward_model_name`."""
    from parley.arena.run.model_rewards import reward_model_name

    name, eq, path = text.partition("=")
    if eq and name.strip() and path.strip() and "/" not in name:
        return name.strip(), path.strip()
    return reward_model_name(text.strip()), text.strip()


def _adapter_option(text: str) -> tuple[str, str]:
    name, eq, path = text.partition("=")
    if not eq or not name.strip() or not path.strip():
        raise ConfigError(f"--adapter takes NAME=DIR, got {text!r}")
    return name.strip(), path.strip()


def main(args: argparse.Namespace) -> int:
    """Serve until interrupted; exit status 2 on a bad configuration."""
    from parley.arena.cli.run import parse_assignments
    from parley.protocols.bus import BusConfig

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
            curve_key=args.curve_key or "",
            client_keys=tuple(args.client_key),
            weights_keys=tuple(args.weights_key),
            insecure=args.insecure,
            ray=args.ray,
            replicas=args.replicas,
            routing=args.routing,
            adapters=tuple(_adapter_option(a) for a in args.adapter),
            peer_timeout=args.peer_timeout,
            reward_models=tuple(_reward_model_option(r) for r in args.reward_model),
        )
        BusConfig(peer_timeout=options.peer_timeout)  # a bad --peer-timeout exits 2 here
        options.bus_security()  # bad keys are a configuration error, before any loading
        options.check_adapters()  # so are missing or malformed adapter directories
        options.check_reward_models()  # and reward model directories without a model
        if options.http:  # an HTTP front off loopback needs --insecure, before any loading
            from parley.arena.inference.http_guard import check_http_bind

            check_http_bind(options.http, insecure=options.insecure)
        asyncio.run(_serve(options))
    except ConfigError as exc:
        print(f"parley serve: {exc}", file=sys.stderr)
        return 2
    except ParleyError as exc:  # the model would not load, the address is taken, the
        # engine died, ...
        print(f"parley serve: {exc}", file=sys.stderr)
        return 1
    return 0
