"""Train a recipe on several seeds and evaluate each trained team greedily: the seed table.

    python examples/recipe_seeds.py examples/hidden-profile.yaml --seeds 2-6 \
        --out runs/hp-seeds --episodes 200 threads=1

One run per seed (``seed=N``: the tiny models' initialisation, every stage's episodes and
the trainer's generator), one after the other, each followed by a greedy arena evaluation
of its checkpoints in the seats of the recipe's last stage (the other seats as that stage
plays them), with the prompts they were trained on
(:func:`parley.arena.training.evaluate.evaluate_seats`), watching the last stage's metric.
A seed passes when no stage ended short of its target (``parley train`` would exit 0) and
its arena figure is at least ``--pass-at``.

Prints a table (per stage, its final attempt: first batch -> mean of the last window,
updates, seconds; each restart: the stage that stalled and where; the stages short of
target; wall-clock; the 1-minute load average as the run started and ended; the arena
figure; pass) and writes it as ``OUT/seeds.md``, the rows as ``OUT/seeds.json``. A seed
already in ``OUT/seeds.json`` is skipped, so an interrupted sweep goes on where it stopped;
a seed whose run finished in ``OUT/seedN`` (its ``summary.json`` and checkpoints there, say
from ``parley train ... out=OUT/seedN``) is evaluated without training again (its load
average is then unknown). Extra ``key=value`` arguments override the config for every seed
(``threads=1``, ``pg.lr=3e-3``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def seed_list(text: str) -> list[int]:
    """``0-9`` or ``0,3,5`` (or both: ``0-4,7``); anything else is an argparse error."""
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or not (last or first).isdigit():
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a seed or a range: write e.g. 0-9, 0,3,5 or 0-4,7"
            )
        low, high = int(first), int(last or first)
        if high < low:
            raise argparse.ArgumentTypeError(
                f"{part!r}: the range runs backwards (write {high}-{low})"
            )
        seeds.extend(range(low, high + 1))
    return seeds


def arena_seats(config: Any, checkpoints: dict[str, Path]) -> dict[str, str]:
    """The last stage's seats: a ``policy:NAME`` seat plays NAME's checkpoint, any other
    seat its agent spec (``scripted``, ``module:Class``)."""
    seats: dict[str, str] = {}
    for seat, spec in config.stages[-1].agents.items():
        name = spec.removeprefix("policy:")
        seats[seat] = str(checkpoints[name]) if spec.startswith("policy:") else spec
    return seats


def _train_or_adopt(config: Any, run_out: Path) -> tuple[dict[str, Any], float | None]:
    """The run's ``summary.json`` and the load average as it ended (None for a run that had
    already finished in ``run_out``: trained elsewhere, its load unknown)."""
    summary_path = run_out / "summary.json"
    finished = summary_path.exists() and all(
        (run_out / "checkpoints" / name).exists() for name in config.policies
    )
    if not finished:
        from parley.arena.training.loop import train

        train(config)
        return json.loads(summary_path.read_text()), os.getloadavg()[0]
    return json.loads(summary_path.read_text()), None


def run_seed(
    config_path: Path, seed: int, out: Path, overrides: list[str], episodes: int, pass_at: float
) -> dict[str, Any]:
    """Train one seed (or adopt its finished run), evaluate its team greedily: the row."""
    from parley.arena.training.config import load_train_config
    from parley.arena.training.evaluate import evaluate_seats

    run_out = out / f"seed{seed}"
    config = load_train_config(config_path, [f"seed={seed}", f"out={run_out}", *overrides])
    load_start = os.getloadavg()[0]
    summary, load_end = _train_or_adopt(config, run_out)
    checkpoints = {name: run_out / "checkpoints" / name for name in config.policies}
    metric = config.stages[-1].metric
    arena = asyncio.run(
        evaluate_seats(arena_seats(config, checkpoints), config, episodes=episodes, seed=1)
    )
    value = float((arena["metrics"].get(metric) or {}).get("mean") or 0.0)
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
        for s in summary["stages"]
    ]
    short = list(summary.get("short_of_target", []))
    load = None if load_end is None else [round(load_start, 1), round(load_end, 1)]
    return {"seed": seed, "wall_s": round(summary["wall_s"], 1), "load": load,
            "restarts": sum(s["stalled"] for s in stages), "short_of_target": short,
            "metric": metric, "arena": value, "episodes": episodes,
            "passed": not short and value >= pass_at, "stages": stages}  # fmt: skip


def markdown(rows: list[dict[str, Any]], stage_names: list[str], pass_at: float) -> str:
    """The recipe page's table: one row per seed, the final attempt of each stage."""
    metric = rows[0]["metric"] if rows else "success"
    header = " | ".join(f"{name} stage" for name in stage_names)
    lines = [
        f"| seed | {header} | restarts | short of target | wall-clock | load avg "
        f"| arena {metric}, greedy | pass |",
        "|---|" + "---|" * (len(stage_names) + 6),
    ]
    for row in sorted(rows, key=lambda r: r["seed"]):
        final: dict[str, dict[str, Any]] = {}
        for s in row["stages"]:
            final[s["stage"]] = s  # the last attempt of each stage wins
        cells = [
            f"{s['first']:.2f} → {s['last']:.2f}, {s['updates']} upd., {s['wall_s']:.0f} s"
            if s["first"] is not None
            else "-"
            for s in (final.get(n, {"first": None}) for n in stage_names)
        ]
        # Each restart: the stage that stalled and its last window's mean then.
        stalls = ", ".join(f"{s['stage']} {s['last']:.3f}" for s in row["stages"] if s["stalled"])
        restarts = f"{row['restarts']} ({stalls})" if stalls else "0"
        short = ", ".join(row["short_of_target"]) or "-"
        load = row.get("load")
        load_cell = f"{load[0]:.1f} → {load[1]:.1f}" if load else "-"
        lines.append(
            f"| {row['seed']} | {' | '.join(cells)} | {restarts} | {short} "
            f"| {row['wall_s']:.0f} s | {load_cell} | {row['arena']:.3f} "
            f"| {'pass' if row['passed'] else '**fail**'} |"
        )
    passed = sum(r["passed"] for r in rows)
    worst = max((r["wall_s"] for r in rows), default=0.0)
    lines.append(
        f"\n{passed} of {len(rows)} seeds pass (every stage at its target, arena {metric} "
        f">= {pass_at:g}); longest run {worst:.0f} s."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None, *, config: Path | None = None,
         pass_at: float = 0.9) -> int:  # fmt: skip
    """The command line; ``config`` and ``pass_at``: defaults of a recipe's own script."""
    from parley.arena.training.config import load_train_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    if config is None:
        parser.add_argument("config", type=Path, help="the recipe's yaml")
    parser.add_argument(
        "--seeds", type=seed_list, default="0-9", help="e.g. 0-9 or 0,3,5 (default 0-9)"
    )
    parser.add_argument("--out", default="runs/seeds", help="one folder per seed in it")
    parser.add_argument("--episodes", type=int, default=400, help="greedy arena episodes")
    parser.add_argument(
        "--pass-at", type=float, default=pass_at, help=f"arena figure to pass ({pass_at:g})"
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, key.sub=value")
    args = parser.parse_intermixed_args(argv)  # overrides after the options too
    config_path: Path = config if config is not None else args.config
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "seeds.json"
    rows: list[dict[str, Any]] = json.loads(results.read_text()) if results.exists() else []
    done = {r["seed"] for r in rows}
    for seed in args.seeds:
        if seed in done:
            continue
        started = time.perf_counter()
        row = run_seed(config_path, seed, out, args.overrides, args.episodes, args.pass_at)
        rows.append(row)
        results.write_text(json.dumps(rows, indent=1))
        print(f"seed {seed}: arena {row['arena']:.3f}, {row['restarts']} restarts, short of "
              f"target: {row['short_of_target'] or '-'}, {row['wall_s']:.0f} s "
              f"({time.perf_counter() - started:.0f} s with the arena)",
              file=sys.stderr, flush=True)  # fmt: skip
    # The stages as the runs had them: the overrides may change them.
    stages = load_train_config(config_path, list(args.overrides)).stages
    names = list(dict.fromkeys(s.name for s in stages))
    table = markdown(rows, names, args.pass_at)
    (out / "seeds.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
