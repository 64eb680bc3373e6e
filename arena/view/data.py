"""Run folders as the viewer sees them: discovery, safe reads, filters and statistics.

A URL never carries a path. :func:`discover` walks the folders given to ``parley view`` and
names each run folder by an id made of ``[A-Za-z0-9_.-]`` only; pages look runs up in that
table, and episodes up by their id inside the run's transcripts. A file is read only when
it is a regular file whose real path (symlinks resolved) lies inside the folder it was found
in, so a symlink planted in a run folder cannot expose anything outside it.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parley.arena.run.stats import mean_ci, pass_hat_k_curve, t975
from parley.arena.run.summary import failure_kind

__all__ = [
    "Source",
    "compare_metrics",
    "discover",
    "finite",
    "failure_groups",
    "failure_kind",
    "filter_episodes",
    "invalid_rates",
    "load_jsonl",
    "metric_table",
    "read_json",
]

RUN_FILES = ("transcripts.jsonl", "summary.json")
"""A folder holding either is a ``parley run`` output."""
TRAIN_FILES = ("metrics.jsonl",)
"""A folder holding this is a ``parley train`` output."""
LEAGUE_FILES = ("league.json",)
"""A folder holding this is a ``parley tournament`` output (its matches are runs below it)."""
EVAL_FILES = ("report.json",)
"""A folder holding this is a ``parley eval`` output (its entries are runs below it)."""
MAX_DEPTH = 4
"""How deep below each given folder runs are looked for."""
_ID_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
EPISODE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
"""What an episode id may look like to be used in a URL or a file name."""


@dataclass(frozen=True)
class Source:
    """One run folder: its id (the only thing a URL names), kind and location."""

    id: str
    kind: str  # "run", "train", "league" or "eval"
    path: Path
    root: Path  # the folder it was found under; nothing outside it is read

    def file(self, name: str) -> Path | None:
        return safe_file(self.root, self.path / name)


def safe_file(root: Path, path: Path) -> Path | None:
    """``path`` if it is a regular file whose real location is inside ``root``, else None."""
    try:
        real = path.resolve(strict=True)
        root_real = root.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if not real.is_relative_to(root_real) or not real.is_file():
        return None
    return real


def _slug(text: str) -> str:
    slug = _ID_BAD.sub("_", text).strip("._") or "run"
    return slug[:120]


def discover(roots: Sequence[Path]) -> dict[str, Source]:
    """Every run and training folder under ``roots`` (themselves included), by id."""
    found: dict[str, Source] = {}
    for root in roots:
        root = Path(root).resolve()
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            here = Path(dirpath)
            depth = len(here.relative_to(root).parts)
            if depth >= MAX_DEPTH:
                dirnames.clear()
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            names = set(filenames)
            kind = "train" if names & set(TRAIN_FILES) else "run" if names & set(RUN_FILES) else ""
            kind = kind or ("league" if names & set(LEAGUE_FILES) else "")
            kind = kind or ("eval" if names & set(EVAL_FILES) else "")
            if not kind:
                continue
            rel = here.relative_to(root).as_posix()
            base = _slug(root.name if rel == "." else rel)
            sid, n = base, 2
            while sid in found:
                sid, n = f"{base}-{n}", n + 1
            found[sid] = Source(sid, kind, here, root)
            if kind == "train":
                dirnames[:] = [d for d in dirnames if d not in ("checkpoints", "tensorboard")]
    return found


_CACHE_FILES = 8
"""Parsed files kept (least recently used out): a long-lived viewer opening many large runs
would otherwise hold every transcript it ever read."""
_cache: OrderedDict[Path, tuple[tuple[int, int], Any]] = OrderedDict()
_cache_lock = threading.Lock()  # pages are built in worker threads


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return (st.st_mtime_ns, st.st_size)


def load_jsonl(path: Path | None) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file such as ``metrics.jsonl`` (cached until it changes);
    bad lines are skipped. Transcripts are read through :mod:`parley.arena.view.index`."""
    if path is None:
        return []
    stamp = _stamp(path)
    with _cache_lock:
        hit = _cache.get(path)
        if hit is not None and hit[0] == stamp:
            _cache.move_to_end(path)
            rows: list[dict[str, Any]] = hit[1]
            return rows
    rows = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):  # a line being written, a damaged one
                continue
            if isinstance(row, dict) and _sane(row):
                rows.append(row)
    with _cache_lock:
        _cache[path] = (stamp, rows)
        _cache.move_to_end(path)
        while len(_cache) > _CACHE_FILES:
            _cache.popitem(last=False)
    return rows


