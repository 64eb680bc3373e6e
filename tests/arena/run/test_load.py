"""The runner under load: back-pressure instead of failed episodes, flat memory, prompt exit,
a streamed summary equal to the summary of every record, and ``parley run``'s exit status.

Agents here await once per action (10 ms), as every LLM agent does: that is what keeps a
request handler suspended in the agent host and what made the bus refuse requests before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from parley.agents.base import Agent
from parley.arena.run.agent_specs import AgentFactory, SeatContext, resolve_agent_spec
from parley.arena.run.config import RunConfig
from parley.arena.run.records import EpisodeRecord
from parley.arena.run.runner import Runner, _baseline, run
from parley.arena.run.stats import _PENDING, _T_975, MeanCI, Moments, PassHatK, pass_hat_k_curve
from parley.arena.run.summary import MAX_LISTED_FAILURES, SummaryBuilder, failure_kind
from parley.protocols.bus import BusConfig
from parley.protocols.errors import ConfigError
from parley.protocols.messages import Action, Observation
from tests.arena.run.test_runner import SCENARIO, NoisyAgent, TargetAgent, _Hang, _nth_instance

HERE = "tests.arena.run.test_load"


class _Slow(Agent):
    """Awaits ``delay`` seconds, then plays as ``inner`` would (an LLM's one await per act)."""

    def __init__(self, inner: Agent, delay: float = 0.01) -> None:
        self.inner, self.delay = inner, delay

    def reset(self, seed: int | None = None) -> None:
        self.inner.reset(seed)

    async def act(self, observation: Observation) -> Action:
        await asyncio.sleep(self.delay)
        return await self.inner.act(observation)


def _slow_baselines(scenario: str, seats: Sequence[str]) -> dict[str, AgentFactory]:
    factories: dict[str, AgentFactory] = {}
    for seat in seats:
        context = SeatContext(scenario=scenario, seat=seat, baseline=_baseline(scenario, seat))
        inner = resolve_agent_spec("scripted", context)
        assert callable(inner)
        factories[seat] = lambda inner=inner: _Slow(inner())
    return factories


class _FailsOnSomeSeeds(Agent):
    """Raises for one seed in three (deterministic per run seed), else says the target."""

    def reset(self, seed: int | None = None) -> None:
        self.broken = seed is not None and seed % 3 == 0

    async def act(self, observation: Observation) -> Action:
        if self.broken:
            raise RuntimeError("broken for this seed")
        return Action(agent=observation.agent, text=str(observation.info["target"]))


# --------------------------------------------------------------------- back-pressure


@pytest.mark.timeout(60)
def test_requests_refused_as_overloaded_wait_and_no_episode_fails(tmp_path: Path) -> None:
    # Two handler slots for 32 concurrent episodes: nearly every request is refused at first.
    config = RunConfig(scenario=SCENARIO, episodes=64, concurrency=32, progress=False,
                       out=str(tmp_path / "a"), local_agents_over_bus=True)  # fmt: skip
    slow = {seat: (lambda: _Slow(TargetAgent())) for seat in ("a", "b")}
    runner = Runner(config, agents=slow, bus=BusConfig(max_handlers=2))
    result = asyncio.run(runner.run())
    assert result.summary["episodes"] == {"total": 64, "ok": 64, "failed": 0}
    assert runner.overloaded_retries > 0
    assert result.summary["timing"]["overloaded_retries"] == runner.overloaded_retries
    # Back-pressure changes timing only: the same episodes as a run that was never refused.
    run(config.replace(out=str(tmp_path / "b")), agents=slow)
    transcripts = (tmp_path / "a" / "transcripts.jsonl").read_bytes()
    assert transcripts == (tmp_path / "b" / "transcripts.jsonl").read_bytes()


@pytest.mark.timeout(30)
def test_a_peer_that_stays_overloaded_fails_the_episode_within_act_timeout() -> None:
    # One handler slot, taken by an agent that never answers: the other episode is refused
    # until its act timeout, and fails then with a reason that says so (no endless retry).
    config = RunConfig(scenario=SCENARIO, episodes=2, concurrency=2, act_timeout=0.6,
                       progress=False, local_agents_over_bus=True)  # fmt: skip
    agents = {"a": _nth_instance(0, _Hang), "b": TargetAgent}
    started = time.perf_counter()
    result = run(config, agents=agents, bus=BusConfig(max_handlers=1), keep_records=True)
    assert time.perf_counter() - started < 5
    reasons = sorted(r.failed for r in result.records)
    assert reasons[0].startswith("a: timeout: ")
    assert reasons[1].startswith("a: timeout: still refused as overloaded after ")
    assert result.summary["failure_kinds"] == {"timeout": 2}


def test_derived_bus_bounds_cover_every_seat_of_every_episode() -> None:
    runner = Runner(RunConfig(scenario="negotiation/split-the-pie-v0",
                              scenario_kwargs={"n_players": 7}, concurrency=2048))  # fmt: skip
    bus = runner.bus_config
    assert bus.max_handlers >= 2048 * 7
    assert bus.max_pending >= 2048 * 7
    assert bus.hwm >= 2 * 2048 * 7
    given = BusConfig(max_handlers=3)  # a caller's bus is used as given
    assert Runner(RunConfig(scenario=SCENARIO), bus=given).bus_config is given


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("scenario", "kwargs", "episodes", "over_bus"),
    [
        ("negotiation/deal-or-no-deal-v0", {"max_turns": 2}, 4096, True),
        ("negotiation/split-the-pie-v0", {"n_players": 7, "max_rounds": 1}, 1024, True),
        ("negotiation/deal-or-no-deal-v0", {"max_turns": 2}, 4096, False),
    ],
)
def test_thousands_of_concurrent_episodes_with_awaiting_agents_all_finish(
    scenario: str, kwargs: dict[str, Any], episodes: int, over_bus: bool
) -> None:
    # Over the bus every suspended act holds a handler of the agent host and a pending
    # request of the arena; called directly, a task each.
    config = RunConfig(scenario=scenario, scenario_kwargs=kwargs, episodes=episodes,
                       concurrency=episodes, progress=False,
                       local_agents_over_bus=over_bus)  # fmt: skip
    seats = Runner(config).seats
    result = run(config, agents=_slow_baselines(scenario, seats))
    summary = result.summary
    assert summary["failures"] == []
    assert summary["episodes"] == {"total": episodes, "ok": episodes, "failed": 0}
    assert summary["agent_steps"] >= episodes * 2


