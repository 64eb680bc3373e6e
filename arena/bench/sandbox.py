"""Sandboxed Python runs beside bare interpreter starts, and tool calls beside direct calls.

In one run:

* ``sandbox_ratio_vs_bare`` — runs/s of :class:`~parley.scenarios.tools.Sandbox` (namespaces,
  new root, limits; a trivial program) over runs/s of a bare ``python -I -S -c`` subprocess
  running the same program: the price of the isolation per run;
* ``sandbox_concurrent_speedup`` — runs/s with ``--workers`` runs at a time over one at a time;
* ``toolbox_ratio_vs_direct`` — calls/s through :meth:`ToolBox.call` (JSON arguments,
  schema validation, result encoding) over calls/s of the plain function.

Timings are the best of ``--repeats``, the variants of each pair interleaved. ``--json`` prints
one object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from parley.protocols.messages import ToolCall
from parley.scenarios.tools import Sandbox, SandboxLimits, ToolBox, tool
from parley.scenarios.tools.sandbox import isolation

__all__ = ["add_arguments", "run"]

PROGRAM = "print(sum(range(1000)))"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=20, help="program runs per case")
    parser.add_argument("--workers", type=int, default=2, help="concurrent runs")
    parser.add_argument("--calls", type=int, default=20_000, help="tool calls per case")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")


def _rate(count: int, work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return count / (time.perf_counter() - start)


def lookup(order_id: str, quantity: int) -> dict[str, Any]:
    """A cheap tool.

    Args:
        order_id: an id
        quantity: a count
    """
    return {"order_id": order_id, "quantity": quantity}


def _measure(args: argparse.Namespace, step: Callable[[str], None]) -> dict[str, Any]:
    sandbox = Sandbox(SandboxLimits(), allow_weak=True)
    bare = [sys.executable, "-I", "-S", "-c", PROGRAM]
    box = ToolBox([tool(lookup)])
    call = ToolCall(call_id="c", name="lookup", arguments='{"order_id": "#1", "quantity": 2}')

    def sandbox_serial() -> None:
        for _ in range(args.runs):
            sandbox.run(PROGRAM)

    def sandbox_parallel() -> None:
        with ThreadPoolExecutor(args.workers) as pool:
            list(pool.map(lambda _: sandbox.run(PROGRAM), range(args.runs)))

    def bare_serial() -> None:
        for _ in range(args.runs):
            subprocess.run(bare, capture_output=True, check=True)

    best: dict[str, float] = {}
    cases: dict[str, tuple[int, Callable[[], object]]] = {
        "sandbox_runs_per_s": (args.runs, sandbox_serial),
        "bare_runs_per_s": (args.runs, bare_serial),
        "sandbox_runs_per_s_concurrent": (args.runs, sandbox_parallel),
        "toolbox_calls_per_s": (args.calls, lambda: [box.call(call) for _ in range(args.calls)]),
        "direct_calls_per_s": (
            args.calls,
            lambda: [lookup(**json.loads(call.arguments)) for _ in range(args.calls)],
        ),
    }
    for _ in range(args.repeats):
        for name, (count, work) in cases.items():
            step(name)
            best[name] = max(best.get(name, 0.0), _rate(count, work))
    return {
        **best,
        "isolation": isolation(),
        "sandbox_ratio_vs_bare": best["sandbox_runs_per_s"] / best["bare_runs_per_s"],
        "sandbox_concurrent_speedup": best["sandbox_runs_per_s_concurrent"]
        / best["sandbox_runs_per_s"],
        "toolbox_ratio_vs_direct": best["toolbox_calls_per_s"] / best["direct_calls_per_s"],
    }


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    console = Console(stderr=args.json)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("sandbox bench", total=5 * args.repeats)

        def step(label: str) -> None:
            progress.update(task, description=label, advance=1)

        results = _measure(args, step)
    if args.json:
        print(json.dumps(results))
        return 0
    table = Table(title=f"sandbox ({results['isolation']}) and tool calls")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in results.items():
        table.add_row(key, f"{value:,.3f}" if isinstance(value, float) else str(value))
    console.print(table)
    return 0
