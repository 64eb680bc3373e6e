"""Train ``examples/referential.yaml`` on several seeds and evaluate each team greedily.

    python examples/referential_seeds.py --seeds 0-9 --out runs/ref-seeds

One run per seed (``seed=N``: the tiny models' initialisation, every stage's episodes and
the trainer's generator), one after the other, each followed by a greedy arena evaluation
of its checkpoints on 400 episodes with the prompts they were trained on. Prints a table
(per stage, its final attempt: first batch -> mean of the last 10, updates, seconds; each
restart: the stage that stalled and where; wall-clock; greedy success) and writes it as
``OUT/seeds.json`` and ``OUT/seeds.md``; a seed already in ``OUT/seeds.json`` is skipped,
so an interrupted sweep goes on where it stopped.
Extra ``key=value`` arguments override the config for every seed (``pg.lr=3e-3``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

CONFIG = Path(__file__).with_name("referential.yaml")


def seed_list(text: str) -> list[int]:
    """``0-9`` or ``0,3,5`` (or both: ``0-4,7``)."""
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds.extend(range(int(first), int(last or first) + 1))
    return seeds


def run_seed(seed: int, out: Path, overrides: list[str], episodes: int) -> dict[str, Any]:
    """Train one seed, evaluate its team greedily; the row of the table."""
    from parley.arena.cli.demo_train import evaluate_team
    from parley.arena.training.config import load_train_config
    from parley.arena.training.loop import train

    run_out = out / f"seed{seed}"
    config = load_train_config(CONFIG, [f"seed={seed}", f"out={run_out}", *overrides])
    started = time.perf_counter()
    result = train(config)
    wall = time.perf_counter() - started
    checkpoints = result.checkpoints
    greedy = asyncio.run(
        evaluate_team(checkpoints["speaker"], checkpoints["listener"], config, episodes=episodes)
    )
    stages = [
        {
            "stage": s["stage"],
            "attempt": s.get("attempt", 0),
            "stalled": bool(s.get("stalled")),
            "first": s["first"],
            "last": s["last"],
            "updates": s["updates"],
            "wall_s": s["wall_s"],
        }
        for s in result.stage_summaries
    ]
    restarts = sum(s["stalled"] for s in stages)
    return {"seed": seed, "wall_s": round(wall, 1), "restarts": restarts, "greedy": greedy,
            "episodes": episodes, "stages": stages}  # fmt: skip


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README's table: one row per seed, the final attempt of each stage."""
    lines = [
        "| seed | listener stage | speaker stage | joint stage | restarts | wall-clock "
        "| arena, greedy |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in sorted(rows, key=lambda r: r["seed"]):
        final: dict[str, dict[str, Any]] = {}
        for s in row["stages"]:
            final[s["stage"]] = s  # the last attempt of each stage wins
        cells = [
            f"{s['first']:.2f} → {s['last']:.2f}, {s['updates']} upd., {s['wall_s']:.0f} s"
            if s["first"] is not None
            else "-"
            for s in (final.get(n, {"first": None}) for n in ("listener", "speaker", "joint"))
        ]
        # Each restart: the stage that stalled and its last 10 batches' mean then.
        stalls = ", ".join(f"{s['stage']} {s['last']:.3f}" for s in row["stages"] if s["stalled"])
        restarts = f"{row['restarts']} ({stalls})" if stalls else "0"
        lines.append(
            f"| {row['seed']} | {' | '.join(cells)} | {restarts} "
            f"| {row['wall_s']:.0f} s | {row['greedy']:.3f} |"
        )
    passed = sum(r["greedy"] >= 0.9 for r in rows)
    worst = max((r["wall_s"] for r in rows), default=0.0)
    lines.append(f"\n{passed} of {len(rows)} seeds >= 0.9 greedy; longest run {worst:.0f} s.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 0,3,5 (default 0-9)")
    parser.add_argument("--out", default="runs/ref-seeds", help="one folder per seed in it")
    parser.add_argument("--episodes", type=int, default=400, help="greedy arena episodes")
    parser.add_argument("overrides", nargs="*", help="config overrides, key.sub=value")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "seeds.json"
    rows: list[dict[str, Any]] = json.loads(results.read_text()) if results.exists() else []
    done = {r["seed"] for r in rows}
    for seed in seed_list(args.seeds):
        if seed in done:
            continue
        row = run_seed(seed, out, args.overrides, args.episodes)
        rows.append(row)
        results.write_text(json.dumps(rows, indent=1))
        print(f"seed {seed}: greedy {row['greedy']:.3f}, {row['restarts']} restarts, "
              f"{row['wall_s']:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
    table = markdown(rows)
    (out / "seeds.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
