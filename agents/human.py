"""A person at the terminal plays a seat (``--agents human:tty``).

The person sees exactly what the seat sees: the scenario's rules and action syntax once
(``rules``, the system prompt an LLM in the seat would get), then each observation's text,
the action constraint when the scenario gives one (the valid choices, or the pattern an
answer must match), and — when the previous answer was judged invalid — the scenario's
reason. What they type (one line) is the action, sent as it is: the scenario judges it.

Several episodes may run at once; the terminal is shared, so one prompt is shown at a time
(a process-wide lock), each headed by the seat and episode turn. End of input (Ctrl-D)
gives an empty action, which the scenario records as an invalid move.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any, TextIO

from parley.agents.base import Agent
from parley.protocols.messages import Action, Observation

__all__ = ["TerminalHuman", "describe_constraint"]

_terminal_lock: asyncio.Lock | None = None
_lock_loop: asyncio.AbstractEventLoop | None = None


def _lock() -> asyncio.Lock:
    global _terminal_lock, _lock_loop
    loop = asyncio.get_running_loop()
    if _terminal_lock is None or _lock_loop is not loop:
        _terminal_lock, _lock_loop = asyncio.Lock(), loop
    return _terminal_lock


def describe_constraint(constraint: Any) -> str:
    """One line saying what answers the scenario accepts now ("" when it says nothing)."""
    if not isinstance(constraint, dict):
        return ""
    kind = constraint.get("type")
    if kind == "choice" and constraint.get("choices"):
        return "valid moves: " + " | ".join(str(c) for c in constraint["choices"])
    if kind == "regex" and constraint.get("pattern"):
        return f"your answer must match the pattern: {constraint['pattern']}"
    if kind == "json" and constraint.get("json_schema"):
        return f"answer with JSON matching this schema: {constraint['json_schema']}"
    return ""


class TerminalHuman(Agent):
    """A seat played by whoever types at the terminal."""

    name = "human:tty"

    def __init__(
        self,
        rules: str = "",
        *,
        read: Callable[[], str] | None = None,
        out: TextIO | None = None,
    ) -> None:
        self.rules = rules
        self._read = read or sys.stdin.readline
        self._out = out
        self._shown_rules = False

    def reset(self, seed: int | None = None) -> None:
        self._shown_rules = False

    def _write(self, text: str) -> None:
        out = self._out or sys.stdout
        out.write(text)
        out.flush()

    async def act(self, observation: Observation) -> Action:
        async with _lock():
            info = observation.info
            lines = [f"\n=== {observation.agent} · turn {info.get('turn', '?')} ==="]
            if self.rules and not self._shown_rules:
                lines.append(f"Rules: {self.rules}")
                self._shown_rules = True
            if info.get("invalid"):
                lines.append(f"!! Your last move was invalid: {info['invalid']}")
            lines.append(observation.text)
            hint = describe_constraint(info.get("constraint"))
            if hint:
                lines.append(hint)
            self._write("\n".join(lines) + "\n> ")
            try:
                text = await asyncio.to_thread(self._read)
            except (EOFError, OSError):  # no terminal: an empty (invalid) move
                text = ""
        return Action(agent=observation.agent, text=text.rstrip("\r\n"))
