"""A short training demo, then an arena of the trained model vs the untrained one.

:func:`train_demo` is what ``make demo`` / ``parley demo`` can call. It runs the part of
the referential recipe that learns within minutes on a 2-core CPU (see
``examples/referential.md``): K = 2 candidates, the speaker (tiny random model) gets the
generic naming warm start, then learns the code by RL against the scripted listener,
through the real path. Then it plays evaluation episodes of the untrained and of the
trained speaker (both as ``llm:`` agents loading checkpoints, like ``parley run``) with the
scripted listener, and returns both success rates (chance: 0.5).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.arena.trainers.loop import TrainResult, load_train_config, run_training

__all__ = ["DemoResult", "demo_config", "evaluate_team", "train_demo"]

SCENARIO = "collaboration/referential-v0"
WORDS = ["red", "blue", "green", "yellow"]
LETTERS = "abcdefgh"


def demo_config(out: str | Path, *, model: str = "tiny", k: int = 2, scale: float = 1.0) -> Any:
    """The demo's :class:`~parley.arena.trainers.loop.TrainConfig` (``scale`` multiplies
    every stage's update budget)."""

    def n(updates: int) -> int:
        return max(1, int(updates * scale))

    return load_train_config(
        data={
            "scenario": SCENARIO,
            "scenario_kwargs": {
                "n_candidates": k,
                "n_attributes": 1,
                "n_values": len(WORDS),
                "vocab_size": len(WORDS),
                "message_length": 1,
            },
            "model": model,
            "policies": ["speaker"],
            "agent": {"temperature": 1.0, "max_tokens": 2, "system_prompt": False},
            "sampler": {"batch_size": 64, "staleness": 0, "concurrency": 64},
            "pg": {"estimator": "grpo", "grouping": "role", "lr": 3e-3},
            "threads": 2,
            "stages": [
                {
                    "name": "naming",
                    "kind": "reading",
                    "train": ["speaker"],
                    "max_updates": n(100),
                    "target": 0.97,
                    "reading": {
                        "task": "repeat",
                        "question": f"Message (1 letters from {LETTERS[: len(WORDS)]}):",
                        "words": WORDS,
                        "min_items": k,
                        "max_items": k,
                        "max_words": 1,
                    },
                },
                {
                    "name": "speaker",
                    "agents": {"speaker": "policy:speaker", "listener": "scripted"},
                    "train": ["speaker"],
                    "max_updates": n(600),
                    "target": 0.9,
                    "window": 10,
                },
            ],
            "out": str(out),
            "progress": True,
        }
    )


async def evaluate_team(
    speaker: str | Path, listener: str | Path, config: Any, *, episodes: int = 200, seed: int = 1
) -> float:
    """Success rate of ``llm:speaker`` + ``llm:listener`` (greedy) over ``episodes``;
    ``"scripted"`` for either seat plays its scripted baseline."""
    from parley.arena.llm_spec import close_shared_pools
    from parley.arena.run_config import RunConfig
    from parley.arena.runner import Runner

    query = "?temperature=0&max_tokens=2"
    run_config = RunConfig(
        scenario=config.scenario,
        scenario_kwargs=dict(config.scenario_kwargs),
        agents={
            seat: "scripted" if str(spec) == "scripted" else f"llm:{spec}{query}"
            for seat, spec in (("speaker", speaker), ("listener", listener))
        },
        episodes=episodes,
        concurrency=64,
        seed=seed,
        progress=False,
    )
    try:
        result = await Runner(run_config).run()
    finally:
        await close_shared_pools()
    ok = [r.metrics["success"] for r in result.records if "success" in r.metrics]
    return float(sum(ok) / len(ok)) if ok else 0.0


@dataclass
class DemoResult:
    """Training result and the arena evaluation before / after."""

    training: TrainResult
    untrained_success: float
    trained_success: float


async def train_demo(out: str | Path, *, model: str = "tiny", scale: float = 1.0) -> DemoResult:
    """Train the demo team into ``out``, then evaluate untrained vs trained."""
    config = demo_config(out, model=model, scale=scale)
    result = await run_training(config)
    base = Path(out) / "base" / "seed0" if model == "tiny" else Path(model)
    untrained = await evaluate_team(base, "scripted", config)
    trained = await evaluate_team(result.checkpoints["speaker"], "scripted", config)
    return DemoResult(result, untrained, trained)


def main(out: str = "runs/demo-train") -> int:
    """Run :func:`train_demo` and print the comparison."""
    from rich.console import Console
    from rich.table import Table

    demo = asyncio.run(train_demo(out))
    table = Table(title=f"{SCENARIO}, K=2, scripted listener: arena (greedy, 200 episodes)")
    table.add_column("speaker")
    table.add_column("success", justify="right")
    table.add_row("untrained", f"{demo.untrained_success:.3f}")
    table.add_row("trained", f"{demo.trained_success:.3f}")
    Console().print(table)
    return 0
