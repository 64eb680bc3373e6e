"""Export trajectories for training elsewhere: the data the model saw, per turn or per episode.

Input: the per-agent trajectories a run writes (``trajectories.jsonl``, one
:class:`~parley.protocols.messages.Trajectory` per line, see ``arena/run/SCHEMA.md``).
Failed episodes are skipped (their reason is not a reward).

**The chat the model saw.** An LLM agent prompts its model with a chat: the seat's system
prompt, every earlier turn (its observations as ``user`` messages, its own completions as
``assistant`` messages) and the new observation, the oldest turns folded away when the
prompt budget is short (:class:`~parley.agents.llm.LLMAgent`). The trajectory keeps the
observations, the completions' token ids and the exact prompt token ids, so the exporter
rebuilds that chat and, given the tokenizer, **checks it**: ``chat_exact`` is true when
the chat template applied to the rebuilt chat gives exactly the recorded prompt ids (the
system prompt is found among ``system_prompts``, the scenario's ``system_prompt(seat)``
and none; the folding among every possible one, and an observation cut to fit the
budget as the agent cuts it). An agent that keeps its replies' own token ids
(``LLMAgentConfig.keep_token_ids``) sends ids that a reply's text need not encode back to
(a byte token, another merge): the chat exported is then the candidate whose template's
text is the text the recorded ids decode to (the same system prompt and folding the agent
used), with ``chat_exact`` False; ``prompt_token_ids`` are always the recorded ones, what
the model saw. Without a tokenizer the chat is built from the parsed actions, unfolded,
and ``chat_exact`` is None.

**Control tokens spelled in text.** A seat may write the text of a special token
(``<|end|>``, ``<|system|>``) into its message; parley's encoder gives the model such text
as ordinary tokens, but an outside trainer templates the exported chat as plain text and
its tokenizer would turn the spelling into the real token (a forged system turn in the
prompt). So every spelling of one of the tokenizer's added tokens in an exported message is
broken by a space after its first character (``< |system|>``, as parley's encoder does for
templates that do not keep contents verbatim): no exported row carries a control token the
model did not see. ``template_exact`` says whether the exported chat, templated and
tokenized as plain text by the tokenizer itself (what TRL, OpenRLHF and NeMo RL do), gives
exactly the recorded prompt ids: it is ``chat_exact`` for a chat without such spellings and
False for one with them (the model saw the spelling as ordinary tokens, which no plain text
reproduces); train outside parley on rows with ``template_exact`` where token-exactness
matters, or on the recorded ids (``parley`` format).

**parley decision schema** (:func:`decisions`, one JSON object per model decision)::

    episode, scenario, agent, seed, turn      where the decision was made
    observation, action                       the text the agent saw last and sent
    messages                                  the whole prompt chat (system, earlier turns)
    completion, chat_exact                    the generated text; whether the chat is exact
    template_exact                            ... and stays exact templated as plain text
    prompt_token_ids, token_ids, logprobs     exactly what the model saw and generated
    policy, policy_version                    which weights generated it
    reward, return                            this turn's reward; reward-to-go from it
    episode_return, components, invalid       the agent's episode total and its parts

**parley conversation schema** (:func:`conversations`, one object per agent and episode):
``messages`` (system, then every observation and completion in order), ``turns`` (per model
decision: turn, token ids, logprobs, prompt ids, version, reward, return, chat_exact,
template_exact) and the episode fields.

**Converters**, per turn (:data:`FORMATS`) and per conversation (:data:`CONVERSATION_FORMATS`),
checked against the formats documented by TRL 1.16 and NeMo RL (``ResponseDataset``):

- ``trl`` per turn: conversational prompt-completion (GRPO, KTO with ``label``, offline):
  ``{"prompt": <the whole chat>, "completion": [assistant], "label", "reward"}``; per
  conversation: conversational language modelling for SFT, ``{"messages": [...]}``.
- ``openrlhf`` per turn: ``{"input": <the chat>, "output": [assistant], "reward", "label"}``;
  pass ``--input_key input --output_key output --apply_chat_template`` (its SFT dataset
  templates ``input`` with a generation prompt and ``input + output`` for the response, so
  ``output`` must be a message list when ``input`` is; its prompt dataset reads ``input``
  and ``--label_key label``).
- ``nemo_rl``: ``{"messages": [...]}`` (the chat plus the completion; per conversation the
  whole episode). ``ResponseDataset`` uses a ``messages`` column as is and adds
  ``task_name`` itself (a row that carries one is rejected as a duplicate column).
- ``parley``: the schemas above, token ids and logprobs included.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from parley.protocols.messages import TokenRecord, Trajectory

__all__ = [
    "CONVERSATION_FORMATS",
    "FORMATS",
    "conversations",
    "decisions",
    "export",
    "read_trajectories",
]

Message = dict[str, str]


def read_trajectories(path: str | Path) -> Iterator[Trajectory]:
    """The trajectories of a ``trajectories.jsonl`` file, in file order."""
    decoder = msgspec.json.Decoder(Trajectory)
    with Path(path).open("rb") as f:
        for line in f:
            if line.strip():
                yield decoder.decode(line)


# ------------------------------------------------------------------------------ the chat


def _chat(system: str, history: Sequence[Message], folded: int) -> list[Message]:
    """The chat an LLM agent sends (``LLMAgent._messages``): system, then the turns from
    ``folded`` on, the first of them marked with how many came before."""
    messages = [{"role": "system", "content": system}] if system else []
    for i, turn in enumerate(history[folded:]):
        content = turn["content"]
        if i == 0 and folded:
            content = f"[{folded} earlier messages omitted]\n{content}"
        messages.append({"role": turn["role"], "content": content})
    return messages


def _match(
    history: Sequence[Message], prompt_ids: Sequence[int], systems: Sequence[str], tokenizer: Any
) -> tuple[list[Message], str, bool]:
    """The chat among the candidate systems and foldings whose template gives
    ``prompt_ids`` exactly; else the first whose template's text is the text ``prompt_ids``
    decode to (an agent that keeps its replies' own ids, ``keep_token_ids``, sends ids that
    the text of a reply need not encode back to), not exact; else the unfolded chat with
    the first system, not exact."""
    target = list(prompt_ids)
    text = tokenizer.decode(target)
    same_text: tuple[list[Message], str] | None = None
    for messages, system in _candidates(history, len(target), systems, tokenizer):
        ids = tokenizer.encode_chat(messages)
        if ids == target:
            return messages, system, True
        if same_text is None and tokenizer.decode(ids) == text:
            same_text = messages, system
    if same_text is not None:
        return *same_text, False
    return _chat(systems[0], history, 0), systems[0], False


def _candidates(
    history: Sequence[Message], length: int, systems: Sequence[str], tokenizer: Any
) -> Iterator[tuple[list[Message], str]]:
    """Every chat the agent may have sent: per system, each folding, then the newest
    observation cut to fit ``length`` tokens."""
    for system in systems:
        for folded in range(len(history)):
            yield _chat(system, history, folded), system
    for system in systems:
        yield _cut(system, history, length, tokenizer), system


def _cut(system: str, history: Sequence[Message], length: int, tokenizer: Any) -> list[Message]:
    """The chat of an agent whose newest observation alone overflowed its budget: every
    earlier turn folded, the observation cut to its longest tail ``"..." + tail`` that fits
    in ``length`` tokens (the agent's own binary search, ``LLMAgent._cut_newest``)."""
    text, folded = history[-1]["content"], len(history) - 1

    def chat(keep: int) -> list[Message]:
        newest = {"role": "user", "content": "..." + text[len(text) - keep :]}
        return _chat(system, [*history[:-1], newest], folded)

    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode_chat(chat(mid))) <= length:
            lo = mid
        else:
            hi = mid - 1
    return chat(lo)


