"""Evaluate trained checkpoints seat by seat, with the prompts a training config used.

    python examples/evaluate_seats.py examples/hidden-profile.yaml \
        agent_0=runs/hidden-profile/checkpoints/agent_0 agent_1=... agent_2=... \
        [--episodes 400] [--temperature 0]

Each ``seat=PATH`` plays a checkpoint directory (all of them in one in-process inference
pool); ``seat=scripted``, ``seat=module:Class`` or ``seat=llm:...`` plays an agent spec. The
checkpoint seats get the config's agent settings (``max_tokens``, ``max_prompt_tokens``, a
system prompt only if ``agent.system_prompt``): this is
:func:`parley.arena.training.evaluate.evaluate_seats` from the command line. Prints the run
summary's metric means and per-seat returns as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any


async def evaluate(
    config_path: str, seats: dict[str, str], episodes: int, temperature: float, seed: int
) -> dict[str, Any]:
    """The run summary's metric means and per-seat returns; ``seats``: seat -> checkpoint
    directory or agent spec."""
    from parley.arena.training.config import load_train_config
    from parley.arena.training.evaluate import evaluate_seats

    config = load_train_config(config_path)
    summary = await evaluate_seats(
        seats, config, episodes=episodes, seed=seed, temperature=temperature
    )
    return {
        "metrics": {k: v.get("mean") for k, v in summary["metrics"].items()},
        "returns": {k: v.get("mean") for k, v in summary.get("returns", {}).items()},
        "invalid_move_rate": summary.get("invalid_move_rate"),
        "episodes": summary.get("episodes"),
    }


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
