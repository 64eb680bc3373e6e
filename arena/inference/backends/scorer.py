"""Sequence scoring: a reward model served by the pool, its calls batched.

A reward model is a one-label ``AutoModelForSequenceClassification`` (what TRL's
RewardTrainer and ``parley train-rm`` save). :class:`SequenceScorer` runs it over lists of
texts; :class:`ScoreBatcher` gathers the score calls that arrive together (from every
episode's reward component, the bus and ``/v1/score``) into one forward pass of at most
``max_batch_texts`` texts, the way a static lane of the pool batches generations.

Texts are content, never control: a text that spells one of the tokenizer's special tokens
(``<|end|>``) is tokenized as ordinary characters.

:func:`score_client` is how a run's ``rm`` reward component
(:class:`~parley.arena.run.model_rewards.ScoredReward`) reaches its reward model: the pool at
``--pool ADDRESS`` (a :class:`~parley.protocols.messages.ScoreRequest` on the bus), a pool
object, or one loaded in this process and shared by the run's episodes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parley.arena.inference.backends.tokenizer import HFChatTokenizer
from parley.protocols.errors import ConfigError, require

__all__ = [
    "SequenceScorer",
    "ScoreBatcher",
    "check_score_pool",
    "load_reward_model",
    "score_client",
    "score_texts",
]


def load_reward_model(path: str | Path, *, device: str = "cpu") -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a checkpoint directory, as a one-label sequence classifier.

    A reward model directory loads with its trained head; a causal LM directory gets a new,
    randomly initialised head (seed it with :func:`torch.random.fork_rng` around this call).
    The tokenizer pads on the right, and the model's ``pad_token_id`` is the tokenizer's, so
    the head reads the last real token."""
    transformers: Any = require("transformers", "torch")
    from parley.arena.inference.backends.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(path)).hf
    tokenizer.padding_side = "right"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(path), num_labels=1, pad_token_id=tokenizer.pad_token_id
    )
    return model.to(device), tokenizer


def score_texts(model: Any, tokenizer: Any, texts: Sequence[str], *, max_length: int = 1024) -> Any:
    """The model's score of each text, a float tensor ``(len(texts),)`` (gradients kept:
    wrap in ``torch.no_grad()`` to serve). Texts longer than ``max_length`` tokens keep
    their first ``max_length``. The texts are content, never control: one that spells an
    added token (``<|end|>``, or ``</think>``, which is not special) gets ordinary tokens
    (:meth:`HFChatTokenizer.ordinary_ids`)."""
    rows = tokenizer(list(texts), add_special_tokens=False, split_special_tokens=True)["input_ids"]
    added = (getattr(tokenizer, "added_tokens_decoder", None) or {}).keys()
    if added and not all(added.isdisjoint(row) for row in rows):
        quoting = HFChatTokenizer(tokenizer)  # (split_special_tokens leaves non-special ones)
        rows = [
            row if added.isdisjoint(row) else quoting.ordinary_ids(text)
            for row, text in zip(rows, texts, strict=True)
        ]
    left = getattr(tokenizer, "truncation_side", "right") == "left"
    rows = [list(row[-max_length:] if left else row[:max_length]) for row in rows]
    batch = tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt")
    return model(**batch.to(next(model.parameters()).device)).logits[:, 0]  # (B, 1) -> (B,)


def check_reward_model_dir(path: str | Path) -> None:
    """Raise :class:`ConfigError` with the fix when ``path`` holds no model."""
    if not (Path(path) / "config.json").is_file():
        raise ConfigError(
            f"no reward model at {str(path)!r} (no config.json); train one with "
            "`parley train-rm --data prefs.jsonl --model DIR --out DIR`"
        )


