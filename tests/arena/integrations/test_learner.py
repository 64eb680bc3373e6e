"""The learner seat (arena/integrations/learner.py): the trainer sees exactly what the arena's
agent in its seat sees and nothing else, failures arrive as reasons (never a silent 0), and a
trainer's mistakes are typed errors that leave other sessions alone."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from parley.agents.base import Agent
from parley.arena.integrations.learner import LearnerArena, LearnerError, LearnerTurn
from parley.arena.run.config import RunConfig
from parley.arena.run.episode import EpisodePlan, derive_seed
from parley.arena.run.runner import Runner
from parley.protocols.messages import Action, Observation
from parley.scenarios import spec as scenario_spec

pytestmark = pytest.mark.timeout(60)

DOND = "negotiation/deal-or-no-deal-v3"
REFERENTIAL = "collaboration/referential-v1"


def _baseline(scenario: str, seat: str) -> Agent:
    from parley.arena.run.agent_specs import load_object

    return load_object(scenario_spec(scenario).baselines[seat])()  # type: ignore[no-any-return]


async def _play_as(
    arena: LearnerArena, seed: int, agent_seed: int, seat: str
) -> tuple[list[LearnerTurn], list[str]]:
    """One episode of ``arena`` whose learner seat is played by the seat's scripted baseline
    (reset with ``agent_seed``); the turns the trainer got and the actions it sent."""
    agent = _baseline(arena.scenario, seat)
    agent.reset(agent_seed)
    session = arena.session()
    turns, actions = [await session.reset(seed)], []
    while not turns[-1].done:
        turn = turns[-1]
        obs = Observation(
            agent=seat, text=turn.text, scenario=arena.scenario, reward=0.0, info=turn.info
        )
        actions.append((await agent.act(obs)).text)
        turns.append(await session.step(actions[-1]))
    await session.close()
    return turns, actions


async def test_the_learner_sees_what_the_arena_agent_sees_and_nothing_else() -> None:
    """Deal-or-no-deal (private values per seat): the learner seat played through the
    adapter by the scripted baseline gives the very episode the arena plays with that
    baseline in the seat: same observations, actions, returns, components and metrics; the
    trainer never receives the other seat's observations or parley's internal info keys."""
    async with LearnerArena(DOND, learners=["player_0"]) as arena:
        played = [await _play_as(arena, seed, 1000 + seed, "player_0") for seed in range(4)]
    config = RunConfig(scenario=DOND, progress=False)
    runner = Runner(config)
    async with runner.open():
        for seed, (turns, actions) in enumerate(played):
            seeds = {"player_0": 1000 + seed, "player_1": derive_seed(seed, 1, 1)}
            record = await runner.play(EpisodePlan(0, 0, 0, seed, seeds))
            assert not record.failed
            steps = record.transcript["steps"]
            mine = [s["observations"]["player_0"] for s in steps if "player_0" in s["actions"]]
            theirs = [s["observations"]["player_1"] for s in steps if "player_1" in s["actions"]]
            assert [t.text for t in turns[:-1]] == mine
            assert actions == [
                s["actions"]["player_0"] for s in steps if "player_0" in s["actions"]
            ]
            end = turns[-1]
            trajectory = record.trajectories[0]
            assert end.returns == {"player_0": trajectory.reward}
            assert end.components == {"player_0": trajectory.components}
            assert end.metrics == record.metrics
            assert sum(t.reward or 0.0 for t in turns) == pytest.approx(trajectory.reward)
            # The chat is the arena LLM agent's: system, then observation/action pairs.
            last = turns[-2].messages
            assert last[0]["role"] == "system"
            assert [m["content"] for m in last[1::2]] == mine
            assert [m["content"] for m in last[2::2]] == actions[:-1]
            sent = json.dumps([asdict(t) for t in turns])
            assert all(text not in sent for text in theirs if text not in mine)
            assert '"agent_seed"' not in sent
            assert '"oracle"' not in sent


class _Boom(Agent):
    """Fails on its first action (an infrastructure failure of the partner's agent)."""

    async def act(self, observation: Observation) -> Action:
        raise RuntimeError("partner crashed")


async def test_a_failed_episode_reaches_the_trainer_as_a_reason_not_a_zero() -> None:
    async with LearnerArena(
        REFERENTIAL, learners=["listener"], agents=[f"{__name__}:_Boom"]
    ) as arena:
        turn = await arena.session().reset(seed=1)
    assert turn.done
    assert turn.reward is None
    assert "partner crashed" in turn.failed
    assert turn.returns == {}
    assert turn.metrics == {}


async def test_a_trainer_that_stops_answering_fails_its_episode_only() -> None:
    """turn_timeout bounds the trainer too: an abandoned episode fails (with the reason)
    and frees its seats; a late step gets the failed end, not a hang or a KeyError."""
    async with LearnerArena(REFERENTIAL, learners=["listener"], turn_timeout=0.5) as arena:
        idle, busy = arena.session(), arena.session()
        await idle.reset(seed=1)
        turn = await busy.reset(seed=2)
        await asyncio.sleep(1.0)
        late = await idle.step("1")
        assert late.done
        assert late.reward is None
        assert "timeout" in late.failed
        assert (await idle.reset(seed=1)).seat == "listener"  # the session is still usable
        # busy's episode timed out too (it waited as long); a fresh one plays to the end.
        turn = await busy.reset(seed=2)
        turn = await busy.step("1")
        assert turn.done
        assert not turn.failed


async def test_trainer_mistakes_are_typed_errors_and_leave_other_sessions_alone() -> None:
    async with LearnerArena(REFERENTIAL, learners=["speaker", "listener"], max_sessions=2) as arena:
        bad, good = arena.session(), arena.session()
        with pytest.raises(LearnerError) as error:
            arena.session()
        assert error.value.code == "capacity"
        with pytest.raises(LearnerError) as error:
            await bad.step("ab")
        assert error.value.code == "no_episode"
        first = await good.reset(seed=5)
        assert first.seat == "speaker"
        turn = await bad.reset(seed=5)
        for seat, code in (("nobody", "unknown_seat"), ("listener", "not_your_turn")):
            with pytest.raises(LearnerError) as error:
                await bad.step("ab", seat=seat)
            assert error.value.code == code
        with pytest.raises(LearnerError) as error:
            await bad.step(7)  # type: ignore[arg-type]
        assert error.value.code == "bad_action"
        racing = asyncio.ensure_future(bad.step("ab", seat="speaker"))
        await asyncio.sleep(0)
        with pytest.raises(LearnerError) as error:
            await bad.step("ab")
        assert error.value.code == "busy"
        turn = await racing
        assert turn.seat == "listener"
        turn = await bad.step("1", seat="listener")
        assert turn.done
        assert not turn.failed
        with pytest.raises(LearnerError) as error:
            await bad.step("1")
        assert error.value.code == "episode_over"
        # The other session saw none of it: its episode is the one a fresh session plays.
        good_turns = [first, await good.step("ab"), await good.step("1")]
        await bad.close()
        fresh = arena.session()
        fresh_turns = [await fresh.reset(seed=5), await fresh.step("ab"), await fresh.step("1")]
        assert [t.text for t in good_turns] == [t.text for t in fresh_turns]
        assert good_turns[-1].returns == fresh_turns[-1].returns
        assert good_turns[-1].metrics == fresh_turns[-1].metrics


def test_bad_configurations_are_refused_with_the_fix() -> None:
    from parley.protocols.errors import ConfigError

    with pytest.raises(ConfigError, match="seats are"):
        LearnerArena(REFERENTIAL, learners=["judge"])
    with pytest.raises(ConfigError, match="one per seat parley plays"):
        LearnerArena(REFERENTIAL, learners=["listener"], agents=["scripted", "scripted"])


async def test_an_openenv_session_closed_from_its_executor_frees_its_episode() -> None:
    """OpenEnv closes a disconnected session's environment in an executor thread: the
    episode in progress is cancelled and the session's slot is free again."""
    pytest.importorskip("openenv")
    from parley.arena.integrations.openenv import ParleyEnvironment

    async with LearnerArena(REFERENTIAL, learners=["listener"], max_sessions=1) as arena:
        env = ParleyEnvironment(arena)
        observation = await env.reset_async(seed=3)
        assert observation.seat == "listener"
        assert arena.sessions == 1
        await asyncio.to_thread(env.close)
        for _ in range(100):
            if arena.sessions == 0:
                break
            await asyncio.sleep(0.01)
        assert arena.sessions == 0
        assert arena._episodes == {}  # the runner's episode is gone too
        again = ParleyEnvironment(arena)
        assert (await again.reset_async(seed=3)).text == observation.text


async def test_an_llm_partner_plays_through_the_pool(tiny_model_dir: Path) -> None:
    """The partner seat is any parley agent spec: here the tiny model through an in-process
    pool (``llm:PATH``, resolved as ``parley run`` resolves it). Its message reaches the
    learner's observation and the episode ends with the learner's return."""
    from parley.arena.inference.llm_spec import close_shared_pools

    spec = f"llm:{tiny_model_dir}?max_tokens=4&temperature=0"
    try:
        async with LearnerArena(REFERENTIAL, learners=["listener"], agents=[spec]) as arena:
            session = arena.session()
            turns = [await session.reset(seed=seed) for seed in (1, 1)]
            assert turns[0].text == turns[1].text  # greedy partner, same seed: same episode
            assert turns[0].text.startswith("Message: ")
            end = await session.step("1")
    finally:
        await close_shared_pools()
    assert end.done
    assert end.failed == ""
    assert set(end.returns) == {"listener"}
