"""How a training run's LLM seats are played: agents on the pool's policies.

:func:`llm_factory` makes the agents of a seat played by a pool policy (a trained policy,
a population snapshot), each decision's constraint recorded for the trainer;
:func:`llm_agent_config` their settings; :func:`system_prompts` what each seat is told.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parley.arena.training.config import AgentConfig, TrainConfig
from parley.arena.training.sampler import RecordingClient

__all__ = ["llm_agent_config", "llm_factory", "system_prompts"]


def llm_agent_config(config: AgentConfig, policy: str) -> Any:
    """The :class:`~parley.agents.llm.LLMAgentConfig` of a seat played by ``policy``."""
    from parley.agents.llm import LLMAgentConfig

    return LLMAgentConfig(
        policy=policy,
        temperature=config.temperature,
        max_tokens=config.max_tokens,
        max_prompt_tokens=config.max_prompt_tokens,
        request_timeout=0.0,
    )


def llm_factory(
    pool: Any, policy: str, tokenizer: Any, system_prompt: str, config: AgentConfig, log: Any
) -> Callable[[], Any]:
    """Fresh LLM agents playing ``policy`` on ``pool``, their decisions' constraints
    recorded in ``log`` (read back into the trainer's samples)."""
    from parley.agents.llm import LLMAgent

    agent_config = llm_agent_config(config, policy)
    client = RecordingClient(pool, log)

    def factory() -> Any:
        return LLMAgent(client, tokenizer, system_prompt=system_prompt, config=agent_config)

    return factory


def system_prompts(config: TrainConfig) -> dict[str, str]:
    """Seat -> the scenario's system prompt for it ("" where it has none)."""
    from parley.scenarios import make

    env = make(config.scenario, **config.scenario_kwargs)
    try:
        env.reset(seed=0)
        get = getattr(env, "system_prompt", None)
        return {seat: (str(get(seat)) if callable(get) else "") for seat in env.possible_agents}
    finally:
        env.close()
