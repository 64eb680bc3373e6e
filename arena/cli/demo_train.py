"""A short training demo, then an arena of the trained team vs the untrained one.

:func:`train_demo` is what ``make demo`` / ``parley demo`` can call. It runs the recipe of
``examples/referential.yaml`` (see ``examples/referential.md``): K = 4 candidates (8
one-word objects, one-letter messages, the listener answers by name, the speaker sees the
target alone), two tiny random models, no warm start; the listener learns the scripted
speaker's code by RL, the speaker learns to talk to that trained listener, then both train
together - about 1.5-3 minutes on a 2-core CPU, through the real path. Then it plays
evaluation episodes of the untrained team and of the trained team (all ``llm:`` agents
loading checkpoints, like ``parley run``, greedy) and returns both success rates
(chance: 1 / K).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.arena.training.loop import TrainResult, load_train_config, run_training

__all__ = ["DemoResult", "evaluate_team", "print_demo", "train_demo"]

# v1 plays exactly as v0 here: both seats choose among offered choices, so no move is
# refused (examples/referential.yaml).
SCENARIO = "collaboration/referential-v1"


def demo_config(out: str | Path, *, model: str = "tiny", k: int = 4, scale: float = 1.0) -> Any:
    """The demo's :class:`~parley.arena.training.loop.TrainConfig`: ``k`` = 4 is the
    recipe of ``examples/referential.yaml``, ``k`` = 2 its smaller version (4 objects,
    batches of 64; the learning test's). ``scale`` multiplies every stage's update budget.
    """

    def n(updates: int) -> int:
        return max(1, int(updates * scale))

    objects = 8 if k > 2 else 4
    batch = 128 if k > 2 else 64
    # K = 4: a stalled stage starts over, a fresh speaker each time (examples/referential.md).
    speaker_restart = {"after": n(60), "below": 0.8, "max": 5, "reinit": ["speaker"]}
    joint_restart = {**speaker_restart, "after": n(50), "below": 0.9, "back_to": "speaker"}
    joint_restart["max"] = 3
    return load_train_config(
        data={
            "scenario": SCENARIO,
            "scenario_kwargs": {
                "n_candidates": k,
                "n_attributes": 1,
                "n_values": objects,
                "vocab_size": objects,
                "message_length": 1,
                "answer": "name",
                "show_others": False,
            },
            "model": model,
            "policies": ["speaker", "listener"],
            "agent": {"temperature": 1.0, "max_tokens": 4, "system_prompt": False},
            "sampler": {"batch_size": batch, "staleness": 0, "concurrency": batch},
            "pg": {"estimator": "grpo", "grouping": "role", "lr": 1e-3},
            "threads": 2,
            "stages": [
                {
                    "name": "listener",
                    "agents": {"speaker": "scripted", "listener": "policy:listener"},
                    "train": ["listener"],
                    "max_updates": n(300),
                    "target": 0.95,
                    "window": 10,
                },
                {
                    "name": "speaker",
                    "agents": {"speaker": "policy:speaker", "listener": "policy:listener"},
                    "train": ["speaker"],
                    "max_updates": n(300),
                    "target": 0.85,
                    "window": 10,
                    "restart": speaker_restart if k > 2 else None,
                },
                {
                    "name": "joint",
                    "agents": {"speaker": "policy:speaker", "listener": "policy:listener"},
                    "train": ["speaker", "listener"],
                    "max_updates": n(150),
                    "target": 0.95,
                    "window": 10,
                    "restart": joint_restart if k > 2 else None,
                },
            ],
            "out": str(out),
            "progress": True,
        }
    )


async def evaluate_team(
    speaker: str | Path,
    listener: str | Path,
    config: Any,
    *,
    episodes: int = 200,
    seed: int = 1,
    temperature: float = 0.0,
) -> float:
    """Success rate of a speaker and a listener (checkpoint directories; ``"scripted"``
    for a seat's scripted baseline) over ``episodes`` arena episodes, greedy by default.

    The LLM seats get exactly the prompts they were trained on: the scenario's system
    prompt only when ``config.agent.system_prompt`` is set (``parley run --agents llm:...``
    always sends it, so it would evaluate a model trained without one on a prompt it never
    saw).
    """
    from parley.arena.training.evaluate import evaluate_seats

    seats = {"speaker": str(speaker), "listener": str(listener)}
    summary = await evaluate_seats(
        seats, config, episodes=episodes, seed=seed, temperature=temperature
    )
    success = summary["metrics"].get("success") or {}
    return float(success.get("mean") or 0.0)


@dataclass
class DemoResult:
    """Training result and the arena evaluation before / after."""

    training: TrainResult
    untrained_success: float
    trained_success: float


async def train_demo(
    out: str | Path, *, model: str = "tiny", k: int = 4, scale: float = 1.0
) -> DemoResult:
    """Train the demo team into ``out``, then evaluate the untrained team (both seats
    playing the initial weights) vs the trained one (both checkpoints)."""
    config = demo_config(out, model=model, k=k, scale=scale)
    result = await run_training(config)
    base = Path(out) / "base" / "seed0" if model == "tiny" else Path(model)
    untrained = await evaluate_team(base, base, config)
    checkpoints = result.checkpoints
    trained = await evaluate_team(checkpoints["speaker"], checkpoints["listener"], config)
    return DemoResult(result, untrained, trained)


def print_demo(demo: DemoResult, console: Any = None) -> None:
    """The before/after arena table of :func:`train_demo`, plus each stage's curve ends."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"{SCENARIO}, K=4, speaker + listener: arena (greedy, 200 episodes)")
    table.add_column("team")
    table.add_column("success", justify="right")
    table.add_row("untrained", f"{demo.untrained_success:.3f}")
    table.add_row("trained", f"{demo.trained_success:.3f}")
    table.add_row("chance", "0.250")
    console.print(table)


def main(out: str = "runs/demo-train") -> int:
    """Run :func:`train_demo` and print the comparison."""
    print_demo(asyncio.run(train_demo(out)))
    return 0