def _scenario_systems(scenario: str, seat: str, given: Mapping[str, str] | None) -> list[str]:
    """Candidate system prompts of ``seat``: the given one, the scenario's, none."""
    candidates = [given.get(seat, given.get("*", ""))] if given else []
    return list(dict.fromkeys([*candidates, *_scenario_system(scenario, seat), ""]))


@functools.lru_cache(maxsize=64)
def _scenario_system(scenario: str, seat: str) -> tuple[str, ...]:
    """The scenario's ``system_prompt(seat)`` (one instance per scenario and seat)."""
    candidates: list[str] = []
    try:
        from parley.scenarios import make

        env = make(scenario)
        try:
            env.reset(seed=0)
            get = getattr(env, "system_prompt", None)
            if callable(get):
                candidates.append(str(get(seat)))
        finally:
            env.close()
    except Exception:  # an unregistered or broken scenario: the other candidates remain
        return ()
    return tuple(candidates)


def _neutral(messages: Sequence[Message], tokenizer: Any) -> tuple[list[Message], bool]:
    """``messages`` with every spelling of the tokenizer's added tokens broken by a space
    after its first character; whether any was."""
    # (HFChatTokenizer's own pattern of its added tokens: the encoder quotes by it.)
    markers = getattr(tokenizer, "_markers", None) if tokenizer is not None else None
    if markers is None:
        return list(messages), False
    out, changed = [], False
    for m in messages:
        content = markers.sub(lambda x: x[0][0] + " " + x[0][1:], m["content"])
        changed = changed or content != m["content"]
        out.append({**m, "content": content})
    return out, changed