@pytest.mark.timeout(60)
def test_agents_called_directly_or_over_the_bus_play_the_same_episodes(tmp_path: Path) -> None:
    # Noisy moves, an agent that raises, infos the wire cannot carry: same files either way.
    for over_bus in (False, True):
        for kwargs in ({}, {"weird_info_at": 4}):
            agents = {"a": NoisyAgent, "b": _nth_instance(3, _FailsOnEverySeed)}
            out = tmp_path / f"{over_bus}-{bool(kwargs)}"
            config = RunConfig(scenario=SCENARIO, scenario_kwargs=kwargs, episodes=6,
                               concurrency=3, progress=False, out=str(out),
                               local_agents_over_bus=over_bus)  # fmt: skip
            run(config, agents=agents)
    for weird in (False, True):
        for name in ("transcripts.jsonl", "trajectories.jsonl"):
            direct = (tmp_path / f"False-{weird}" / name).read_bytes()
            assert direct == (tmp_path / f"True-{weird}" / name).read_bytes(), name
    rows = [json.loads(line) for line in (tmp_path / "False-False" / "transcripts.jsonl")
            .read_text().splitlines()]  # fmt: skip
    assert [row["failed"] for row in rows].count("b: agent_error: RuntimeError: always broken") == 1
    weird_rows = (tmp_path / "False-True" / "transcripts.jsonl").read_text().splitlines()
    kinds = [json.loads(row)["failed"].split(": ")[:2] for row in weird_rows]
    assert kinds.count(["a", "protocol_error"]) >= 5


# --------------------------------------------------------------------- exit status


