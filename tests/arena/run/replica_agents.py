"""Agents the seat-replica tests start in ``parley agent`` processes (importable by path)."""

from __future__ import annotations

import asyncio

from parley.agents.scripted.negotiation import DealNegotiator
from parley.protocols.messages import Action, Observation


class SlowNegotiator(DealNegotiator):  # type: ignore[misc]
    """Deal or No Deal's scripted negotiator, 30 ms per action (the same actions)."""

    async def act(self, observation: Observation) -> Action:
        await asyncio.sleep(0.03)
        action: Action = await super().act(observation)
        return action


class FlakyNegotiator(DealNegotiator):  # type: ignore[misc]
    """Raises in every episode whose agent seed is even: its episode must fail, alone."""

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.flaky = (seed or 0) % 2 == 0

    async def act(self, observation: Observation) -> Action:
        if self.flaky:
            raise RuntimeError("flaky negotiator gave up")
        action: Action = await super().act(observation)
        return action