class SequenceScorer:
    """A reward model in memory: ``score(texts)`` -> one float per text.

    ``version`` is the weights version results are tagged with (0: as loaded)."""

    kind = "reward-model"

    def __init__(
        self, model: Any, tokenizer: Any, *, max_length: int = 1024, version: int = 0
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.version = version

    @classmethod
    def load(cls, path: str | Path, *, device: str = "cpu", max_length: int = 1024) -> Any:
        """The reward model saved in the directory ``path`` (blocking)."""
        check_reward_model_dir(path)
        model, tokenizer = load_reward_model(path, device=device)
        return cls(model, tokenizer, max_length=max_length)

    def score(self, texts: Sequence[str]) -> list[float]:
        """One score per text, in order (blocking: run it in a worker thread)."""
        torch: Any = require("torch", "torch")
        with torch.no_grad():
            scores = score_texts(self.model, self.tokenizer, texts, max_length=self.max_length)
        return [float(s) for s in scores]


@dataclass(eq=False)
class _Call:
    texts: list[str]
    future: asyncio.Future[list[float]] = field(repr=False)


class ScoreBatcher:
    """Batches concurrent :meth:`score` calls on one scorer: the first call waits up to
    ``max_wait`` seconds for others, then up to ``max_batch_texts`` texts (whole calls; a
    call larger than that runs alone) go to the scorer in one worker-thread call.

    Every call gets its scores or the scorer's exception; a cancelled caller's texts are
    dropped if they have not started."""

    def __init__(self, scorer: Any, *, max_batch_texts: int = 64, max_wait: float = 0.005):
        self.scorer = scorer
        self.max_batch_texts = max_batch_texts
        self.max_wait = max_wait
        self.batches = 0
        """Scorer calls made (each one forward pass over a batch)."""
        self._queue: deque[_Call] = deque()
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    async def score(self, texts: Sequence[str]) -> list[float]:
        """The scores of ``texts``, batched with whatever else is waiting."""
        loop = asyncio.get_running_loop()
        if self._worker is None:
            self._wake = asyncio.Event()
            self._worker = loop.create_task(self._loop())
        call = _Call(list(texts), loop.create_future())
        self._queue.append(call)
        assert self._wake is not None
        self._wake.set()
        return await call.future

    async def _loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            deadline = loop.time() + self.max_wait
            while self._size() < self.max_batch_texts and (left := deadline - loop.time()) > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
            batch = self._take()
            if batch:
                await self._run(batch)

    def _size(self) -> int:
        return sum(len(c.texts) for c in self._queue)

    def _take(self) -> list[_Call]:
        batch: list[_Call] = []
        size = 0
        while self._queue and (
            not batch or size + len(self._queue[0].texts) <= self.max_batch_texts
        ):
            call = self._queue.popleft()
            if not call.future.done():  # a caller that went away: its texts are not run
                batch.append(call)
                size += len(call.texts)
        return batch

    async def _run(self, batch: list[_Call]) -> None:
        texts = [t for call in batch for t in call.texts]
        self.batches += 1
        try:
            scores = await asyncio.to_thread(self.scorer.score, texts)
        except Exception as exc:  # every caller gets the failure as its answer
            for call in batch:
                if not call.future.done():
                    call.future.set_exception(exc)
            return
        start = 0
        for call in batch:
            end = start + len(call.texts)
            if not call.future.done():
                call.future.set_result(scores[start:end])
            start = end

    async def close(self) -> None:
        """Stop the worker; calls still waiting get :class:`asyncio.CancelledError`."""
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        while self._queue:
            self._queue.popleft().future.cancel()


async def score_client_connection(address: str, config: Any = None) -> Any:
    """The bus client of this event loop connected to the pool at ``address`` (the ``llm:``
    seats' own, made on first use)."""
    from parley.agents.llm import BusPoolClient
    from parley.arena.inference.llm_spec import CONNECT_TIMEOUT, shared_pool

    async def start() -> BusPoolClient:
        return await BusPoolClient.connect(address, timeout=CONNECT_TIMEOUT, config=config)

    return await shared_pool(("bus", address), start)


def score_client(
    path: str,
    options: Mapping[str, Any],
    timeout: float = 60.0,
) -> Callable[[list[str]], Awaitable[list[float]]]:
    """The scoring function of the reward model directory ``path`` for a run whose
    ``agent_options`` are ``options`` (``SCORE_CLIENT`` of :mod:`parley.arena.run.model_rewards`):

    - ``options["pool"]`` a bus address: :class:`ScoreRequest` to the pool there (``parley
      serve --reward-model DIR``), which serves it under the directory's name; the
      connection is the ``llm:`` seats' (one per address and event loop);
    - ``options["pool"]`` an object with ``async score(ScoreRequest)`` (an
      :class:`~parley.arena.inference.pool.InferencePool`): that pool, the same name;
    - otherwise the model is loaded here on first use (blocking load in a worker thread),
      once per event loop, and every episode's calls go through one :class:`ScoreBatcher`
      (closed by ``close_shared_pools``).

    Each call gives one score per text or raises (the pool's error, a timeout)."""
    from parley.arena.inference.llm_spec import pool_bus_config, shared_pool
    from parley.arena.run.model_rewards import reward_model_name
    from parley.protocols.messages import ScoreRequest, ScoreResult

    name = reward_model_name(path)
    pool = options.get("pool")
    if isinstance(pool, str) and pool:
        config = pool_bus_config(options)

        async def over_bus(texts: list[str]) -> list[float]:
            client = await score_client_connection(pool, config)
            asked = ScoreRequest(model=name, texts=texts, timeout=timeout)
            reply = await client.endpoint.request(client.pool, asked, timeout=timeout + 5.0)
            if not isinstance(reply, ScoreResult):
                raise ConfigError(f"the pool at {pool} answered a score request with {reply!r}")
            return list(reply.scores)

        return over_bus
    if pool is not None and not isinstance(pool, str):
        if not callable(getattr(pool, "score", None)):
            raise ConfigError(
                f"agent_options['pool'] must be a bus address or a pool with async score() for "
                f"a reward model; got {type(pool).__name__}"
            )

        async def in_pool(texts: list[str]) -> list[float]:
            asked = ScoreRequest(model=name, texts=texts, timeout=timeout)
            return list((await pool.score(asked)).scores)

        return in_pool
    check_reward_model_dir(path)  # named now, not at the first episode
    device = str(options.get("device", "cpu"))

    async def load() -> ScoreBatcher:
        scorer = await asyncio.to_thread(SequenceScorer.load, path, device=device)
        return ScoreBatcher(scorer)

    key = ("scorer", str(Path(path).resolve()), device)

    async def in_process(texts: list[str]) -> list[float]:
        batcher: ScoreBatcher = await shared_pool(key, load)
        return await batcher.score(texts)

    return in_process


async def check_score_pool(
    path: str,
    options: Mapping[str, Any],
    *,
    timeout: float = 5.0,  # noqa: ASYNC109 - the probe's own bound, not a per-call option
) -> None:
    """When ``options["pool"]`` is a bus address, check once that a pool answers there and
    serves the reward model ``path`` names (a probe with no texts, which a pool refuses at
    once: ``bad_request`` means the model is there); raises
    :class:`~parley.arena.inference.llm_spec.PoolUnreachable` naming what to start."""
    from parley.arena.inference.llm_spec import PoolUnreachable, check_pool, pool_bus_config
    from parley.arena.run.model_rewards import reward_model_name
    from parley.protocols.errors import RemoteError
    from parley.protocols.messages import ScoreRequest

    address = options.get("pool")
    if not isinstance(address, str) or not address:
        return
    config = pool_bus_config(options)
    await check_pool(address, config=config, timeout=timeout)  # connects, or says none is there
    name = reward_model_name(path)
    client = await score_client_connection(address, config)
    try:
        probe = ScoreRequest(model=name, texts=[], timeout=timeout)
        await client.endpoint.request(client.pool, probe, timeout=timeout)
    except RemoteError as exc:
        if exc.code != "bad_request":
            raise PoolUnreachable(
                f"the pool at {address} does not score with reward model {name!r} "
                f"({exc.code}: {exc.remote_message}); start it with `parley serve --model "
                f"MODEL --reward-model {name}=DIR`"
            ) from None