@pytest.mark.timeout(60)
def test_parley_run_exits_1_when_more_episodes_fail_than_allowed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from parley.arena.cli import main

    argv = ["run", SCENARIO, "--episodes", "12", "--no-progress", "--json",
            "--agents", f"{HERE}:_FailsOnSomeSeeds,scripted"]  # fmt: skip
    assert main(argv) == 1  # any failed episode fails the run by default
    episodes = json.loads(capsys.readouterr().out)["episodes"]
    assert 0 < episodes["failed"] < 12
    fraction = episodes["failed"] / episodes["total"]
    assert main([*argv, "--max-failed-fraction", str(fraction)]) == 0
    assert main([*argv, "--max-failed-fraction", str(fraction - 0.01)]) == 1
    assert main([*argv, "--max-failed-fraction", "1.5"]) == 2
    with pytest.raises(ConfigError, match="max_failed_fraction"):
        RunConfig(scenario=SCENARIO, max_failed_fraction=-0.1)


def test_records_are_kept_only_when_asked() -> None:
    result = run(RunConfig(scenario=SCENARIO, episodes=3, progress=False))
    with pytest.raises(ConfigError, match="keep_records=True"):
        _ = result.records
    assert "records" not in repr(result)
    kept = run(RunConfig(scenario=SCENARIO, episodes=3, progress=False), keep_records=True)
    assert [r.index for r in kept.records] == [0, 1, 2]


# --------------------------------------------------------------------- the streamed summary


def _reference_summary(records: Sequence[EpisodeRecord], trials: int) -> dict[str, Any]:
    """The summary as it was computed before streaming: from the list of every record."""

    def mean_ci(values: list[float]) -> dict[str, Any]:
        n = len(values)
        mean = math.fsum(values) / n
        if n == 1:
            return {"mean": mean, "ci95": None, "n": 1}
        var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
        t = _T_975[n - 2] if n - 1 <= len(_T_975) else 1.96
        return {"mean": mean, "ci95": t * math.sqrt(var / n), "n": n}

    records = sorted(records, key=lambda r: r.index)
    ok = [r for r in records if not r.failed]
    failed = [r for r in records if r.failed]
    names = sorted({name for r in ok for name in r.metrics})
    returns: dict[str, list[float]] = defaultdict(list)
    for r in ok:
        for trajectory in r.trajectories:
            returns[trajectory.agent].append(trajectory.reward)
    steps = sum(r.agent_steps for r in records)
    invalid = sum(r.invalid_moves for r in records)
    per_task: dict[int, list[float]] = defaultdict(list)
    for r in ok:
        per_task[r.task].append(r.metrics["success"])
    return {
        "episodes": {"total": len(records), "ok": len(ok), "failed": len(failed)},
        "metrics": {n: mean_ci([r.metrics[n] for r in ok if n in r.metrics]) for n in names},
        "returns": {seat: mean_ci(v) for seat, v in sorted(returns.items())},
        "agent_steps": steps,
        "invalid_moves": invalid,
        "invalid_move_rate": invalid / steps,
        "failures": [{"episode": r.episode, "reason": r.failed} for r in failed],
        "failure_kinds": dict(Counter(failure_kind(r.failed) for r in failed)),
        "pass_hat_k": {str(k): v for k, v in pass_hat_k_curve(per_task, trials).items()},
        "pass_hat_k_tasks": len(per_task),
    }


@pytest.mark.timeout(60)
def test_the_streamed_summary_equals_the_summary_of_every_record(tmp_path: Path) -> None:
    # Noisy moves, a failed episode, several trials, episodes finishing out of order.
    config = RunConfig(scenario=SCENARIO, episodes=7, trials=3, concurrency=5, seed=3,
                       progress=False, out=str(tmp_path), act_timeout=5)  # fmt: skip
    agents = {"a": NoisyAgent, "b": _nth_instance(4, _FailsOnEverySeed)}
    result = run(config, agents=agents, keep_records=True)
    assert result.summary["episodes"]["failed"] == 1
    assert result.summary["invalid_moves"] > 0
    reference = _reference_summary(result.records, trials=3)
    streamed = {key: result.summary[key] for key in reference}
    # The old two-pass variance rounded every square; the streamed one is exact and
    # rounded once, so ci95 may differ in its last bits. Everything else is identical.
    for table in ("metrics", "returns"):
        for name, stat in reference[table].items():
            got = streamed[table][name]
            assert got["ci95"] == pytest.approx(stat["ci95"], rel=1e-12)
            got["ci95"] = stat["ci95"]
    assert streamed == reference
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["episodes"] == reference["episodes"]
    assert on_disk["pass_hat_k"] == reference["pass_hat_k"]
    assert on_disk["metrics"]["score"]["mean"] == reference["metrics"]["score"]["mean"]


