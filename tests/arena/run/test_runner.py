"""The arena runner in one process: whole episodes over inproc, failures, reproducibility,
pass^k, YAML config and the ``parley run`` command line.

A tiny registered scenario (``test/count-v0``) keeps the checks exact: seats take turns
saying a target number they are shown; a correct number earns 1, anything that is not a
number is an invalid move; ``success`` is 1 when every answer was right.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from gymnasium.spaces import Text
from pettingzoo import ParallelEnv

from parley.agents.base import Agent
from parley.arena.run.agent_specs import AgentFactory, SeatContext, resolve_agent_spec
from parley.arena.run.config import RunConfig, load_run_config
from parley.arena.run.records import EpisodeRecord
from parley.arena.run.runner import EpisodePlan, Runner, derive_seed, plan_episodes, run
from parley.arena.run.stats import mean_ci, pass_hat_k
from parley.arena.run.summary import summarize
from parley.protocols.errors import BusError, ConfigError
from parley.protocols.messages import Action, Observation, TokenRecord
from parley.scenarios import register

SCENARIO = "test/count-v0"
HERE = "tests.arena.run.test_runner"
_CHARSET = "".join(chr(c) for c in range(32, 127))


class CountEnv(ParallelEnv[str, str, str]):
    """Seats take turns; the acting seat must say the target number it is shown."""

    metadata: ClassVar[dict[str, Any]] = {
        "name": SCENARIO,
        "render_modes": ["ansi"],
        "is_parallelizable": True,
    }

    def __init__(self, rounds: int = 3, weird_info_at: int = -1) -> None:
        self.rounds = rounds
        self.weird_info_at = weird_info_at  # turn whose infos hold a non-msgpack value
        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []
        self._space = Text(100, min_length=0, charset=_CHARSET)
        self.rng = np.random.default_rng()

    def observation_space(self, agent: str) -> Text:
        return self._space

    def action_space(self, agent: str) -> Text:
        return self._space

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.turn = 0
        self.correct = 0
        self.targets = [int(t) for t in self.rng.integers(0, 100, size=2 * self.rounds)]
        return self._observe()

    def _acting(self) -> str:
        return self.possible_agents[self.turn % 2]

    def _observe(self) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        obs, infos = {}, {}
        for seat in self.agents:
            acting = seat == self._acting()
            target = self.targets[self.turn] if self.turn < len(self.targets) else -1
            obs[seat] = f"say {target}" if acting else "wait"
            infos[seat] = {"to_act": acting, "target": target if acting else None}
        return obs, infos

    def step(self, actions: dict[str, str]) -> tuple[Any, Any, Any, Any, Any]:
        seat = self._acting()
        text = actions.get(seat, "")
        rewards = dict.fromkeys(self.agents, 0.0)
        invalid = ""
        if not text.strip().isdigit():
            invalid = f"{text!r} is not a number"
        elif int(text) == self.targets[self.turn]:
            rewards[seat] = 1.0
            self.correct += 1
        self.turn += 1
        done = self.turn >= len(self.targets)
        obs, infos = self._observe()
        for s in self.agents:
            infos[s]["components"] = {"task": rewards[s]}
        if invalid:
            infos[seat]["invalid"] = invalid
        if self.turn == self.weird_info_at:
            for s in self.agents:
                infos[s]["weird"] = object()
        terms = dict.fromkeys(self.agents, done)
        truncs = dict.fromkeys(self.agents, False)
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos

    def episode_metrics(self) -> dict[str, float]:
        return {
            "score": self.correct / len(self.targets),
            "success": float(self.correct == len(self.targets)),
        }


class TargetAgent(Agent):
    """Says the target: always right."""

    async def act(self, observation: Observation) -> Action:
        target = observation.info["target"]
        token = TokenRecord(
            policy="p", policy_version=1, prompt_token_ids=[1], token_ids=[2], logprobs=[-0.5]
        )
        return Action(agent=observation.agent, text=str(target), tokens=[token])


class NoisyAgent(Agent):
    """Right with probability 0.8, else an invalid move; its randomness comes from reset."""

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)

    async def act(self, observation: Observation) -> Action:
        ok = self.rng.random() < 0.8
        text = str(observation.info["target"]) if ok else "no idea"
        return Action(agent=observation.agent, text=text)


register(
    SCENARIO,
    f"{HERE}:CountEnv",
    baselines={"*": f"{HERE}:TargetAgent"},
    description="test scenario of the runner tests",
    override=True,
)


def _config(tmp_path: Path | None = None, **kw: Any) -> RunConfig:
    base: dict[str, Any] = {"scenario": SCENARIO, "episodes": 4, "progress": False}
    if tmp_path is not None:
        base["out"] = str(tmp_path)
    base.update(kw)
    return RunConfig(**base)


# --------------------------------------------------------------------- whole episodes


@pytest.mark.timeout(30)
def test_scripted_run_plays_every_episode_and_writes_the_files(tmp_path: Path) -> None:
    result = run(_config(tmp_path, episodes=5, concurrency=3), keep_records=True)
    assert [r.failed for r in result.records] == [""] * 5
    assert result.summary["metrics"]["success"]["mean"] == 1.0
    assert result.summary["episodes"] == {"total": 5, "ok": 5, "failed": 0}
    lines = (tmp_path / "transcripts.jsonl").read_text().splitlines()
    transcripts = [json.loads(line) for line in lines]
    assert [t["index"] for t in transcripts] == [0, 1, 2, 3, 4]
    first = transcripts[0]
    assert first["status"] == "ok"
    assert len(first["steps"]) == 6
    # to_act: only the acting seat is asked, and only its action is recorded.
    assert [list(step["actions"]) for step in first["steps"]] == [["a"], ["b"]] * 3
    assert lines[0] == json.dumps(first, sort_keys=True, separators=(",", ":"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["episodes"]["ok"] == 5
    assert summary["invalid_move_rate"] == 0.0


@pytest.mark.timeout(30)
def test_trajectories_are_trajectory_structs_with_token_records(tmp_path: Path) -> None:
    run(_config(tmp_path, episodes=2))
    rows = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert [(r["episode"], r["agent"]) for r in rows] == [
        ("t00000-r00", "a"), ("t00000-r00", "b"), ("t00001-r00", "a"), ("t00001-r00", "b"),
    ]  # fmt: skip
    a = rows[0]
    assert a["kind"] == "trajectory"
    assert [t["turn"] for t in a["turns"]] == [0, 2, 4]
    assert a["reward"] == 3.0
    assert a["components"] == {"task": 3.0}
    assert a["turns"][0]["tokens"][0]["token_ids"] == [2]
    assert a["seed"] == derive_seed(0, 0, 0)


@pytest.mark.timeout(30)
def test_invalid_moves_are_counted_not_failures(tmp_path: Path) -> None:
    result = run(
        _config(tmp_path, episodes=6, agents=[f"{HERE}:NoisyAgent", "scripted"]), keep_records=True
    )
    summary = result.summary
    assert summary["episodes"]["failed"] == 0
    invalid = sum(r.invalid_moves for r in result.records)
    assert invalid > 0
    assert summary["invalid_move_rate"] == invalid / summary["agent_steps"]
    assert summary["agent_steps"] == 6 * 6


# --------------------------------------------------------------------- reproducibility


@pytest.mark.timeout(60)
def test_same_seed_gives_byte_identical_transcripts(tmp_path: Path) -> None:
    agents = [f"{HERE}:NoisyAgent", f"{HERE}:NoisyAgent"]
    run(_config(tmp_path / "one", episodes=8, concurrency=4, seed=7, agents=agents))
    run(_config(tmp_path / "two", episodes=8, concurrency=2, seed=7, agents=agents))
    run(_config(tmp_path / "other", episodes=8, concurrency=4, seed=8, agents=agents))
    for name in ("transcripts.jsonl", "trajectories.jsonl"):
        one = (tmp_path / "one" / name).read_bytes()
        assert one == (tmp_path / "two" / name).read_bytes()
        assert one != (tmp_path / "other" / name).read_bytes()


def test_episode_and_agent_seeds_are_distinct_and_stable() -> None:
    plans = plan_episodes(_config(episodes=3, trials=2, seed=5), ["a", "b"])
    assert [(p.task, p.trial) for p in plans] == [(t, r) for t in range(3) for r in range(2)]
    assert plans[0].seed == plans[1].seed  # trials of one task replay the same scenario
    assert plans[0].agent_seeds != plans[1].agent_seeds  # with fresh agent randomness
    seeds = {p.seed for p in plans} | {s for p in plans for s in p.agent_seeds.values()}
    assert len(seeds) == 3 + 3 * 2 * 2
    assert derive_seed(5, 0, 0) == plans[0].seed


# --------------------------------------------------------------------- failures


class _Hang(Agent):
    async def act(self, observation: Observation) -> Action:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


class _Raise(Agent):
    async def act(self, observation: Observation) -> Action:
        raise RuntimeError("model server went away")


def _nth_instance(n: int, bad: type[Agent]) -> AgentFactory:
    """A factory whose ``n``-th agent (0-based) is a ``bad`` one, the others play well."""
    count = 0

    def make() -> Agent:
        nonlocal count
        count += 1
        return bad() if count - 1 == n else TargetAgent()

    return make


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("bad", "kind"), [(_Hang, "timeout"), (_Raise, "agent_error")])
def test_an_agent_that_hangs_or_raises_fails_its_episode_and_the_run_goes_on(
    tmp_path: Path, bad: type[Agent], kind: str
) -> None:
    config = _config(tmp_path, episodes=4, concurrency=1, act_timeout=0.5)
    result = run(config, agents={"b": _nth_instance(1, bad)}, keep_records=True)
    assert [r.failed == "" for r in result.records] == [True, False, True, True]
    reason = result.records[1].failed
    assert reason.startswith(f"b: {kind}: ")
    if bad is _Raise:
        assert "model server went away" in reason
    summary = result.summary
    assert summary["episodes"] == {"total": 4, "ok": 3, "failed": 1}
    assert summary["metrics"]["success"]["n"] == 3  # the failed episode is not scored
    assert summary["failure_kinds"] == {kind: 1}
    line = (tmp_path / "transcripts.jsonl").read_text().splitlines()[1]
    failed = json.loads(line)
    assert failed["status"] == "failed"
    assert failed["metrics"] == {}
    assert failed["failed"] == reason
    trajectories = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert json.loads(trajectories[2])["failed"] == reason


@pytest.mark.timeout(30)
def test_infos_the_bus_cannot_carry_fail_the_episode_not_the_run(tmp_path: Path) -> None:
    result = run(
        _config(tmp_path, episodes=2, scenario_kwargs={"weird_info_at": 2}), keep_records=True
    )
    assert [r.failed.split(": ")[:2] for r in result.records] == [["a", "protocol_error"]] * 2
    steps = json.loads((tmp_path / "transcripts.jsonl").read_text().splitlines()[0])["steps"]
    assert steps[1]["infos"]["a"]["weird"] == "<unserializable object>"


@pytest.mark.timeout(30)
def test_pipelined_and_sequential_requests_play_the_same_episodes(tmp_path: Path) -> None:
    agents = [f"{HERE}:NoisyAgent", f"{HERE}:NoisyAgent"]
    run(_config(tmp_path / "p", agents=agents, pipeline=True))
    run(_config(tmp_path / "s", agents=agents, pipeline=False))
    p = (tmp_path / "p" / "transcripts.jsonl").read_bytes()
    assert p == (tmp_path / "s" / "transcripts.jsonl").read_bytes()


@pytest.mark.timeout(30)
async def test_episodes_can_be_driven_one_by_one_inside_open() -> None:
    runner = Runner(_config(agents=[f"{HERE}:NoisyAgent", "scripted"]))
    plans = [EpisodePlan(i, task=i, trial=0, seed=100 + i, agent_seeds={"a": i, "b": 0})
             for i in range(3)]  # fmt: skip
    async with runner.open() as address:
        assert address.startswith("inproc://")
        records = await asyncio.gather(*(runner.play(plan) for plan in plans))
        again = await runner.play(plans[1])
    assert [r.seed for r in records] == [100, 101, 102]
    assert all(not r.failed for r in records)
    assert again.transcript == records[1].transcript
    with pytest.raises(BusError, match=r"Runner\.open"):
        await runner.play(plans[0])


# --------------------------------------------------------------------- pass^k


def test_pass_hat_k_on_a_constructed_case() -> None:
    # Task 0: 3/3 successes; task 1: 2/3; task 2: 0/3.
    assert pass_hat_k([3, 2, 0], [3, 3, 3], 1) == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert pass_hat_k([3, 2, 0], [3, 3, 3], 2) == pytest.approx((1 + 1 / 3 + 0) / 3)
    assert pass_hat_k([3, 2, 0], [3, 3, 3], 3) == pytest.approx(1 / 3)
    # A task with too few valid trials (infrastructure failures) is left out, not zeroed.
    assert pass_hat_k([2, 3], [2, 3], 3) == 1.0
    assert math.isnan(pass_hat_k([1], [1], 2))


def _record(index: int, task: int, trial: int, success: float, failed: str = "") -> EpisodeRecord:
    metrics = {} if failed else {"success": success}
    return EpisodeRecord(
        index=index, episode=f"e{index}", task=task, trial=trial, seed=task,
        transcript={}, metrics=metrics, failed=failed,
    )  # fmt: skip


def test_summary_reports_pass_hat_k_per_task_from_success() -> None:
    outcomes = {0: [1, 1, 1], 1: [1, 0, 1], 2: [0, 0, 0]}
    records = [
        _record(3 * task + trial, task, trial, s)
        for task, values in outcomes.items()
        for trial, s in enumerate(values)
    ]
    records.append(_record(9, 3, 0, 0.0, failed="b: timeout: slow"))
    summary = summarize(records, trials=3)
    assert summary["pass_hat_k"]["1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert summary["pass_hat_k"]["2"] == pytest.approx((1 + 1 / 3 + 0) / 3)
    assert summary["pass_hat_k"]["3"] == pytest.approx(1 / 3)
    assert summary["pass_hat_k_tasks"] == 3
    assert summary["episodes"]["failed"] == 1


@pytest.mark.timeout(60)
def test_trials_run_reports_pass_hat_k_matching_its_transcripts(tmp_path: Path) -> None:
    agents = [f"{HERE}:NoisyAgent", "scripted"]
    result = run(_config(tmp_path, episodes=5, trials=3, agents=agents))
    rows = [json.loads(x) for x in (tmp_path / "transcripts.jsonl").read_text().splitlines()]
    assert len(rows) == 15
    per_task: dict[int, list[float]] = {}
    for row in rows:
        per_task.setdefault(row["task"], []).append(row["metrics"]["success"])
    assert {len(v) for v in per_task.values()} == {3}
    c = [int(sum(v)) for v in per_task.values()]
    expected = {str(k): pass_hat_k(c, [3] * 5, k) for k in (1, 2, 3)}
    assert result.summary["pass_hat_k"] == pytest.approx(expected)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["pass_hat_k"] == pytest.approx(expected)


def test_mean_ci_uses_student_t() -> None:
    stat = mean_ci([1.0, 2.0, 3.0])
    assert stat.mean == 2.0
    assert stat.ci95 == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert math.isnan(mean_ci([1.0]).ci95)


# --------------------------------------------------------------------- config and specs


def test_yaml_config_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        f"scenario: {SCENARIO}\nscenario_kwargs: {{rounds: 2}}\n"
        "agents: {b: scripted}\nepisodes: 7\nseed: 3\n"
    )
    config = load_run_config(path, {"episodes": 2, "concurrency": None})
    assert config.episodes == 2
    assert config.seed == 3
    assert config.concurrency == 8
    assert config.scenario_kwargs == {"rounds": 2}
    assert config.agents == {"b": "scripted"}
    path.write_text(f"scenario: {SCENARIO}\nepisodez: 3\n")
    with pytest.raises(ConfigError, match="episodez"):
        load_run_config(path)
    path.write_text(f"scenario: {SCENARIO}\nepisodes: many\n")
    with pytest.raises(ConfigError, match="episodes"):
        load_run_config(path)
    with pytest.raises(ConfigError, match="concurrency"):
        load_run_config(None, {"scenario": SCENARIO, "concurrency": 0})


def test_agent_specs_resolve_or_say_what_to_do() -> None:
    seat = SeatContext(scenario=SCENARIO, seat="a", baseline=f"{HERE}:TargetAgent")
    factory = resolve_agent_spec("scripted", seat)
    assert isinstance(factory(), TargetAgent)
    assert resolve_agent_spec("remote", seat).peer == "agent-a"
    assert resolve_agent_spec("remote:bot7", seat).peer == "bot7"
    with pytest.raises(ConfigError, match="not a subclass"):
        resolve_agent_spec("json:dumps", seat)
    with pytest.raises(ConfigError, match="unknown agent spec"):
        resolve_agent_spec("gpt", seat)
    with pytest.raises(ConfigError, match="no scripted baseline"):
        resolve_agent_spec("scripted", SeatContext(scenario=SCENARIO, seat="a"))


def test_wrong_number_of_agent_specs_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="2 seats"):
        Runner(_config(agents=["scripted"]))
    with pytest.raises(ConfigError, match="no seats"):
        Runner(_config(agents={"c": "scripted"}))


# --------------------------------------------------------------------- CLI


def test_agents_option_parsing() -> None:
    from parley.arena.cli.run import parse_agents

    assert parse_agents("scripted, remote") == ["scripted", "remote"]
    assert parse_agents("b=remote,a=m.x:Y") == {"b": "remote", "a": "m.x:Y"}
    assert parse_agents("llm:models/t?temperature=0.5,scripted") == [
        "llm:models/t?temperature=0.5",
        "scripted",
    ]
    assert parse_agents("a=llm:m?top_p=0.9") == {"a": "llm:m?top_p=0.9"}
    with pytest.raises(ConfigError, match="every seat"):
        parse_agents("a=scripted,remote")


@pytest.mark.timeout(60)
def test_cli_run_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from parley.arena.cli import main

    out = tmp_path / "cli"
    status = main(["run", SCENARIO, "--episodes", "3", "--trials", "2", "--seed", "1",
                   "--out", str(out), "--no-progress", "-s", "rounds=2", "--json"])  # fmt: skip
    assert status == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"]["ok"] == 6
    assert set(summary["pass_hat_k"]) == {"1", "2"}
    assert summary["config"]["scenario_kwargs"] == {"rounds": 2}
    assert len((out / "transcripts.jsonl").read_text().splitlines()) == 6

    config = tmp_path / "run.yaml"
    config.write_text(f"scenario: {SCENARIO}\nepisodes: 2\nagents: [scripted, scripted]\n")
    status = main(["run", "--config", str(config), "--no-progress", "--episodes", "1"])
    assert status == 0
    table = capsys.readouterr().out
    assert "success" in table
    assert "episodes ok" in table
    assert "pass^1" in table

    assert main(["run", SCENARIO, "--agents", "nobody", "--no-progress"]) == 2


# --------------------------------------------------------------------- the docs' example


@pytest.mark.timeout(60)
def test_the_custom_agent_example_plays_deal_or_no_deal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3] / "examples"))
    config = RunConfig(
        scenario="negotiation/deal-or-no-deal-v0",
        agents=["custom_agent:Accommodating", "scripted"],
        episodes=6,
        progress=False,
    )
    summary = run(config).summary
    assert summary["episodes"]["ok"] == 6
    assert summary["invalid_moves"] == 0
    assert summary["metrics"]["agreed"]["mean"] == 1.0
