"""Every seat's observation and infos after ``reset`` and ``step``: the hot half of
:class:`parley.scenarios.base.Scenario`'s machinery (apart for base's line budget)."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from parley.scenarios.charset import printable
from parley.scenarios.helpers import TextMemo

if TYPE_CHECKING:
    from parley.scenarios.base import Scenario

__all__ = ["DEFAULT_PROMPT", "ESCAPED_PROMPTS", "observe"]

DEFAULT_PROMPT = "Your move."
"""The prompt of a scenario that leaves :meth:`Scenario.prompt` as the base defines it."""

ESCAPED_PROMPTS: TextMemo[str] = TextMemo(printable, 4096)
"""Prompt texts, escaped: one memo for the process, not one per instance (``printable`` is
a pure function), so an env made per episode or per batch of episodes (the runner, ``parley
bench games``) finds the prompts its game's positions repeat (a miss escapes the text, ~0.2
us for 100 characters, and inserts it)."""


def observe(
    env: Scenario, acting: Collection[str], ended: bool
) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Observations and infos of ``env``'s live seats; ``acting`` are asked to act."""
    # Hot path (every step, every seat): lookups hoisted; default hooks not called.
    observations: dict[str, str] = {}
    infos: dict[str, dict[str, Any]] = {}
    limit, turn = env.max_observation_length, env.turn
    paid, invalid, inbox = env._step_components, env._invalid, env._inbox
    prompt = env.prompt if env._own_prompt else None
    view = env.view if env._own_view else None
    constraint_of = env.constraint if env._own_constraint else None
    escaped = ESCAPED_PROMPTS  # (hooks often return the same few texts: each escaped once)
    for agent in env.agents:
        lines = inbox[agent]
        if agent in acting:
            to_act = True
            if prompt is None:
                shown = DEFAULT_PROMPT
            else:
                asked = prompt(agent)
                shown = escaped.memo.get(asked) or escaped(asked)
            if lines:
                lines.append(shown)
                text = "\n".join(lines)
                # Emptied only when the seat is asked: the runner delivers only acting
                # seats' observations, so the others keep their lines until their turn.
                lines.clear()
            else:
                text = shown
        else:
            to_act = False
            text = "\n".join([*lines, "The episode is over."] if ended else lines)
        if len(text) > limit:
            text = "[...]" + text[len(text) - limit + 5 :]
        observations[agent] = text
        # "components" dicts are fresh per step (step() replaces them): safe to hand out.
        infos[agent] = info = {
            "to_act": to_act,
            "turn": turn,
            "components": (paid.get(agent) or {}) if paid else {},
            "view": {} if view is None else view(agent),
        }
        if invalid and agent in invalid:
            info["invalid"] = invalid[agent]
        if to_act and constraint_of is not None:
            constraint = constraint_of(agent)
            if constraint is not None:
                info["constraint"] = constraint
    return observations, infos
