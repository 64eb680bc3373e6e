"""A NaN or infinite reward never reaches the weights (found by review: one NaN reward in a
batch of 8 made all 426,624 parameters of the tiny model NaN after one step, and the run went
on pushing and saving them)."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest

from parley.arena.run.config import RunConfig
from parley.arena.run.episode import EpisodeLog, EpisodePlan
from parley.arena.run.runner import run
from parley.arena.training.sampler import samples_from_record
from parley.protocols.messages import Action, Observation, TokenRecord
from parley.scenarios import register
from tests.arena.run.test_runner import CountEnv

HERE = "tests.arena.training.test_nonfinite"
POISONED = "test/poisoned-reward-v0"


class PoisonedCount(CountEnv):
    """CountEnv whose reward is ``poison`` at one turn of about half its episodes."""

    def __init__(self, poison: float = math.nan, component: bool = False) -> None:
        super().__init__(rounds=2)
        self.poison, self.component = poison, component

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        out = super().reset(seed, options)
        self.poisoned = bool(self.rng.random() < 0.5)
        return out

    def step(self, actions: dict[str, str]) -> tuple[Any, Any, Any, Any, Any]:
        obs, rewards, terms, truncs, infos = super().step(actions)
        if self.poisoned and self.turn == 2:
            if self.component:
                for seat in infos:
                    infos[seat]["components"] = {"task": 0.0, "bonus": self.poison}
            else:
                rewards["b"] = self.poison
        return obs, rewards, terms, truncs, infos


register(
    POISONED,
    f"{HERE}:PoisonedCount",
    baselines={"*": "tests.arena.run.test_runner:TargetAgent"},
    description="test scenario: NaN or inf rewards in half its episodes",
    override=True,
)


def _log(rewards: list[float]) -> EpisodeLog:
    plan = EpisodePlan(index=0, task=0, trial=0, seed=1, agent_seeds={"a": 1})
    log = EpisodeLog(plan, "x", ["a"], {"a": "llm:p"})
    token = TokenRecord(
        policy="p", policy_version=0, prompt_token_ids=[1], token_ids=[2], logprobs=[-0.5]
    )
    for turn, reward in enumerate(rewards):
        log.add_step(
            turn,
            {"a": Observation(agent="a", text="o")},
            {"a": Action(agent="a", text="x", tokens=[token])},
            {"a": "o"},
            {"a": reward},
            {"a": False},
            {"a": False},
            {"a": {}},
        )
    return log


@pytest.mark.parametrize(
    "rewards", [[1.0, math.nan], [math.inf, 0.0], [math.inf, -math.inf], [1e308, 1e308]]
)
def test_an_episode_with_a_non_finite_reward_fails_and_gives_no_sample(
    rewards: list[float],
) -> None:
    record = _log(rewards).record()
    assert record.failed.startswith("scenario_error: a's reward is "), record.failed
    assert record.transcript["status"] == "failed"
    assert not record.metrics  # never scored
    with pytest.raises(ValueError, match="never train on it"):
        samples_from_record(record)


def test_a_finite_episode_still_gives_its_samples() -> None:
    record = _log([0.5, -1.0]).record()
    assert record.failed == ""
    assert [s.reward for s in samples_from_record(record)] == [-0.5, -1.0]


@pytest.mark.parametrize(
    ("poison", "component"), [(math.nan, False), (-math.inf, False), (math.inf, True)]
)
def test_a_run_fails_the_poisoned_episodes_and_only_those(
    tmp_path: Path, poison: float, component: bool
) -> None:
    config = RunConfig(
        POISONED,
        episodes=24,
        progress=False,
        scenario_kwargs={"poison": poison, "component": component},
    )
    result = run(config, keep_records=True)
    records = result.records
    failed = [r for r in records if r.failed]
    assert 0 < len(failed) < len(records)
    assert all("scenario_error" in r.failed for r in failed)
    assert all(any(f"is {v}" in r.failed for v in ("nan", "inf", "-inf")) for r in failed)
    assert result.summary["episodes"]["failed"] == len(failed)
    samples = [s for r in records if not r.failed for s in samples_from_record(r)]
    assert samples
    assert all(math.isfinite(s.reward) for s in samples)


torch = pytest.importorskip("torch")

from tests.arena.training.test_pg_epochs import _samples  # noqa: E402  (16 on-policy decisions)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    from parley.arena.inference.backends.tokenizer import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype="float32")
    return model, load_tokenizer(str(tiny_model_dir)).hf


@pytest.mark.timeout(120)
def test_the_trainer_refuses_a_non_finite_reward(tiny: tuple[Any, Any]) -> None:
    from parley.arena.training.pg import PGConfig, PolicyGradientTrainer

    model, hf = copy.deepcopy(tiny[0]), tiny[1]
    samples = _samples(model, hf)
    samples[3].reward = math.nan
    trainer = PolicyGradientTrainer({"p": model}, hf, PGConfig(lr=1e-2))
    with pytest.raises(ValueError, match="reward nan"):
        trainer.step(samples)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


@pytest.mark.timeout(120)
def test_a_non_finite_gradient_skips_the_step_and_keeps_the_weights(
    tiny: tuple[Any, Any],
) -> None:
    """Recorded logprobs of NaN (a broken backend) make the loss NaN: the step is skipped
    and counted, the weights stay as they were; the next sound batch trains."""
    from parley.arena.training.pg import PGConfig, PolicyGradientTrainer

    model, hf = copy.deepcopy(tiny[0]), tiny[1]
    samples = _samples(model, hf)
    sound = copy.deepcopy(samples)
    samples[2].logprobs = [math.nan] * len(samples[2].token_ids)
    trainer = PolicyGradientTrainer({"p": model}, hf, PGConfig(lr=1e-2))
    before = [p.detach().clone() for p in model.parameters()]
    metrics = trainer.step(samples)
    assert metrics["nonfinite_steps"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    metrics = trainer.step(sound)
    assert metrics["nonfinite_steps"] == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
