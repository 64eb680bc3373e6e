"""Evaluate trained checkpoints in the arena, each seat with the prompts it was trained on.

``parley run --agents llm:DIR`` always sends the scenario's system prompt; a policy trained
without one (``agent.system_prompt: false``, as the referential recipe trains) must be
evaluated without it, and with the training's ``max_tokens`` / ``max_prompt_tokens``.
:func:`evaluate_seats` does that from a training config: each seat is a checkpoint directory
(loaded into one in-process pool) or any agent spec (``scripted``, ``module:Class``,
``llm:...``), and the run's summary comes back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["evaluate_seats"]


async def evaluate_seats(
    seats: Mapping[str, str | Path],
    config: Any,
    *,
    episodes: int = 200,
    seed: int = 1,
    temperature: float = 0.0,
) -> dict[str, Any]:
    """The arena run's ``summary.json`` for ``seats`` (seat -> checkpoint directory or agent
    spec) on ``config``'s scenario (a :class:`~parley.arena.training.config.TrainConfig`),
    greedy by default. The run keeps no records (memory stays flat)."""
    from parley.agents.llm import LLMAgent, LLMAgentConfig
    from parley.arena.inference.pool import InferencePool, PoolConfig
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import Runner

    backends, tokenizers, system = await asyncio.to_thread(_load_checkpoints, seats, config)
    pool: Any = None
    if backends:
        pool = await InferencePool(backends, PoolConfig(max_batch_size=256, max_wait=0.002)).start()

    def factory(seat: str) -> Any:
        agent_config = LLMAgentConfig(
            policy=seat,
            temperature=temperature,
            max_tokens=config.agent.max_tokens,
            max_prompt_tokens=config.agent.max_prompt_tokens,
            request_timeout=0.0,
        )
        prompt = system[seat] if config.agent.system_prompt else ""

        def make_agent() -> Any:
            return LLMAgent(pool, tokenizers[seat], system_prompt=prompt, config=agent_config)

        return make_agent

    run_config = RunConfig(
        scenario=config.scenario,
        scenario_kwargs=dict(config.scenario_kwargs),
        agents={seat: f"llm:{seat}" if seat in backends else str(s) for seat, s in seats.items()},
        episodes=episodes,
        concurrency=64,
        seed=seed,
        progress=False,
    )
    try:
        agents = {seat: factory(seat) for seat in backends}
        result = await Runner(run_config, agents=agents).run()
    finally:
        if pool is not None:
            await pool.close()
    summary: dict[str, Any] = result.summary
    return summary


def _load_checkpoints(
    seats: Mapping[str, str | Path], config: Any
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """Per checkpoint seat: its backend, its tokenizer and the scenario's system prompt."""
    from parley.arena.inference.backends.tokenizer import load_causal_lm, load_tokenizer
    from parley.arena.inference.backends.transformers import TransformersBackend
    from parley.scenarios import make

    checkpoints = {seat: str(path) for seat, path in seats.items() if Path(path).is_dir()}
    env = make(config.scenario, **config.scenario_kwargs)
    env.reset(seed=0)
    system = {seat: str(env.system_prompt(seat)) for seat in checkpoints}
    env.close()
    backends, tokenizers = {}, {}
    for seat, path in checkpoints.items():
        tokenizers[seat] = load_tokenizer(path)
        model = load_causal_lm(path, dtype="float32").eval()
        backends[seat] = TransformersBackend(model, tokenizers[seat], max_batch_rows=256)
    return backends, tokenizers, system