# ------------------------------------------------------------------------------ schemas


def _walk(
    t: Trajectory, tokenizer: Any, systems: Sequence[str]
) -> tuple[list[dict[str, Any]], list[Message], str]:
    """Every turn of one trajectory as a decision dict (scripted turns too, with empty
    tokens), the whole conversation and the system prompt found."""
    to_go, returns = 0.0, []
    for turn in reversed(t.turns):
        to_go += turn.reward
        returns.append(to_go)
    returns.reverse()
    history: list[Message] = []
    rows: list[dict[str, Any]] = []
    system = systems[0]
    for turn, ret in zip(t.turns, returns, strict=True):
        history.append({"role": "user", "content": turn.observation})
        tokens: TokenRecord | None = turn.tokens[-1] if turn.tokens else None
        exact: bool | None = None
        messages = _chat(system, history, 0)
        if tokens is not None and tokenizer is not None:
            order = [system, *(s for s in systems if s != system)]  # the one found first
            messages, system, exact = _match(history, tokens.prompt_token_ids, order, tokenizer)
        completion = turn.action
        if tokens is not None and tokenizer is not None:
            completion = tokenizer.decode(tokens.token_ids)
        history.append({"role": "assistant", "content": completion})
        # What the row shows (history keeps the text as recorded, for the next _match).
        messages, spelled = _neutral(messages, tokenizer)
        completion = _neutral([history[-1]], tokenizer)[0][0]["content"]
        template_exact = False if spelled and exact is not None else exact
        rows.append(
            {
                "episode": t.episode,
                "scenario": t.scenario,
                "agent": t.agent,
                "seed": t.seed,
                "turn": turn.turn,
                "observation": turn.observation,
                "action": turn.action,
                "messages": messages,
                "completion": completion,
                "chat_exact": exact,
                "template_exact": template_exact,
                "prompt_token_ids": list(tokens.prompt_token_ids) if tokens else [],
                "token_ids": list(tokens.token_ids) if tokens else [],
                "logprobs": list(tokens.logprobs) if tokens else [],
                "policy": tokens.policy if tokens else "",
                "policy_version": tokens.policy_version if tokens else 0,
                "reward": turn.reward,
                "return": ret,
                "episode_return": t.reward,
                "components": dict(t.components),
                "invalid": turn.invalid,
            }
        )
    return rows, _neutral(_chat(system, history, 0), tokenizer)[0], system


def decisions(
    trajectories: Iterable[Trajectory],
    *,
    with_scripted: bool = False,
    tokenizer: Any = None,
    system_prompts: Mapping[str, str] | None = None,
) -> Iterator[dict[str, Any]]:
    """One dict per decision, in the parley decision schema (module docstring).

    ``tokenizer`` (a :class:`~parley.arena.inference.backends.tokenizer.HFChatTokenizer`)
    rebuilds and checks the exact chat; ``system_prompts`` (seat or ``"*"`` -> text) adds
    system prompts to try. Decisions without model tokens are kept only with
    ``with_scripted``.
    """
    for t in trajectories:
        if t.failed:
            continue
        systems = _scenario_systems(t.scenario, t.agent, system_prompts)
        rows, _, _ = _walk(t, tokenizer, systems)
        yield from (r for r in rows if with_scripted or r["token_ids"])