_ROW_INTS = ("task", "trial", "update", "episodes")
_ROW_MAPS = ("metrics", "returns", "agents", "infos", "actions")


def _sane(row: Mapping[str, Any]) -> bool:
    """Whether the fields the pages read have the types they expect: a row written by
    something else (or by hand) is skipped like a damaged line, so that one bad line in a
    run folder cannot break the pages of every run."""
    for key in _ROW_INTS:
        value = row.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**9:
            return False
    return all(isinstance(row.get(key, {}), Mapping) for key in _ROW_MAPS)


def finite(value: Any, depth: int = 0) -> Any:
    """``value`` with every NaN or infinity replaced by None, so that it is valid JSON
    (metrics.jsonl may hold ``NaN``, which Python reads and browsers refuse), and anything
    nested deeper than 32 levels too (600 nested lists had raised RecursionError in the live
    feed, which then sent no row at all)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict | list) and depth >= 32:
        return None
    if isinstance(value, dict):
        return {k: finite(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v, depth + 1) for v in value]
    return value


def read_json(path: Path | None) -> dict[str, Any]:
    """A JSON object file, or ``{}`` when absent or unreadable."""
    if path is None:
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def failure_groups(episodes: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[str, str]]]:
    """Failed episodes grouped by failure kind: ``{kind: [(episode, reason), ...]}``."""
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for ep in episodes:
        if ep.get("status") == "failed":
            reason = str(ep.get("failed", ""))
            groups[failure_kind(reason)].append((str(ep.get("episode", "")), reason))
    return dict(sorted(groups.items(), key=lambda kv: -len(kv[1])))


def invalid_rates(episodes: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """Per seat: ``(actions, invalid actions)`` over episode rows
    (:func:`~parley.arena.view.index.episode_row`): a step's ``infos[seat]["invalid"]``
    judges the action that seat played in that step."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for ep in episodes:
        for seat, n in ep["_acted"].items():
            out[seat][0] += n
        for seat, n in ep["_invalid"].items():
            out[seat][1] += n
    return {seat: (a, b) for seat, (a, b) in sorted(out.items())}


