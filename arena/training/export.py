"""Export trajectories for training elsewhere: one JSONL schema, three converters.

Input: the per-agent trajectories a run writes (``trajectories.jsonl``, one
:class:`~parley.protocols.messages.Trajectory` per line, see ``arena/run/SCHEMA.md``) or
:class:`~parley.arena.run.records.EpisodeRecord` objects. Failed episodes are skipped (their
reason is not a reward).

**parley decision schema** (:func:`decisions`, one JSON object per line)::

    episode, scenario, agent, seed, turn      where the decision was made
    observation, action                       text the agent saw and sent
    prompt_token_ids, token_ids, logprobs     exactly what the model saw and generated
    policy, policy_version                    which weights generated it
    reward                                    this turn's reward
    return                                    reward-to-go from this turn (undiscounted)
    episode_return, components                the agent's episode total and its parts

Decisions without model tokens (scripted agents) are kept only with ``with_scripted``.

**Converters** (:data:`FORMATS`), each a function ``decision -> dict``:

- ``trl`` — TRL's conversational prompt-completion format, usable by KTO (``label``: the
  return is above ``threshold``) and as a GRPO/offline dataset (``reward``):
  ``{"prompt": [{"role": "user", ...}], "completion": [{"role": "assistant", ...}],
  "label": bool, "reward": float}``.
- ``openrlhf`` — ``{"input": ..., "output": ..., "reward": ..., "label": ...}``; pass
  ``--input_key input --output_key output --label_key label`` (or ``reward``).
- ``nemo_rl`` — NeMo RL's ``ResponseDataset`` keys ``input``/``output`` plus a
  ``messages`` list (its OpenAI-style chat format) and ``task_name`` (the scenario).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from parley.protocols.messages import Trajectory

__all__ = ["FORMATS", "decisions", "export", "read_trajectories"]


def read_trajectories(path: str | Path) -> Iterator[Trajectory]:
    """The trajectories of a ``trajectories.jsonl`` file, in file order."""
    decoder = msgspec.json.Decoder(Trajectory)
    with Path(path).open("rb") as f:
        for line in f:
            if line.strip():
                yield decoder.decode(line)


def decisions(
    trajectories: Iterable[Trajectory], *, with_scripted: bool = False
) -> Iterator[dict[str, Any]]:
    """One dict per decision, in the parley decision schema (see the module docstring)."""
    for t in trajectories:
        if t.failed:
            continue
        to_go = 0.0
        returns: list[float] = []
        for turn in reversed(t.turns):
            to_go += turn.reward
            returns.append(to_go)
        returns.reverse()
        for turn, ret in zip(t.turns, returns, strict=True):
            tokens = turn.tokens[-1] if turn.tokens else None
            if tokens is None and not with_scripted:
                continue
            yield {
                "episode": t.episode,
                "scenario": t.scenario,
                "agent": t.agent,
                "seed": t.seed,
                "turn": turn.turn,
                "observation": turn.observation,
                "action": turn.action,
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


def _trl(d: dict[str, Any], threshold: float) -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": d["observation"]}],
        "completion": [{"role": "assistant", "content": d["action"]}],
        "label": d["return"] > threshold,
        "reward": d["return"],
    }


def _openrlhf(d: dict[str, Any], threshold: float) -> dict[str, Any]:
    return {
        "input": d["observation"],
        "output": d["action"],
        "reward": d["return"],
        "label": d["return"] > threshold,
    }


def _nemo_rl(d: dict[str, Any], threshold: float) -> dict[str, Any]:
    return {
        "input": d["observation"],
        "output": d["action"],
        "messages": [
            {"role": "user", "content": d["observation"]},
            {"role": "assistant", "content": d["action"]},
        ],
        "task_name": d["scenario"],
        "reward": d["return"],
    }


def _parley(d: dict[str, Any], threshold: float) -> dict[str, Any]:
    return d


FORMATS: dict[str, Callable[[dict[str, Any], float], dict[str, Any]]] = {
    "parley": _parley,
    "trl": _trl,
    "openrlhf": _openrlhf,
    "nemo_rl": _nemo_rl,
}
"""Format name -> converter ``(decision, threshold) -> row``."""


def export(
    trajectories: Iterable[Trajectory],
    out: str | Path,
    *,
    format: str = "parley",
    threshold: float = 0.0,
    with_scripted: bool = False,
) -> int:
    """Write one JSONL row per decision in ``format``; returns the number of rows."""
    if format not in FORMATS:
        raise KeyError(f"unknown export format {format!r}; choose one of {sorted(FORMATS)}")
    convert = FORMATS[format]
    n = 0
    with Path(out).open("w", encoding="utf-8") as f:
        for d in decisions(trajectories, with_scripted=with_scripted):
            f.write(json.dumps(convert(d, threshold), sort_keys=True) + "\n")
            n += 1
    return n