def conversations(
    trajectories: Iterable[Trajectory],
    *,
    tokenizer: Any = None,
    system_prompts: Mapping[str, str] | None = None,
) -> Iterator[dict[str, Any]]:
    """One dict per agent and episode with a model decision, in the parley conversation
    schema: the whole multi-turn chat and, per model turn, its tokens and returns."""
    for t in trajectories:
        if t.failed:
            continue
        systems = _scenario_systems(t.scenario, t.agent, system_prompts)
        rows, messages, system = _walk(t, tokenizer, systems)
        model_turns = [r for r in rows if r["token_ids"]]
        if not model_turns:
            continue
        keys = [
            *("turn", "prompt_token_ids", "token_ids", "logprobs", "policy", "policy_version"),
            *("reward", "return", "chat_exact", "template_exact"),
        ]
        yield {
            "episode": t.episode,
            "scenario": t.scenario,
            "agent": t.agent,
            "seed": t.seed,
            "system": system,
            "messages": messages,
            "turns": [{k: r[k] for k in keys} for r in model_turns],
            "episode_return": t.reward,
            "components": dict(t.components),
        }


# ------------------------------------------------------------------------------ formats


def _assistant(d: Mapping[str, Any]) -> Message:
    return {"role": "assistant", "content": d["completion"]}


def _trl(d: dict[str, Any], threshold: float) -> dict[str, Any]:
    return {
        "prompt": d["messages"],
        "completion": [_assistant(d)],
        "label": d["return"] > threshold,
        "reward": d["return"],
    }


def _openrlhf(d: dict[str, Any], threshold: float) -> dict[str, Any]:
    return {
        "input": d["messages"],
        "output": [_assistant(d)],  # a chat too: OpenRLHF concatenates input + output
        "reward": d["return"],
        "label": d["return"] > threshold,
    }


def _nemo_rl(d: dict[str, Any], threshold: float) -> dict[str, Any]:
    return {"messages": [*d["messages"], _assistant(d)]}


def _parley(d: dict[str, Any], threshold: float) -> dict[str, Any]:
    return d


def _messages_only(c: dict[str, Any], threshold: float) -> dict[str, Any]:
    return {"messages": c["messages"]}


FORMATS: dict[str, Callable[[dict[str, Any], float], dict[str, Any]]] = {
    "parley": _parley,
    "trl": _trl,
    "openrlhf": _openrlhf,
    "nemo_rl": _nemo_rl,
}
"""Per-turn format name -> converter ``(decision, threshold) -> row``."""

CONVERSATION_FORMATS: dict[str, Callable[[dict[str, Any], float], dict[str, Any]]] = {
    "parley": _parley,
    "trl": _messages_only,
    "nemo_rl": _messages_only,
}
"""Whole-conversation format name -> converter ``(conversation, threshold) -> row``."""


def export(
    trajectories: Iterable[Trajectory],
    out: str | Path,
    *,
    format: str = "parley",
    threshold: float = 0.0,
    with_scripted: bool = False,
    conversation: bool = False,
    tokenizer: Any = None,
    system_prompts: Mapping[str, str] | None = None,
) -> int:
    """Write one JSONL row per decision (or, with ``conversation``, per agent and episode)
    in ``format``; returns the number of rows. ``tokenizer`` makes the chats exact."""
    formats = CONVERSATION_FORMATS if conversation else FORMATS
    if format not in formats:
        form = "conversation" if conversation else "per-turn"
        raise KeyError(f"unknown {form} export format {format!r}; choose one of {sorted(formats)}")
    convert = formats[format]
    rows: Iterable[dict[str, Any]]
    if conversation:
        rows = conversations(trajectories, tokenizer=tokenizer, system_prompts=system_prompts)
    else:
        rows = decisions(
            trajectories,
            with_scripted=with_scripted,
            tokenizer=tokenizer,
            system_prompts=system_prompts,
        )
    n = 0
    with Path(out).open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(convert(row, threshold), sort_keys=True) + "\n")
            n += 1
    return n
