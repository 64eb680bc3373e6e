"""Evaluate trained checkpoints seat by seat, with the prompts a training config used.

    python examples/evaluate_seats.py examples/hidden-profile.yaml \
        agent_0=runs/hidden-profile/checkpoints/agent_0 agent_1=... agent_2=... \
        [--episodes 400] [--temperature 0]

Each ``seat=PATH`` plays a checkpoint directory (loaded one after the other into one
in-process inference pool); ``seat=scripted`` or ``seat=module:Class`` plays an agent spec.
The LLM seats get the config's agent settings (``max_tokens``, ``max_prompt_tokens``, a
system prompt only if ``agent.system_prompt``), as ``parley.arena.cli.demo_train.
evaluate_team`` does for the referential game. Prints the run summary's metric means and
per-seat returns as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any


async def evaluate(
    config_path: str, seats: dict[str, str], episodes: int, temperature: float, seed: int
) -> dict[str, Any]:
    """The run summary's metric means and per-seat returns; ``seats``: seat -> checkpoint
    directory or agent spec."""
    import transformers

    from parley.agents.llm import LLMAgent, LLMAgentConfig
    from parley.arena.inference.backends.tokenizer import load_tokenizer
    from parley.arena.inference.backends.transformers import TransformersBackend
    from parley.arena.inference.pool import InferencePool, PoolConfig
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import Runner
    from parley.arena.training.config import load_train_config
    from parley.scenarios import make

    config = load_train_config(config_path)
    env = make(config.scenario, **config.scenario_kwargs)
    env.reset(seed=0)
    system = {seat: str(env.system_prompt(seat)) for seat in env.possible_agents}
    env.close()
    llm = {seat: path for seat, path in seats.items() if _is_checkpoint(path)}
    backends, tokenizers = {}, {}
    for seat, path in llm.items():  # one after the other: concurrent loads are not safe
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype="float32").eval()
        tokenizers[seat] = load_tokenizer(path)
        backends[seat] = TransformersBackend(model, tokenizers[seat], max_batch_rows=256)
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
        return lambda: LLMAgent(pool, tokenizers[seat], system_prompt=prompt, config=agent_config)

    run_config = RunConfig(
        scenario=config.scenario,
        scenario_kwargs=dict(config.scenario_kwargs),
        agents={seat: f"llm:{seat}" if seat in llm else spec for seat, spec in seats.items()},
        episodes=episodes,
        concurrency=64,
        seed=seed,
        progress=False,
    )
    try:
        result = await Runner(run_config, agents={seat: factory(seat) for seat in llm}).run()
    finally:
        await pool.close()
    summary = result.summary
    return {
        "metrics": {k: v.get("mean") for k, v in summary["metrics"].items()},
        "returns": {k: v.get("mean") for k, v in summary.get("returns", {}).items()},
        "invalid_move_rate": summary.get("invalid_move_rate"),
        "episodes": summary.get("episodes"),
    }


def _is_checkpoint(path: str) -> bool:
    return Path(path).is_dir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("seats", nargs="+", help="seat=checkpoint_dir or seat=agent_spec")
    parser.add_argument("--episodes", type=int, default=400)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    seats = dict(item.split("=", 1) for item in args.seats)
    out = asyncio.run(evaluate(args.config, seats, args.episodes, args.temperature, args.seed))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
