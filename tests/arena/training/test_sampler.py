"""The asynchronous sampler: staleness bound, failed episodes, samples from records."""

from __future__ import annotations

import asyncio

import pytest

from parley.agents.base import Agent
from parley.agents.scripted.collaboration import CodeListener
from parley.arena.run.config import RunConfig
from parley.arena.run.records import EpisodeRecord
from parley.arena.run.runner import Runner
from parley.arena.training.sampler import AsyncSampler, SamplerConfig, samples_from_record
from parley.protocols.messages import Action, Observation, TokenRecord

SCENARIO = "collaboration/referential-v0"


class SlowCodeListener(CodeListener):  # type: ignore[misc]
    """The scripted listener, taking a little time so episodes overlap."""

    async def act(self, observation: Observation) -> Action:
        await asyncio.sleep(0.002)
        action: Action = await super().act(observation)
        return action


class FlakySpeaker(Agent):
    """Raises on every third episode (by seed): those episodes must fail, not score 0."""

    def __init__(self) -> None:
        self.seed = 0

    def reset(self, seed: int | None = None) -> None:
        self.seed = seed or 0

    async def act(self, observation: Observation) -> Action:
        if self.seed % 3 == 0:
            raise RuntimeError("flaky speaker gave up")
        # Pretend a model made it, so the episode yields a trainable sample.
        tokens = TokenRecord(
            policy="p", policy_version=0, prompt_token_ids=[1, 2], token_ids=[3], logprobs=[-0.5]
        )
        return Action(agent=observation.agent, text="aa", tokens=[tokens])


def _runner(speaker: type[Agent] | None = None) -> Runner:
    config = RunConfig(scenario=SCENARIO, agents=["scripted", "scripted"], progress=False)
    agents: dict[str, object] = {"listener": SlowCodeListener}
    if speaker is not None:
        agents["speaker"] = speaker
    return Runner(config, agents=agents)  # type: ignore[arg-type]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("staleness", [0, 1, 2])
async def test_staleness_bound_holds_and_blocks_without_updates(staleness: int) -> None:
    runner = _runner()
    sampler = AsyncSampler(runner, SamplerConfig(batch_size=4, staleness=staleness, concurrency=64))
    got = 0
    async with runner.open():
        stream = sampler.batches()
        # Without publish(), exactly S + 1 batches can be sampled; the next one stalls.
        for _ in range(staleness + 1):
            batch = await stream.__anext__()
            got += len(batch.records)
            assert sampler.accepted + len(sampler._running) <= sampler.budget
        with pytest.raises(RuntimeError, match="stalled"):
            await stream.__anext__()
    assert got == 4 * (staleness + 1)
    assert sampler.peak_outstanding <= (staleness + 1) * 4


@pytest.mark.timeout(60)
async def test_publish_raises_the_budget_and_batches_keep_coming() -> None:
    runner = _runner()
    sampler = AsyncSampler(runner, SamplerConfig(batch_size=4, staleness=0, concurrency=8))
    versions = []
    async with runner.open():
        async for batch in sampler.batches(limit=3):
            versions.append(batch.started_versions)
            # On-policy: every episode of batch k started under version k.
            sampler.publish(sampler.version + 1)
    assert versions == [[0] * 4, [1] * 4, [2] * 4]


@pytest.mark.timeout(60)
async def test_failed_episodes_are_recorded_and_never_trained_on() -> None:
    runner = _runner(FlakySpeaker)
    sampler = AsyncSampler(runner, SamplerConfig(batch_size=6, staleness=3, concurrency=8))
    records = []
    async with runner.open():
        async for batch in sampler.batches(limit=2):
            records.extend(batch.records)
            sampler.publish(sampler.version + 1)
    assert len(records) == 12
    assert all(not r.failed for r in records)
    assert sampler.failures, "every third seed fails: some failures were expected"
    assert all("flaky speaker gave up" in r.failed for r in sampler.failures)
    samples = [s for r in records for s in samples_from_record(r)]
    assert len(samples) == 12  # one model decision (the speaker's) per good episode
    assert {s.key.role for s in samples} == {"speaker"}
    # The exact model input is the sample's context (grouping "context", "context_or_role").
    assert all(s.key.context == tuple(s.prompt_ids) and s.key.context for s in samples)
    with pytest.raises(ValueError, match="never train"):
        samples_from_record(sampler.failures[0])


def _decisions(*prompts: list[int]) -> EpisodeRecord:
    """A finished episode of one seat "a" whose turns were generated from ``prompts``."""
    from parley.arena.run.episode import EpisodeLog, EpisodePlan

    plan = EpisodePlan(index=0, task=0, trial=0, seed=1, agent_seeds={"a": 1})
    episode = EpisodeLog(plan, "x", ["a"], {"a": "llm:p"})
    for turn, prompt in enumerate(prompts):
        token = TokenRecord(
            policy="p", policy_version=0, prompt_token_ids=prompt, token_ids=[2], logprobs=[-1]
        )
        episode.add_step(
            turn,
            {"a": Observation(agent="a", text="o")},
            {"a": Action(agent="a", text="yes", tokens=[token])},
            {"a": "o"},
            {"a": 1.0},
            {"a": False},
            {"a": False},
            {"a": {}},
        )
    return episode.record()


