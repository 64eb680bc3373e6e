"""``llm:PATH[?key=value&...]`` agent specs: seats played by a model through the pool.

``parley run SCENARIO --agents llm:models/tiny,scripted`` plays the first seat with an
:class:`~parley.agents.llm.LLMAgent` on the model at ``models/tiny``. Where the pool is:

- ``agent_options["pool"]`` (``parley run --pool ADDRESS``) is a bus address
  (``tcp://host:5557``, ``ipc:///tmp/pool``) of a pool started by ``parley serve``: the
  agents of this process share one bus client connected there.
- ``agent_options["pool"]`` is an object with ``async generate(request)`` (an
  :class:`~parley.arena.inference.pool.InferencePool`, a client): the agents use it directly.
- Otherwise an in-process pool is started on first use, with the backend named by
  ``backend=`` (default ``transformers``) loading ``PATH``. Seats and runs in the same event
  loop that name the same model and backend share it, so their requests batch together.
  :func:`close_shared_pools` closes those pools (the CLI commands call it at the end).

Query keys (all optional): ``policy``, ``temperature``, ``top_p``, ``max_tokens``,
``max_prompt_tokens``, ``request_timeout`` (fields of
:class:`~parley.agents.llm.LLMAgentConfig`), ``backend`` (``transformers`` / ``vllm`` /
``openai``), ``device`` (transformers backend), ``max_batch_size`` and ``max_wait`` (fields
of :class:`~parley.arena.inference.pool.PoolConfig`). The in-process pool serves the model under the
agent's ``policy`` name.

Per-seat LoRA adapters: ``llm:BASE?adapter=DIR[&policy=NAME]`` plays the seat with the
PEFT adapter directory ``DIR`` on the model ``BASE``, served under the policy ``NAME``
(default: the adapter directory's name, so ``OUT/checkpoints/<policy>`` keeps its name).
In-process, every seat naming the same ``BASE``, ``backend`` and backend options shares
ONE backend and pool (started with the first such seat's pool settings; the base itself is
served under the policy ``BASE``), each adapter is loaded once, and the seats' requests
batch together. Two different adapter directories under one policy name are refused. With
a pool elsewhere (``--pool ADDRESS`` or a pool object) the adapter is not loaded here: that
pool must serve the policy already (``parley serve --adapter NAME=DIR``). With
``backend=vllm`` the engine is sized when it starts: ``max_loras`` adapters (default 4) of
rank at most ``max_lora_rank`` (default: the first seat's adapter rank, at least 16).

System prompt: the agent is told ``system_prompt(seat)`` of the scenario (taken from an
instance the resolver makes once), unless an observation's ``info["system_prompt"]``
overrides it. ``system_prompt=none`` sends none: evaluate a policy with the prompt it was
trained with (the referential recipe trains without one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any
from urllib.parse import parse_qsl

import msgspec

from parley.agents.llm import (
    BusPoolClient,
    LLMAgent,
    LLMAgentConfig,
    PoolClient,
)
from parley.arena.inference.patience import patient_wait_for
from parley.arena.inference.pool import InferencePool, PoolConfig
from parley.arena.run.agent_specs import AgentSource, SeatContext
from parley.protocols.errors import (
    ConfigError,
    ParleyError,
    PeerDead,
    RemoteError,
    RequestTimeout,
)
from parley.protocols.messages import GenerateRequest, GenerateResult

__all__ = [
    "resolve_llm",
    "close_shared_pools",
    "shared_pool",
    "check_pool",
    "check_llm_pools",
    "PoolUnreachable",
]

_POOL_KEYS = {"max_batch_size", "max_wait"}
_BACKEND_KEYS = {"backend", "device", "max_loras", "max_lora_rank"}
_VLLM_LORA_KEYS = ("max_loras", "max_lora_rank")
DEFAULT_MAX_LORAS = 4
"""Adapters an in-process vLLM engine started for ``llm:BASE?adapter=`` seats can hold
(``max_loras=N`` in the spec raises it; vLLM fixes it when the engine starts)."""
_ADAPTER_KEY = "adapter"
_AGENT_KEYS = {f.name for f in dataclasses.fields(LLMAgentConfig)} - {"stop"}


@dataclasses.dataclass(frozen=True)
class LLMSpec:
    """A parsed ``llm:`` spec."""

    model: str
    agent: LLMAgentConfig
    backend: str = "transformers"
    backend_options: tuple[tuple[str, str], ...] = ()
    pool: PoolConfig = dataclasses.field(default_factory=PoolConfig)
    system_prompt: bool = True
    """Tell the agent the scenario's system prompt for its seat (``system_prompt=none``: no)."""
    adapter: str = ""
    """A PEFT LoRA adapter directory played on ``model`` ("" = the plain model)."""


