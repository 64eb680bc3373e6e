"""LLM agents: a seat played by a language model through the inference pool.

An :class:`LLMAgent` keeps the chat of its episode (system prompt, then one user message
per observation and one assistant message per action), fits it into a token budget, asks
the pool for one completion and returns it as the action. What the model saw and produced
is recorded exactly, per turn, in ``Action.tokens`` (prompt token ids, generated token ids,
their logprobs, the policy and its version): trainers use these and never re-tokenise the
chat, which is known to break convergence.

The pool is anything with ``async generate(GenerateRequest) -> GenerateResult``
(:class:`PoolClient`): :class:`BusPoolClient` asks the pool over the bus (the endpoint
named ``"pool"``, in this process over ``inproc://`` or in another one over ``ipc://`` /
``tcp://``), and ``parley.arena.inference.pool.InferencePool`` itself is one (in-process, no bus).

Constraints: when the scenario puts ``infos[agent]["constraint"]`` (the fields of
:class:`~parley.protocols.messages.Constraint`) in the observation's ``info``, the request
carries it, so the backend can only produce a valid action. Output that still does not
parse is returned as it is: the scenario records an invalid move, which is data, not an
error. Infrastructure failures (the pool timed out, went away) raise: the runner records
the episode as failed, never as a reward of 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec
import numpy as np

from parley.agents.base import Agent
from parley.protocols.errors import ConfigError, ParleyError, RemoteError
from parley.protocols.messages import (
    Action,
    Completion,
    Constraint,
    GenerateRequest,
    GenerateResult,
    Observation,
    SamplingParams,
    TokenRecord,
)

if TYPE_CHECKING:
    from parley.protocols.bus import Endpoint

__all__ = [
    "PoolClient",
    "ChatTokenizer",
    "BusPoolClient",
    "LLMAgentConfig",
    "LLMAgent",
    "parse_action",
    "generate_with_retry",
]


@runtime_checkable
class PoolClient(Protocol):
    """Anything that answers generate requests: a bus client or the pool itself."""

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """One result for ``request``; raises when the pool cannot answer."""
        ...


class ChatTokenizer(Protocol):
    """The tokenizer surface an LLM agent needs (the backends' tokenizers have it)."""

    def encode_chat(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of a chat rendered through the model's chat template."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``."""
        ...


def _is_retryable(exc: BaseException) -> bool:
    """Overload is the one failure worth retrying unchanged (the pool said so)."""
    if getattr(exc, "retryable", False):
        return True
    return isinstance(exc, RemoteError) and exc.code == "overloaded"


async def generate_with_retry(
    client: PoolClient,
    request: GenerateRequest,
    *,
    retries: int = 6,
    backoff: float = 0.05,
) -> GenerateResult:
    """``client.generate(request)``, retrying retryable failures (``overloaded``) with
    exponential backoff (``backoff``, 2x, 4x, ... seconds) at most ``retries`` times."""
    for attempt in range(retries + 1):
        try:
            return await client.generate(request)
        except ParleyError as exc:
            if attempt == retries or not _is_retryable(exc):
                raise
        await asyncio.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


class BusPoolClient:
    """Asks the pool over the bus: ``endpoint.request(pool, GenerateRequest)``.

    ``timeout`` bounds each bus request; keep it above the requests' own ``timeout`` so
    the pool's ``Error(timeout)`` arrives before the bus gives up. An ``Error`` reply
    raises :class:`~parley.protocols.errors.RemoteError` carrying the pool's code (the bus
    does that).
    Use :meth:`connect` to make a client that owns its endpoint.
    """

    def __init__(
        self, endpoint: Endpoint, pool: str = "pool", *, timeout: float | None = None
    ) -> None:
        self.endpoint = endpoint
        self.pool = pool
        self.timeout = timeout
        self._owns_endpoint = False

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        name: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 - also the client's per-request bound
        context: Any = None,
        config: Any = None,
    ) -> BusPoolClient:
        """A client on a new endpoint connected to the pool at ``address``.

        ``name`` defaults to a unique ``llm-agents-XXXXXXXX``: the pool refuses a second
        live peer with a name it already knows, and many arenas may share one pool.
        ``config`` is the endpoint's :class:`~parley.protocols.bus.BusConfig` (CURVE keys
        for a pool that requires them).
        """
        import uuid

        from parley.protocols.bus import Endpoint

        name = name or f"llm-agents-{uuid.uuid4().hex[:8]}"
        endpoint = Endpoint(name, context=context, config=config)
        try:
            peer = await endpoint.connect(address, timeout=timeout)
        except BaseException:
            await endpoint.close()
            raise
        client = cls(endpoint, peer, timeout=timeout)
        client._owns_endpoint = True
        return client

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        timeout = self.timeout
        if request.timeout > 0:
            # Leave the pool time to send its own timeout error first.
            timeout = max(timeout or 0.0, request.timeout + 5.0)
        reply = await self.endpoint.request(self.pool, request, timeout=timeout)
        if isinstance(reply, GenerateResult):
            return reply
        raise RemoteError(
            "bad_message", f"expected a GenerateResult, got {type(reply).__name__}", peer=self.pool
        )

    async def close(self) -> None:
        """Close the endpoint if this client made it (:meth:`connect`)."""
        if self._owns_endpoint:
            await self.endpoint.close()


@dataclass(frozen=True)
class LLMAgentConfig:
    """How an LLM agent asks for its actions. Validated at construction."""

    policy: str = "default"
    """Pool policy (model or adapter) that plays this agent."""
    temperature: float = 1.0
    """Sampling temperature; 0 is greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_tokens: int = 48
    """Most tokens one action may have."""
    stop: tuple[str, ...] = ()
    """Strings that end an action (cut from the text)."""
    max_prompt_tokens: int = 1024
    """Token budget of the prompt: the oldest turns are folded away to fit it."""
    fold_to: float = 0.5
    """When the prompt is over budget, fold whole old turns until it fits in ``fold_to`` x
    the budget (the system prompt always stays). The default 0.5 folds a block of turns at
    once, so the prompt's beginning changes only every few turns and the inference pool's
    prefix reuse prefills just each turn's new tokens in between (a fold re-prefills what
    it keeps). 1.0 folds just enough: once at the budget every turn folds and changes the
    prompt's beginning, so every turn re-prefills its whole prompt. A chat that stays
    within the budget is sent the same whatever ``fold_to`` is."""
    request_timeout: float = 120.0
    """Seconds the pool may take for one action (``GenerateRequest.timeout``); 0: none."""
    retries: int = 6
    """Retries of an ``overloaded`` pool, with exponential backoff from ``backoff``."""
    backoff: float = 0.05
    """First retry delay, seconds."""
    use_constraints: bool = True
    """Pass the scenario's ``infos["constraint"]`` to the backend."""
    keep_token_ids: bool = False
    """Build each turn's prompt from the previous prompt, the ids the model generated and
    the template's tokens of the new observation, instead of re-encoding the whole chat's
    text: the model sees its own earlier turns exactly as it produced them (what vLLM/SGLang
    RL stacks do), and the prompt extends the previous one token for token, so the pool's
    prefix reuse prefills only the new part. Re-encoding decoded text need not give back
    the same ids (a byte-level token decodes to U+FFFD, BPE merges differently), and every
    such turn is a prefix miss from there on. Special tokens in a reply are left out (as
    from its text). A fold, a new system prompt, a stop string cut from the text or a
    template that does not append turns falls back to the text chat for that turn. The
    recorded prompt ids are always what the model saw; where a reply's ids do not encode
    back from its text, the prompt is not the chat template of the transcript's text, and
    ``parley.arena.training.export`` marks such decisions ``chat_exact`` False (their chat
    found by its text). Off by default: every prompt is then the chat template of the
    text, so exports in text formats (TRL, OpenRLHF, NeMo RL) are token-exact."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.max_prompt_tokens < 8:
            raise ConfigError(f"max_prompt_tokens must be >= 8, got {self.max_prompt_tokens}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 < self.fold_to <= 1:
            raise ConfigError(f"fold_to must be in (0, 1], got {self.fold_to}")

    def replace(self, **changes: Any) -> LLMAgentConfig:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)


def parse_action(text: str, constraint: Constraint | None) -> str:
    """The action a completion stands for: the text without surrounding whitespace.

    With a ``choice`` constraint, a completion that starts with exactly one of the choices
    (followed by whitespace) is that choice. Anything else is returned unchanged: the
    scenario decides whether it is valid and records an invalid move if not.
    """
    action = text.strip()
    if constraint is not None and constraint.type == "choice" and action not in constraint.choices:
        hits = [c for c in constraint.choices if _starts_with_word(action, c)]
        if len(hits) == 1:
            return str(hits[0])
    return action


def _starts_with_word(text: str, word: str) -> bool:
    return text.startswith(word) and text[len(word) :][:1].isspace()


@dataclass
class _Turn:
    role: str
    content: str


@dataclass
class _History:
    turns: list[_Turn] = field(default_factory=list)
    folded: int = 0  # turns at the front no longer shown (only ever grows within an episode)
    # keep_token_ids: the ids the model has seen and produced through its latest completion
    # (None: render the next prompt from the text), under this system prompt.
    ids: list[int] | None = None
    system: str = ""
    latest_system: str = ""  # the system prompt of the newest turn


class LLMAgent(Agent):
    """Plays a seat with a language model served by an inference pool.

    ``system_prompt`` is what the model is told about its seat (the scenario's
    ``system_prompt(agent)``); an observation whose ``info`` carries ``"system_prompt"``
    overrides it. ``parser`` maps (completion text, constraint) to the action text.
    """

    name = "llm"

    def __init__(
        self,
        client: PoolClient,
        tokenizer: ChatTokenizer,
        *,
        system_prompt: str = "",
        config: LLMAgentConfig | None = None,
        parser: Callable[[str, Constraint | None], str] = parse_action,
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.config = config or LLMAgentConfig()
        self.parser = parser
        self._history = _History()
        self._rng: np.random.Generator | None = None
        self._warned_constraint = False

    def reset(self, seed: int | None = None) -> None:
        self._history = _History()
        # Each request gets its own seed from the episode seed: a seeded episode samples
        # the same actions whatever else the pool batches it with.
        self._rng = np.random.default_rng(seed) if seed is not None else None

    async def act(self, observation: Observation) -> Action:
        cfg = self.config
        system = str(observation.info.get("system_prompt") or self.system_prompt)
        self._history.turns.append(_Turn("user", observation.text))
        self._history.latest_system = system
        prompt_ids = self._fit_prompt(system)
        constraint = self._constraint(observation.info) if cfg.use_constraints else None
        seed = int(self._rng.integers(2**31 - 1)) if self._rng is not None else None
        request = GenerateRequest(
            policy=cfg.policy,
            prompt_token_ids=prompt_ids,
            params=SamplingParams(
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                max_tokens=cfg.max_tokens,
                stop=list(cfg.stop),
                seed=seed,
                logprobs=True,
            ),
            constraint=constraint,
            timeout=cfg.request_timeout,
        )
        result = await generate_with_retry(
            self.client, request, retries=cfg.retries, backoff=cfg.backoff
        )
        completion = result.completions[0]
        self._history.turns.append(_Turn("assistant", completion.text))
        if cfg.keep_token_ids:
            self._keep_ids(system, prompt_ids, completion)
        record = TokenRecord(
            policy=result.policy,
            policy_version=result.policy_version,
            prompt_token_ids=list(result.prompt_token_ids or prompt_ids),
            token_ids=list(completion.token_ids),
            logprobs=list(completion.logprobs),
            finish_reason=completion.finish_reason,
        )
        action = self.parser(completion.text, constraint)
        return Action(agent=observation.agent, text=action, tokens=[record])

    @property
    def folded(self) -> int:
        """Turns at the front of this episode's chat no longer shown (0: none folded yet)."""
        return self._history.folded

    def unfolded_prompt_tokens(self) -> int:
        """Tokens of this episode's chat up to its newest observation with nothing folded:
        the prompt the agent would send now without a budget (its text chat; 0 before the
        first turn). Once folded it exceeds every prompt sent; each of its tokens is
        computed at least once (prefilled, or generated by the model)."""
        h = self._history
        turns = h.turns
        if turns and turns[-1].role == "assistant":  # the newest reply is no prompt yet
            turns = turns[:-1]
        if not turns:
            return 0
        return len(self.tokenizer.encode_chat(self._messages(h.latest_system, turns, 0)))

    # --- prompt -----------------------------------------------------------------------

    def _messages(self, system: str, turns: Sequence[_Turn], folded: int) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": system}] if system else []
        for i, turn in enumerate(turns):
            content = turn.content
            if i == 0 and folded:
                content = f"[{folded} earlier messages omitted]\n{content}"
            messages.append({"role": turn.role, "content": content})
        return messages

    def _fit_prompt(self, system: str) -> list[int]:
        """Prompt token ids of the chat, oldest turns folded away to fit the budget.

        Turns are folded in (user, assistant) pairs so the chat still alternates; if the
        newest observation alone is too long, its beginning is cut (the end is what the
        agent must answer). Once over budget, folding goes on down to ``fold_to`` x the
        budget (the system prompt always stays). With ``keep_token_ids``, a prompt that
        continues the previous turn's ids and fits the budget is sent as it is.
        """
        budget = self.config.max_prompt_tokens
        h = self._history
        continued = self._continue_ids(system)
        if continued is not None and len(continued) <= budget:
            return continued
        # The exact chat is over budget: fold, even where its re-encoded text would fit
        # (a prompt re-rendered unfolded would miss the cache from its first reply on).
        over = continued is not None
        target = budget
        while True:
            turns = h.turns[h.folded :]
            ids = self.tokenizer.encode_chat(self._messages(system, turns, h.folded))
            if (len(ids) <= target and not over) or len(turns) <= 1:
                break
            over = False
            target = int(budget * self.config.fold_to)
            h.folded += 2 if len(turns) > 2 else len(turns) - 1
        if len(ids) <= budget:
            return ids
        return self._cut_newest(system, budget)

    def _continue_ids(self, system: str) -> list[int] | None:
        """``keep_token_ids``: the previous turn's ids extended by the template's tokens of
        the newest observation, or None where the prompt must come from the text."""
        h = self._history
        if h.ids is None or system != h.system:
            return None
        tail = self._turn_tail(system, h.turns[-1].content)
        return None if tail is None else h.ids + tail

    def _turn_tail(self, system: str, content: str) -> list[int] | None:
        """The template's tokens after an assistant message's content up to the next
        generation prompt, with a user message ``content`` between: the difference of two
        renderings of a one-turn chat, with and without an empty assistant reply and the
        new message. None where the template does not render the longer chat as an
        extension of the shorter (a template that rewrites earlier turns)."""
        head = [{"role": "system", "content": system}] if system else []
        head.append({"role": "user", "content": "."})
        before = self.tokenizer.encode_chat(head)
        after = self.tokenizer.encode_chat(
            [*head, {"role": "assistant", "content": ""}, {"role": "user", "content": content}]
        )
        if after[: len(before)] != before:
            return None
        return after[len(before) :]

    def _keep_ids(self, system: str, prompt_ids: list[int], completion: Completion) -> None:
        """Remember ``prompt_ids`` and the generated ids for the next turn's prompt, less
        the special tokens (they decode to nothing): a chat's text never carries control
        tokens (see ``HFChatTokenizer``), and the template writes its own end of turn. The
        next prompt comes from the text instead where the rest does not decode to the
        completion's text (a stop string was cut from it)."""
        h = self._history
        decode = self.tokenizer.decode
        generated = [t for t in completion.token_ids if decode([t]) != ""]
        if decode(generated) != completion.text:
            h.ids = None
            return
        h.ids, h.system = [*prompt_ids, *generated], system

    def _cut_newest(self, system: str, budget: int) -> list[int]:
        h = self._history
        text = h.turns[-1].content
        lo, hi = 0, len(text)  # binary search the longest tail of the text that fits
        best: list[int] | None = None
        while lo < hi:
            mid = (lo + hi + 1) // 2
            turn = _Turn("user", "..." + text[len(text) - mid :])
            ids = self.tokenizer.encode_chat(self._messages(system, [turn], h.folded))
            if len(ids) <= budget:
                lo, best = mid, ids
            else:
                hi = mid - 1
        if best is None:
            ids = self.tokenizer.encode_chat(self._messages(system, [_Turn("user", "...")], 0))
            # Even the system prompt alone is over budget: send what is left of the end.
            best = ids[-budget:]
        return best

    def _constraint(self, info: dict[str, Any]) -> Constraint | None:
        raw = info.get("constraint")
        if raw is None or isinstance(raw, Constraint):
            return raw
        try:
            return msgspec.convert(raw, Constraint)
        except msgspec.ValidationError as exc:
            # A scenario bug, not the model's: play on unconstrained, say so once.
            if not self._warned_constraint:
                warnings.warn(
                    f"ignoring malformed constraint {raw!r} from the scenario: {exc}",
                    stacklevel=2,
                )
                self._warned_constraint = True
            return None