def test_a_decision_whose_constraint_was_forgotten_is_left_out() -> None:
    """Found by review: past capacity the log forgot constraints, and the trainer scored
    those decisions on the full softmax against masked recorded logprobs (ratios ~0.001).
    Now such a decision is left out and counted; prompts are keyed by a digest."""
    from parley.arena.training.sampler import ConstraintLog, samples_from_record
    from parley.protocols.messages import (
        Constraint,
        GenerateRequest,
    )

    choice = Constraint(type="choice", choices=["yes", "no"])
    log = ConstraintLog(capacity=3)
    log.note(GenerateRequest(policy="p", prompt_token_ids=[5, 6, 7], constraint=choice))

    def record() -> EpisodeRecord:
        return _decisions([5, 6, 7], [8, 9])

    samples = samples_from_record(record(), log=log)
    assert [s.constraint for s in samples] == [choice, None]  # [8, 9]: never through the log
    for i in range(3):
        log.note(GenerateRequest(policy="p", prompt_token_ids=[100, i]))
    assert log.evicted == 1
    samples = samples_from_record(record(), log=log)
    assert samples == []  # both unknown now that entries were dropped: neither is scored
    assert log.lost == 2


def test_shaped_rewards_are_credited_turn_by_turn() -> None:
    """Found by review: with shaping, every decision got the shaped *episode* return, so the
    identity shaping paid a bad move made after a success (+0.5 instead of -0.5). Real runs
    of a scenario with reward components (the runner tests' counting game, one noisy seat)."""
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import run
    from parley.arena.training.sampler import samples_from_record
    from parley.scenarios.shaping import load_shaping, shape
    from tests.arena.run.test_runner import SCENARIO, NoisyAgent, TargetAgent

    config = RunConfig(SCENARIO, episodes=12, progress=False)
    agents = {"a": TargetAgent, "b": NoisyAgent}
    result = run(config, agents=agents, keep_records=True)  # type: ignore[arg-type]
    identity, team = load_shaping({"*": {}}), load_shaping({"*": {"alpha": 1.0}})
    for record in result.records:
        plain = samples_from_record(record)
        assert [s.reward for s in samples_from_record(record, shaping=identity)] == [
            s.reward for s in plain
        ]
        # Each seat's first decision gets the whole shaped episode return (nothing is earned
        # before it acts here); later ones only what is left.
        episode = shape({t.agent: t.components for t in record.trajectories}, team["*"])
        shaped = samples_from_record(record, shaping=team)
        firsts = {}
        for s in shaped:
            firsts.setdefault(s.key.role, s.reward)
        assert firsts["a"] == pytest.approx(episode["a"])
        assert len({s.reward for s in shaped if s.key.role == "a"}) > 1  # turn by turn


def test_a_workers_verdicts_reach_the_trainers_log() -> None:
    """Found by review: Ray workers shipped only constrained prompts, so once the trainer's
    log dropped one entry every unconstrained decision counted as forgotten (left out), and
    a prompt a worker's own log had dropped was scored unmasked. Workers now ship what
    their log knows of every decision, forgotten ones included."""
    from parley.arena.training.sampler import FORGOTTEN, ConstraintLog, samples_from_record
    from parley.protocols.messages import (
        Constraint,
        GenerateRequest,
    )

    choice = Constraint(type="choice", choices=["yes", "no"])
    prompts = ([1, 2], [3, 4], [5, 6])  # constrained, unconstrained, never through the log
    record = _decisions(*prompts)
    worker = ConstraintLog(capacity=2)
    worker.note(GenerateRequest(policy="p", prompt_token_ids=prompts[0], constraint=choice))
    worker.note(GenerateRequest(policy="p", prompt_token_ids=prompts[1]))
    assert worker.verdicts(record) == [choice, None, None]
    trainer = ConstraintLog(capacity=3)
    trainer.learn(record, worker.verdicts(record))
    trainer.note(GenerateRequest(policy="p", prompt_token_ids=[9]))  # drops the oldest
    samples = samples_from_record(record, log=trainer)
    assert [s.constraint for s in samples] == [None, None]  # the two it still knows
    assert trainer.lost == 1  # the constrained one it dropped: left out, not scored unmasked
    for i in range(2):  # the worker drops both of its entries
        worker.note(GenerateRequest(policy="p", prompt_token_ids=[100 + i]))
    assert worker.verdicts(record) == [FORGOTTEN] * 3
    fresh = ConstraintLog()
    fresh.learn(record, worker.verdicts(record))
    assert samples_from_record(record, log=fresh) == []
    assert fresh.lost == 3