_SYSTEM_PROMPT_VALUES = {"scenario": True, "none": False}


def parse_llm_spec(arg: str) -> LLMSpec:
    """Parse the text after ``llm:`` (``PATH`` and an optional ``?key=value&...``)."""
    path, _, query = arg.partition("?")
    if not path:
        raise ConfigError("an llm agent spec needs a model: llm:PATH (a Hugging Face model dir)")
    agent: dict[str, str] = {}
    pool: dict[str, str] = {}
    backend = "transformers"
    backend_options: list[tuple[str, str]] = []
    system_prompt = True
    adapter = ""
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if key == "system_prompt":
            if value not in _SYSTEM_PROMPT_VALUES:
                raise ConfigError(f"system_prompt={value!r} in llm:{arg}; use scenario or none")
            system_prompt = _SYSTEM_PROMPT_VALUES[value]
        elif key == _ADAPTER_KEY:
            if not value:
                raise ConfigError(f"adapter= in llm:{arg} needs a PEFT adapter directory")
            adapter = value
        elif key in _AGENT_KEYS:
            agent[key] = value
        elif key in _POOL_KEYS:
            pool[key] = value
        elif key == "backend":
            backend = value
        elif key in _BACKEND_KEYS:
            backend_options.append((key, value))
        else:
            known = sorted(_AGENT_KEYS | _POOL_KEYS | _BACKEND_KEYS | {"system_prompt", "adapter"})
            raise ConfigError(f"unknown key {key!r} in llm:{arg}; known keys: {known}")
    if adapter and "policy" not in agent:
        agent["policy"] = PurePath(adapter).name or adapter
    try:
        # strict=False: query values are strings; convert "0.7" -> 0.7, "32" -> 32.
        agent_config = msgspec.convert(agent, LLMAgentConfig, strict=False)
        pool_config = msgspec.convert(pool, PoolConfig, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"bad value in llm:{arg}: {exc}") from exc
    lora_keys = sorted({key for key, _ in backend_options} & set(_VLLM_LORA_KEYS))
    if lora_keys and not (backend == "vllm" and adapter):
        raise ConfigError(
            f"{', '.join(lora_keys)} in llm:{arg} size vLLM's adapter slots: they go "
            "with backend=vllm and adapter=DIR"
        )
    options = tuple(backend_options)
    return LLMSpec(path, agent_config, backend, options, pool_config, system_prompt, adapter)


PoolKey = tuple[str, ...]
_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[PoolKey, _Started]] = (
    weakref.WeakKeyDictionary()
)