def metric_values(episodes: Iterable[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Each metric's values over ok episodes, plus ``return[SEAT]``."""
    values: dict[str, list[float]] = defaultdict(list)
    for ep in episodes:
        if ep.get("status") != "ok":
            continue
        for name, value in (ep.get("metrics") or {}).items():
            if isinstance(value, int | float) and math.isfinite(value):
                values[name].append(float(value))
        for seat, value in (ep.get("returns") or {}).items():
            if isinstance(value, int | float) and math.isfinite(value):
                values[f"return[{seat}]"].append(float(value))
    return dict(sorted(values.items()))


@dataclass
class MetricRow:
    name: str
    mean: float
    ci95: float
    n: int


def metric_table(episodes: Sequence[Mapping[str, Any]]) -> list[MetricRow]:
    """Mean and 95 % CI half-width of every metric over ok episodes."""
    rows = []
    for name, vals in metric_values(episodes).items():
        m = mean_ci(vals)
        rows.append(MetricRow(name, m.mean, m.ci95, m.n))
    return rows


def pass_k(episodes: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """pass^k from the ``success`` metric, k = 1..trials (empty without ``success``)."""
    per_task: dict[int, list[float]] = defaultdict(list)
    played: Counter[int] = Counter()  # episodes per task, failed ones included
    trials = 0
    for ep in episodes:
        trials = max(trials, int(ep.get("trial", 0)) + 1)
        played[int(ep.get("task", 0))] += 1
        success = (ep.get("metrics") or {}).get("success")
        if ep.get("status") == "ok" and isinstance(success, int | float):
            per_task[int(ep.get("task", 0))].append(float(success))
    # (k goes no further than the trials a task has rows for, whatever a row's number says)
    trials = min(trials, max(played.values(), default=0))
    return pass_hat_k_curve(per_task, trials) if per_task else {}


@dataclass
class CompareRow:
    name: str
    a: MetricRow | None
    b: MetricRow | None
    diff: float = math.nan  # b - a
    ci95: float = math.nan  # Welch half-width of the difference
    extra: dict[str, Any] = field(default_factory=dict)


def compare_metrics(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]
) -> list[CompareRow]:
    """Metrics of two runs side by side, the difference ``b - a`` and its Welch 95 % CI."""
    va, vb = metric_values(a), metric_values(b)
    rows = []
    for name in sorted(set(va) | set(vb)):
        ma = _row(name, va.get(name))
        mb = _row(name, vb.get(name))
        row = CompareRow(name, ma, mb)
        if ma is not None and mb is not None:
            row.diff = mb.mean - ma.mean
            row.ci95 = _welch(va[name], vb[name])
        rows.append(row)
    return rows


def _row(name: str, vals: list[float] | None) -> MetricRow | None:
    if not vals:
        return None
    m = mean_ci(vals)
    return MetricRow(name, m.mean, m.ci95, m.n)


def _var(vals: Sequence[float]) -> float:
    n = len(vals)
    mean = math.fsum(vals) / n
    return math.fsum((v - mean) ** 2 for v in vals) / (n - 1)


def _welch(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) < 2 or len(b) < 2:
        return math.nan
    sa, sb = _var(a) / len(a), _var(b) / len(b)
    se2 = sa + sb
    if se2 == 0:
        return 0.0
    df = se2**2 / (sa**2 / (len(a) - 1) + sb**2 / (len(b) - 1))
    return t975(df) * math.sqrt(se2)


def _in_range(value: Any, lo: float | None, hi: float | None) -> bool:
    if not isinstance(value, int | float):
        return False
    return (lo is None or value >= lo) and (hi is None or value <= hi)


def _float(text: str | None) -> float | None:
    if text is None or text.strip() == "":
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def filter_episodes(
    episodes: Iterable[Mapping[str, Any]], query: Mapping[str, str]
) -> list[Mapping[str, Any]]:
    """Episode rows (:func:`~parley.arena.view.index.episode_row`) matching the query:
    ``status`` (ok/failed), ``reason`` (failure kind or text in the reason), ``seat`` (played
    by or failed in that seat; with ``invalid=1``: that seat made an invalid move),
    ``metric`` with ``min``/``max``, ``return_seat`` with ``return_min``/``return_max``.
    Unknown or malformed values filter nothing."""
    status = query.get("status", "")
    reason = query.get("reason", "").strip()
    seat = query.get("seat", "").strip()
    invalid = query.get("invalid", "") in ("1", "true", "on")
    metric = query.get("metric", "").strip()
    lo, hi = _float(query.get("min")), _float(query.get("max"))
    rseat = query.get("return_seat", "").strip()
    rlo, rhi = _float(query.get("return_min")), _float(query.get("return_max"))
    out = []
    for ep in episodes:
        if status in ("ok", "failed") and ep.get("status") != status:
            continue
        why = str(ep.get("failed", ""))
        if reason and not (failure_kind(why) == reason or (reason in why and why)):
            continue
        if seat:
            if seat not in (ep.get("agents") or {}):
                continue
            if invalid and not ep["_invalid"].get(seat):
                continue
        elif invalid and not ep["_invalid"]:
            continue
        ranged = lo is not None or hi is not None
        if metric and ranged and not _in_range((ep.get("metrics") or {}).get(metric), lo, hi):
            continue
        rranged = rlo is not None or rhi is not None
        if rseat and rranged and not _in_range((ep.get("returns") or {}).get(rseat), rlo, rhi):
            continue
        out.append(ep)
    return out
