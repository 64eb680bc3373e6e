"""The staleness bound holds for every sample, with slow, long-tailed, multi-turn episodes.

Real runner and scenario (``negotiation/simple-trade-v0``, several turns per episode);
the agents are the scripted traders, each action tagged as a model's would be with the
policy version the "pool" serves at that moment, and slowed by a heavy-tailed delay drawn
per episode. The test plays the trainer: it takes a batch, "trains" a little, bumps the
version and publishes it. Without the drop rule, the slow episodes arrive many versions
late (the issue measured 15-20 with S = 1); with it none is older than S.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from parley.agents.scripted.negotiation import Trader
from parley.arena.run.config import RunConfig
from parley.arena.run.records import EpisodeRecord
from parley.arena.run.runner import Runner
from parley.arena.training.sampler import AsyncSampler, SamplerConfig, SamplerError
from parley.protocols.errors import ConfigError
from parley.protocols.messages import Action, Observation, TokenRecord

SCENARIO = "negotiation/simple-trade-v0"


class Clock:
    """The version the pretend pool serves (the test bumps it after each 'update')."""

    version = 0


class VersionedTrader(Trader):
    """A scripted trader whose actions carry the served version, slowed by a heavy tail."""

    def __init__(self, clock: Clock, policy: str = "learner") -> None:
        super().__init__()
        self.clock, self.policy, self.delay = clock, policy, 0.0

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        # Pareto tail: most episodes take ~1-3 ms per action, a few 100 ms and more.
        self.delay = min(0.001 * (1.0 + float(self.rng.pareto(1.1))), 0.25)

    async def act(self, observation: Observation) -> Action:
        version = self.clock.version  # the weights this action is generated with
        await asyncio.sleep(self.delay)
        tokens = TokenRecord(
            policy=self.policy,
            policy_version=version,
            prompt_token_ids=[1, 2],
            token_ids=[3],
            logprobs=[-0.5],
        )
        return Action(agent=observation.agent, text=self.decide(observation), tokens=[tokens])


def _runner(
    clock: Clock, partner_policy: str = "learner", first: type[VersionedTrader] = VersionedTrader
) -> Runner:
    config = RunConfig(
        scenario=SCENARIO,
        scenario_kwargs={"max_turns": 6},
        agents=["scripted", "scripted"],
        progress=False,
    )
    agents = {
        "player_0": lambda: first(clock),
        "player_1": lambda: VersionedTrader(clock, partner_policy),
    }
    return Runner(config, agents=agents)


async def _train(sampler: AsyncSampler, clock: Clock, updates: int) -> None:
    """Take ``updates`` batches, publishing a new version after each."""
    async for _ in sampler.batches(limit=updates):
        clock.version += 1
        sampler.publish(clock.version)


def _oldest(record: EpisodeRecord) -> int:
    """Recomputed from the record itself, not taken from the sampler."""
    return min(
        tokens.policy_version
        for trajectory in record.trajectories
        for turn in trajectory.turns
        for tokens in turn.tokens
        if tokens.policy == "learner"
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("staleness", [0, 1, 4])
async def test_no_sample_is_older_than_s_with_long_tailed_episodes(staleness: int) -> None:
    clock = Clock()
    runner = _runner(clock)
    config = SamplerConfig(batch_size=4, staleness=staleness, concurrency=32, seed=staleness)
    sampler = AsyncSampler(runner, config, version=0, policies={"learner"})
    ages: list[int] = []
    async with runner.open():
        async for batch in sampler.batches(limit=16):
            assert len(batch.records) == 4
            assert batch.version == clock.version
            mine = [clock.version - _oldest(r) for r in batch.records]
            assert max(mine) <= staleness, f"S={staleness}: ages {mine}"
            assert batch.staleness == mine  # what the loop logs is what the records say
            histogram = batch.staleness_histogram()
            assert sum(histogram) == 4
            assert len(histogram) <= staleness + 1
            ages.extend(mine)
            await asyncio.sleep(0.01)  # the update
            clock.version += 1
            sampler.publish(clock.version)
    assert len(ages) == 64
    if staleness == 0:
        assert ages == [0] * 64  # on-policy by admission alone
        assert sampler.dropped_stale == 0
    else:
        # Sampling really ran ahead of training, and the tail really was cut.
        assert max(ages) >= 1, ages
    if staleness == 1:
        # What admission control alone would have handed out: episodes 2+ versions old.
        assert sampler.dropped_stale > 0, "the long tail should have produced stale episodes"
        assert max(sampler.dropped_ages) >= 2


@pytest.mark.timeout(60)
async def test_a_frozen_partners_old_versions_do_not_count() -> None:
    """The partner's actions carry version 0 forever (a frozen policy): only the learner's
    count, so nothing is dropped for them; counting every policy would drop everything."""
    clock = Clock()
    runner = _runner(clock, partner_policy="frozen")
    original = VersionedTrader.act

    async def frozen_act(self: VersionedTrader, observation: Observation) -> Action:
        action = await original(self, observation)
        if self.policy == "frozen":
            action.tokens[0].policy_version = 0
        return action

    VersionedTrader.act = frozen_act  # type: ignore[method-assign]
    try:
        config = SamplerConfig(batch_size=4, staleness=0, concurrency=8)
        sampler = AsyncSampler(runner, config, policies={"learner"})
        async with runner.open():
            await _train(sampler, clock, 4)
        assert sampler.dropped_stale == 0
        # Every policy counted: the frozen partner makes every episode stale from v1 on.
        clock.version = 0
        config = SamplerConfig(batch_size=4, staleness=0, concurrency=8)
        everything = AsyncSampler(runner, config)
        async with runner.open():
            with pytest.raises(SamplerError, match="older than S"):
                await _train(everything, clock, 4)
    finally:
        VersionedTrader.act = original  # type: ignore[method-assign]


class BrokenTrader(Trader):
    async def act(self, observation: Observation) -> Action:
        raise RuntimeError("backend on fire")


@pytest.mark.timeout(60)
async def test_the_sampler_gives_up_when_every_episode_fails() -> None:
    config = RunConfig(scenario=SCENARIO, agents=["scripted", "scripted"], progress=False)
    runner = Runner(config, agents={"player_0": BrokenTrader})
    sampler = AsyncSampler(runner, SamplerConfig(batch_size=4, max_consecutive_failures=10))
    async with runner.open():
        with pytest.raises(SamplerError, match=r"10 episodes failed in a row.*backend on fire"):
            await _train(sampler, Clock(), 1)
    assert len(sampler.failures) == 10


@pytest.mark.timeout(30)
async def test_versions_from_another_numbering_are_refused() -> None:
    """Actions tagged with versions the sampler was never told about: a wiring bug."""
    clock = Clock()
    clock.version = 1000
    runner = _runner(clock)
    sampler = AsyncSampler(runner, SamplerConfig(batch_size=2), version=0)
    async with runner.open():
        with pytest.raises(SamplerError, match="newer than the published"):
            await _train(sampler, Clock(), 1)


def test_histogram_counts_by_age() -> None:
    from parley.arena.training.sampler import Batch

    batch = Batch(records=[], oldest_versions=[5, 3, 5, 4], version=5)
    assert batch.staleness == [0, 2, 0, 1]
    assert batch.staleness_histogram() == [2, 1, 1]
    assert np.sum(batch.staleness_histogram()) == 4


@pytest.mark.timeout(60)
async def test_only_the_learners_seats_age_an_episode() -> None:
    """A seat that only plays can tag its actions with the learner's policy name (a frozen
    copy served under that name, or a remote agent forging its records): counted by name
    alone, its version-0 records made every episode stale from v1 on and stopped training
    (found by review). Counted by seat, they are ignored."""
    clock = Clock()
    runner = _runner(clock)  # both seats tag their actions "learner"
    original = VersionedTrader.act

    async def forged_act(self: VersionedTrader, observation: Observation) -> Action:
        action = await original(self, observation)
        if observation.agent == "player_1":
            action.tokens[0].policy_version = -7  # any version older than the trainer's
        return action

    VersionedTrader.act = forged_act  # type: ignore[method-assign]
    try:
        config = SamplerConfig(batch_size=4, staleness=0, concurrency=8)
        by_seat = AsyncSampler(runner, config, policies={"learner"}, seats={"player_0"})
        async with runner.open():
            await _train(by_seat, clock, 4)
        assert by_seat.dropped_stale == 0
        clock.version = 0
        by_name = AsyncSampler(runner, config, policies={"learner"})
        async with runner.open():
            with pytest.raises(SamplerError, match="older than S"):
                await _train(by_name, clock, 4)
    finally:
        VersionedTrader.act = original  # type: ignore[method-assign]


class FlakyTrader(VersionedTrader):
    """A VersionedTrader that fails about one episode in eight (its agent seed decides)."""

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.broken = bool(self.rng.random() < 0.125)

    async def act(self, observation: Observation) -> Action:
        if self.broken:
            raise RuntimeError("flaky agent")
        return await super().act(observation)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("staleness", "flaky"), [(0, False), (1, False), (1, True)])
async def test_every_batch_holds_whole_groups(staleness: int, flaky: bool) -> None:
    """Found by review: batches took episodes as they finished, so GRPO groups "by prompt"
    were split (at S = 1, 75 of 320 samples alone in their group: advantage 0), and one
    failed episode misaligned every later batch. Long-tailed episodes, groups of 4."""
    clock = Clock()
    runner = _runner(clock, first=FlakyTrader if flaky else VersionedTrader)
    config = SamplerConfig(  # (concurrency 6: a group's later members start after a failure)
        batch_size=8, group_size=4, staleness=staleness, concurrency=6, seed=3 + staleness
    )
    sampler = AsyncSampler(runner, config, version=0, policies={"learner"})
    tasks: list[int] = []
    async with runner.open():
        async for batch in sampler.batches(limit=12):
            groups: dict[int, list[EpisodeRecord]] = {}
            for record in batch.records:
                groups.setdefault(record.task, []).append(record)
            assert len(batch.records) == 8
            assert sorted(len(g) for g in groups.values()) == [4, 4], groups.keys()
            for members in groups.values():
                assert len({r.seed for r in members}) == 1  # one scenario seed a group
                assert sorted(r.trial for r in members) == [0, 1, 2, 3]
            assert max(clock.version - _oldest(r) for r in batch.records) <= staleness
            tasks.extend(groups)
            await asyncio.sleep(0.01)
            clock.version += 1
            sampler.publish(clock.version)
    assert len(tasks) == len(set(tasks)) == 24  # no group handed out twice
    if flaky:
        assert sampler.failed > 0
        assert sampler.dropped_groups > 0
        failed = {r.task for r in sampler.failures}
        assert failed.isdisjoint(tasks)  # no member of a given-up group was handed out
        # nor kept waiting: later members of a given-up group are never played
        assert failed.isdisjoint(item.plan.task for item in sampler._ready)
    if staleness == 1 and not flaky:
        assert sampler.dropped_stale > 0  # members were played again and groups completed


def test_a_batch_is_whole_groups_or_the_config_says_why() -> None:
    with pytest.raises(ConfigError, match="multiple of group_size"):
        SamplerConfig(batch_size=6, group_size=4)


async def test_a_group_given_up_while_dropping_stale_members_stays_given_up() -> None:
    """Found by review: a whole group left over beyond a batch went stale; its first member
    had used up its replays, so the group was given up (and forgotten: none running), and the
    next member in the same pass was queued to play again, alone, for a group that no longer
    existed."""
    from parley.arena.training.sampler import MAX_REPLAYS, _Ready

    clock = Clock()
    runner = _runner(clock)
    sampler = AsyncSampler(runner, SamplerConfig(batch_size=2, group_size=2, staleness=1))
    first, second = sampler._plan(), sampler._plan()  # one group: task 0, trials 0 and 1
    record = EpisodeRecord(index=0, episode="e", task=0, trial=0, seed=0, transcript={})
    sampler._ready = [
        _Ready(record, 0, 0, first, MAX_REPLAYS - 1),
        _Ready(record, 0, 0, second, 0),
    ]
    sampler.version = 2  # two publishes later: both older than S = 1
    sampler._drop_stale()
    assert sampler.dropped_groups == 1
    assert not sampler._replay  # neither member is played again