class _Started:
    """A pool (or client) being started or started in one event loop."""

    def __init__(self, start: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        self.task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(start())


async def shared_pool(key: PoolKey, start: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """The object ``start()`` makes, made once per ``key`` per event loop."""
    per_loop = _SHARED.setdefault(asyncio.get_running_loop(), {})
    started = per_loop.get(key)
    if started is None or (started.task.done() and started.task.exception() is not None):
        started = per_loop[key] = _Started(start)
    return await asyncio.shield(started.task)


async def close_shared_pools() -> None:
    """Close the pools and clients :func:`resolve_llm` started in the running loop."""
    per_loop = _SHARED.pop(asyncio.get_running_loop(), {})
    for started in per_loop.values():
        if started.task.done() and started.task.exception() is None:
            await started.task.result().close()
        else:
            started.task.cancel()


class _LazyPool:
    """A :class:`PoolClient` that starts (or connects to) the shared pool on first use."""

    def __init__(self, key: PoolKey, start: Callable[[], Coroutine[Any, Any, PoolClient]]) -> None:
        self._key = key
        self._start = start

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        client: PoolClient = await shared_pool(self._key, self._start)
        return await client.generate(request)


class PoolUnreachable(ConfigError):
    """``parley run --pool ADDRESS`` cannot work: no pool answers there, or it lacks a
    policy the agents need. The message is one line naming the address and what to start."""


CONNECT_TIMEOUT = 30.0
"""Seconds an episode's agents wait for the bus connection to a pool (started or not)."""


def pool_bus_config(options: Mapping[str, Any]) -> Any:
    """The pool client's bus config from ``agent_options``: ``pool_key`` (the pool's public
    key, a ``.key`` file or Z85) and ``pool_client_key`` (this side's ``.key_secret`` file),
    for a pool started with ``parley serve --curve-key``; ``None`` without them."""
    from parley.protocols.keys import client_bus_config

    secret, server = options.get("pool_client_key"), options.get("pool_key")
    try:
        return client_bus_config(secret, server)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (agent options pool_client_key and pool_key)") from exc


def _connect(
    address: str, timeout: float, config: Any = None
) -> Callable[[], Coroutine[Any, Any, PoolClient]]:
    """Connect within ``timeout``; the client's bus requests keep the usual bound (a quick
    start-up check must not shorten every later generation's wait)."""

    async def connect() -> PoolClient:
        client = await BusPoolClient.connect(address, timeout=timeout, config=config)
        client.timeout = CONNECT_TIMEOUT
        return client

    return connect


async def check_pool(
    address: str,
    policies: Sequence[str] = (),
    *,
    timeout: float = 5.0,  # noqa: ASYNC109 - the probe's own bound, not a per-call option
    config: Any = None,
) -> None:
    """Check once that a pool answers at ``address`` and serves ``policies``.

    Raises :class:`PoolUnreachable` within about ``timeout`` seconds when nothing answers
    (instead of every episode waiting :data:`CONNECT_TIMEOUT` to fail). The connection is
    kept: the ``llm:`` agents of this event loop use it. Each policy is probed with a
    request the pool refuses at once (an empty prompt): ``bad_request`` means the policy
    is there (``overloaded`` too: it answered), ``unknown_policy`` that it is not; any other
    answer is reported as it is. A bad address or key (:class:`ConfigError`) is raised as
    it is, not taken for an absent pool.
    """
    try:
        client = await shared_pool(("bus", address), _connect(address, timeout, config))
    except (RequestTimeout, TimeoutError, PeerDead):
        raise PoolUnreachable(
            f"no inference pool answers at {address} within {timeout:g} s; start one with "
            f"`parley serve --model MODEL --listen {address}`, or leave out --pool to load "
            "the model in this process (a pool started with --curve-key needs --pool-key "
            "and --curve-key here, its --client-key listing this side's key)"
        ) from None
    for policy in dict.fromkeys(policies):
        probe = GenerateRequest(policy=policy, prompt="", timeout=timeout)
        try:
            # (patient: a stall of this process is not the pool's silence)
            await patient_wait_for(client.generate(probe), timeout)
        except RemoteError as exc:
            if exc.code == "unknown_policy":
                raise PoolUnreachable(
                    f"the pool at {address} does not serve policy {policy!r} "
                    f"({exc.remote_message}); start it with `parley serve --policy {policy}` "
                    "or set policy= in the llm: spec"
                ) from None
            if exc.code not in ("bad_request", "overloaded"):
                raise PoolUnreachable(
                    f"the pool at {address} answered the probe for policy {policy!r} with "
                    f"{exc.code}: {exc.remote_message}; it cannot serve this run"
                ) from None
        except (RequestTimeout, TimeoutError, PeerDead) as exc:
            raise PoolUnreachable(
                f"the pool at {address} did not answer a probe within {timeout:g} s ({exc}); "
                "is it overloaded or stuck?"
            ) from None


async def check_llm_pools(specs: Mapping[str, str], options: Mapping[str, Any]) -> None:
    """:func:`check_pool` for a run: when ``options["pool"]`` is a bus address and some
    seat's spec (``specs``: seat -> spec) is ``llm:``, check it serves their policies."""
    address = options.get("pool")
    llm = [parse_llm_spec(spec[4:]) for spec in specs.values() if spec.startswith("llm:")]
    if isinstance(address, str) and address and llm:
        config = pool_bus_config(options)
        await check_pool(address, [s.agent.policy for s in llm], config=config)


def _pool_client(spec: LLMSpec, option: Any, options: Mapping[str, Any]) -> PoolClient:
    if option is not None and not isinstance(option, str):
        if not isinstance(option, PoolClient):
            raise ConfigError(
                f"agent_options['pool'] must be a bus address or have async generate(); "
                f"got {type(option).__name__}"
            )
        return option
    if isinstance(option, str) and option:
        config = pool_bus_config(options)
        return _LazyPool(("bus", option), _connect(option, CONNECT_TIMEOUT, config))

    if spec.adapter:
        return _AdapterPool(spec)

    async def start() -> PoolClient:
        from parley.arena.inference.backends import load_backend

        backend = await load_backend(spec.backend, spec.model, **dict(spec.backend_options))
        return await InferencePool({spec.agent.policy: backend}, spec.pool).start()

    key = ("local", spec.backend, spec.model, spec.agent.policy, repr(spec.backend_options))
    return _LazyPool(key, start)


_ADAPTERS: weakref.WeakKeyDictionary[Any, dict[str, tuple[str, asyncio.Task[None]]]] = (
    weakref.WeakKeyDictionary()
)
"""Per shared in-process pool: adapter policy -> (its directory, the task loading it)."""


class _AdapterPool(_LazyPool):
    """A seat's client of the shared pool of its base model: the pool serves the base
    under the policy ``spec.model``; the seat's adapter is loaded into it once."""

    def __init__(self, spec: LLMSpec) -> None:
        key = ("local-adapters", spec.backend, spec.model, repr(spec.backend_options))
        super().__init__(key, self._start_base)
        self._spec = spec
        self._path = str(Path(spec.adapter).resolve())
        if not (Path(self._path) / "adapter_config.json").is_file():
            raise ConfigError(
                f"adapter={spec.adapter} in llm:{spec.model}: no PEFT adapter there (expected "
                "a directory with adapter_config.json, as peft's save_pretrained writes)"
            )

    async def _start_base(self) -> PoolClient:
        from parley.arena.inference.backends import load_backend

        spec = self._spec
        options: dict[str, Any] = dict(spec.backend_options)
        if spec.backend == "vllm":
            # vLLM sizes its adapter slots when the engine starts, before the other seats'
            # adapters are known: DEFAULT_MAX_LORAS of them, of this adapter's rank or 16.
            from parley.arena.inference.backends.vllm_lora import read_adapter

            rank = max(16, read_adapter(self._path).rank)
            for key, default in zip(_VLLM_LORA_KEYS, (DEFAULT_MAX_LORAS, rank), strict=True):
                try:
                    options[key] = int(options.get(key, default))
                except ValueError:
                    raise ConfigError(
                        f"{key}={options[key]!r} in llm:{spec.model}: not a whole number"
                    ) from None
        backend = await load_backend(spec.backend, spec.model, **options)
        return await InferencePool({spec.model: backend}, spec.pool).start()

    async def pool(self) -> InferencePool:
        """The shared pool (started on first use), this seat's adapter not yet loaded."""
        pool: InferencePool = await shared_pool(self._key, self._start)
        return pool

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        pool = await self.pool()
        policy, path = self._spec.agent.policy, self._path
        loads = _ADAPTERS.setdefault(pool, {})
        if policy not in loads:
            task = asyncio.get_running_loop().create_task(
                pool.add_adapter(policy, self._spec.model, path)
            )
            loads[policy] = (path, task)
        loaded, task = loads[policy]
        if loaded != path:
            raise ConfigError(
                f"two adapters under the policy name {policy!r} ({loaded} and {path}); "
                "give one of the llm: specs its own policy="
            )
        await asyncio.shield(task)
        return await pool.generate(request)


def _system_prompt(seat: SeatContext) -> str:
    """The scenario's ``system_prompt(seat)``, from one instance made for the purpose."""
    from parley.scenarios import make

    env = make(seat.scenario)
    try:
        env.reset(seed=0)
        prompt = getattr(env, "system_prompt", None)
        return str(prompt(seat.seat)) if callable(prompt) else ""
    finally:
        env.close()


def resolve_llm(arg: str, seat: SeatContext) -> AgentSource:
    """The ``llm`` agent kind (:data:`parley.arena.run.agent_specs.AGENT_KINDS`)."""
    spec = parse_llm_spec(arg)
    client = _pool_client(spec, seat.options.get("pool"), seat.options)
    from parley.arena.inference.backends.tokenizer import load_tokenizer

    try:
        tokenizer = load_tokenizer(spec.model)
    except ParleyError as exc:
        raise ConfigError(f"llm:{arg}: {exc}") from exc
    system_prompt = _system_prompt(seat) if spec.system_prompt else ""

    def factory() -> LLMAgent:
        return LLMAgent(client, tokenizer, system_prompt=system_prompt, config=spec.agent)

    return factory