class _FailsOnEverySeed(Agent):
    async def act(self, observation: Observation) -> Action:
        raise RuntimeError("always broken")


def test_pass_hat_k_streamed_in_any_order_equals_the_batch_formula() -> None:
    rng = random.Random(11)
    trials = 4
    outcomes = [(task, rng.choice([None, 0.0, 1.0, 1.0])) for task in range(300)
                for _ in range(trials)]  # fmt: skip
    rng.shuffle(outcomes)
    streamed = PassHatK(trials)
    per_task: dict[int, list[float]] = defaultdict(list)
    for task, success in outcomes:
        streamed.add(task, success)
        if success is not None:
            per_task[task].append(success)
    assert streamed.curve() == pass_hat_k_curve(per_task, trials)
    assert streamed.tasks == len(per_task)
    assert not streamed._open  # every task folded once its trials were in: nothing held


def test_moments_do_not_depend_on_order_and_match_fsum() -> None:
    rng = random.Random(5)
    values = [rng.uniform(-1e6, 1e6) for _ in range(2000)] + [1e-300, 0.1, 0.2, 0.3]
    forward = Moments(values).mean_ci()
    rng.shuffle(values)
    assert Moments(values).mean_ci() == forward
    assert forward.mean == math.fsum(values) / len(values)
    assert math.isnan(Moments([1.0, math.nan]).mean_ci().mean)


def test_moments_counting_repeated_values_give_what_folding_each_gives() -> None:
    """Moments counts its first distinct values and folds each count once (the runner's
    rewards and metrics repeat); every other value folds as it comes: the same result."""
    rng = random.Random(7)
    repeated = [rng.choice([0.0, -0.0, 1, True, 0.5, -1.25, 1e300]) for _ in range(500)]
    spread = [rng.uniform(-10, 10) for _ in range(3 * _PENDING)]
    for values in (repeated, repeated + spread, spread + repeated, [*repeated, math.inf]):
        reference = Moments()
        for value in values:  # each folded at once, as before any was counted
            reference.n += 1
            reference._fold(value, 1)
        assert Moments(values).mean_ci() == reference.mean_ci()
        shuffled = list(values)
        rng.shuffle(shuffled)
        assert Moments(shuffled).mean_ci() == reference.mean_ci()
    counted = Moments([0.5] * 10)
    assert counted.mean_ci() == MeanCI(0.5, 0.0, 10)
    counted.add(0.5)  # (after a read: counted again, folded at the next read)
    assert counted.mean_ci() == MeanCI(0.5, 0.0, 11)


def test_only_the_first_failures_in_plan_order_are_listed() -> None:
    builder = SummaryBuilder(trials=1)
    extra = 37
    indexes = list(range(MAX_LISTED_FAILURES + extra))
    random.Random(2).shuffle(indexes)
    for i in indexes:
        record = EpisodeRecord(index=i, episode=f"e{i:05d}", task=i, trial=0, seed=0,
                               transcript={}, failed=f"a: agent_error: #{i}")  # fmt: skip
        builder.add(record)
    summary = builder.summary()
    listed = [f["episode"] for f in summary["failures"]]
    assert listed == [f"e{i:05d}" for i in range(MAX_LISTED_FAILURES)]
    assert summary["failures_not_listed"] == extra
    assert summary["failure_kinds"] == {"agent_error": MAX_LISTED_FAILURES + extra}


# --------------------------------------------------------------------- memory and exit


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_memory_stays_flat_over_thousands_of_episodes_and_the_run_returns_at_once(
    tmp_path: Path,
) -> None:
    scenario = "negotiation/deal-or-no-deal-v0"
    config = RunConfig(scenario=scenario, episodes=6000, concurrency=16, progress=False,
                       out=str(tmp_path))  # fmt: skip
    seats = Runner(config).seats
    marks = {2000: 0, 6000: 0}
    created = 0
    first = seats[0]
    context = SeatContext(scenario=scenario, seat=first, baseline=_baseline(scenario, first))
    baseline = resolve_agent_spec("scripted", context)
    assert callable(baseline)

    def first_seat() -> Agent:  # one agent per episode: RSS read as episode N starts
        nonlocal created
        created += 1
        if created in marks:
            marks[created] = _rss()
        return baseline()

    result = run(config, agents={first: first_seat})
    returned = time.time()
    del result
    assert time.time() - returned < 2
    # The last episode's lines were written just before the summary: the run returned
    # within 2 s of them.
    assert returned - (tmp_path / "timings.jsonl").stat().st_mtime < 2
    slope = (marks[6000] - marks[2000]) / 4000
    assert slope < 2_000, f"RSS grew {slope:.0f} bytes per episode after warm-up"


# --------------------------------------------------------------------- the episode plan


def _plan_peak(episodes: int, read: int) -> int:
    """Bytes allocated at the peak while planning ``episodes`` and reading ``read`` plans."""
    import itertools
    import tracemalloc

    from parley.arena.run.episode import plan_episodes

    config = RunConfig(scenario="negotiation/deal-or-no-deal-v0", episodes=episodes, seed=9)
    tracemalloc.start()
    try:
        plans = plan_episodes(config, ["player_0", "player_1"])
        for _ in itertools.islice(plans, read):
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_plan_is_built_as_it_is_read_in_the_memory_of_a_few_chunks() -> None:
    """A million-episode plan costs what a 10k one does (it was a list: ~460 B an episode,
    2 GB before the arena listened at 4M episodes); reading it is the same at any length."""
    small = _plan_peak(10_000, 10_000)
    large = _plan_peak(1_000_000, 12_000)
    assert large < 1.1 * small, f"10k episodes: {small} B at the peak; 1M: {large} B"


def test_the_lazy_plan_indexes_and_slices_as_a_list_would() -> None:
    from parley.arena.run.episode import derive_seed, plan_episodes

    config = RunConfig(scenario="negotiation/deal-or-no-deal-v0", episodes=5000, trials=3, seed=4)
    plans = plan_episodes(config, ["a", "b"])
    listed = list(plans)
    assert len(plans) == len(listed) == 15_000
    for index in (0, 1, 2, 3, 4095 * 3 + 2, 4096 * 3, 14_999, -1, -15_000):
        assert plans[index] == listed[index]
    assert plans[12_287:12_293] == listed[12_287:12_293]  # across a seed-table boundary
    assert plans[::4999] == listed[::4999]
    assert [p.index for p in plans[14_998:20_000]] == [14_998, 14_999]
    assert [len(piece) for piece in plans.slices(4000)] == [4000, 4000, 4000, 3000]
    last = plans[-1]
    assert (last.task, last.trial, last.seed) == (4999, 2, derive_seed(4, 0, 4999))
    with pytest.raises(IndexError):
        plans[15_000]


@pytest.mark.slow
def test_reading_a_million_episode_plan_keeps_rss_flat() -> None:
    from parley.arena.run.episode import plan_episodes

    config = RunConfig(scenario="negotiation/deal-or-no-deal-v0", episodes=1_000_000)
    marks = {}
    for plan in plan_episodes(config, ["player_0", "player_1"]):
        if plan.index in (100_000, 999_999):
            marks[plan.index] = _rss()
    grown = marks[999_999] - marks[100_000]
    assert grown < 2 * 1024 * 1024, f"RSS grew {grown} B over 900k planned episodes"


def test_a_run_of_millions_of_episodes_listens_before_planning_any() -> None:
    """The arena listens (``on_listen``) having built no plan: tracemalloc's peak then is
    what opening the bus costs, not 460 B x 4M episodes."""
    import tracemalloc

    config = RunConfig(scenario="negotiation/deal-or-no-deal-v0", episodes=4_000_000,
                       progress=False)  # fmt: skip
    peaks: list[int] = []

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None

        def listening(_: str) -> None:
            peaks.append(tracemalloc.get_traced_memory()[1])
            task.cancel()

        with contextlib.suppress(asyncio.CancelledError):
            await Runner(config, on_listen=listening).run()

    tracemalloc.start()
    try:
        asyncio.run(asyncio.wait_for(main(), timeout=60))
    finally:
        tracemalloc.stop()
    assert peaks, "the arena never listened"
    assert peaks[0] < 50 * 1024 * 1024, f"{peaks[0]} B allocated before listening"
