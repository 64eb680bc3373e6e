"""A stalled stage starts over (``StageConfig.restart``): the weights as they were when the
named stage began, a fresh optimizer, new episodes; bounded; recorded in every output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from parley.arena.training.config import RunSeeds
from parley.arena.training.loop import load_train_config, train
from parley.arena.training.pg import PGConfig, PolicyGradientTrainer
from parley.protocols.errors import ConfigError
from tests.arena.training.referential import REFERENTIAL_K2


def _config(tmp_path: Path, stages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "scenario": "collaboration/referential-v0",
        "scenario_kwargs": REFERENTIAL_K2,
        "model": "tiny",
        "policies": ["speaker", "listener"],
        "agent": {"max_tokens": 4, "system_prompt": False},
        "sampler": {"batch_size": 8, "staleness": 0, "concurrency": 8},
        "pg": {"estimator": "grpo", "grouping": "role", "lr": 1e-3},
        "threads": 1,
        "progress": False,
        "stages": stages,
        "out": str(tmp_path / "run"),
        **extra,
    }


LISTENER = {"speaker": "scripted", "listener": "policy:listener"}
JOINT = {"speaker": "policy:speaker", "listener": "policy:listener"}


def test_restore_puts_back_the_weights_and_forgets_the_optimizer(
    tiny_model_dir: Path,
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch = pytest.importorskip("torch")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer = PolicyGradientTrainer({"p": model}, tokenizer, PGConfig(lr=1e-2))
    saved = {"p": trainer.weights["p"].snapshot()}
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    # Move the weights the way an update does: through the policy's own optimizer.
    optim = trainer._optims["p"]
    loss = torch.stack([(p.float() ** 2).sum() for p in model.parameters()]).sum()
    loss.backward()
    optim.step()
    optim.zero_grad()
    assert optim.state, "Adam keeps moments after a step"
    moved = [k for k, v in model.named_parameters() if not torch.equal(v, before[k])]
    assert moved, "the step changed no weight: the test would prove nothing"
    trainer.restore(saved)
    for k, v in model.named_parameters():
        assert torch.equal(v, before[k]), f"{k} not restored"
    assert trainer._optims["p"] is not optim
    assert not trainer._optims["p"].state
    # A snapshot of another shape is refused, never half-applied.
    with pytest.raises(ValueError, match="snapshot of 1 tensors"):
        trainer.weights["p"].restore(saved["p"][:1])


def test_reinitialise_draws_the_tiny_model_of_that_seed(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from parley.arena.training.adapters import FullWeights

    torch = pytest.importorskip("torch")
    built = AutoModelForCausalLM.from_pretrained(tiny_model_dir)  # the tiny model of seed 0
    original = {k: v.detach().clone() for k, v in built.named_parameters()}
    weights = FullWeights(built)
    weights.reinitialise(1)
    changed = [k for k, v in built.named_parameters() if not torch.equal(v, original[k])]
    assert len(changed) > len(original) // 2, "seed 1 drew (mostly) the same weights"
    weights.reinitialise(0)
    for k, v in built.named_parameters():
        assert torch.equal(v, original[k]), f"{k}: seed 0 is not the tiny model of seed 0"


def test_a_reinitialised_policy_gets_a_new_kl_reference_at_its_fresh_weights(
    tiny_model_dir: Path,
) -> None:
    from transformers import AutoModelForCausalLM

    from parley.arena.training.adapters import FullWeights

    torch = pytest.importorskip("torch")
    weights = FullWeights(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    weights.prepare_reference()  # fixed when the policy first learned
    with torch.no_grad():
        for param in weights.parameters():
            param.add_(0.5)  # what its updates did
    weights.prepare_reference()  # (a second call keeps the first reference)
    with weights.reference() as ref:
        old = dict(ref.named_parameters())
        assert not all(torch.equal(v, old[k]) for k, v in weights.module.named_parameters())
    weights.reinitialise(3)
    fresh = {k: v.detach().clone() for k, v in weights.module.named_parameters()}
    with weights.reference() as ref:
        for k, v in ref.named_parameters():
            assert torch.equal(v, fresh[k]), f"{k}: the reference is not the fresh policy"
            assert not v.requires_grad


@pytest.mark.timeout(240)
def test_a_stalled_stage_goes_back_and_the_run_records_each_attempt(tmp_path: Path) -> None:
    # below 2.0 can never be reached: the joint stage stalls at every check, goes back to the
    # listener stage once (max 1), then runs its whole budget.
    stages = [
        {"name": "listener", "agents": LISTENER, "train": ["listener"], "max_updates": 2},
        {
            "name": "joint",
            "agents": JOINT,
            "train": ["speaker", "listener"],
            "max_updates": 3,
            "window": 2,
            "restart": {
                "after": 2,
                "below": 2.0,
                "back_to": "listener",
                "max": 1,
                "reinit": ["speaker"],
            },
        },
    ]
    config = load_train_config(data=_config(tmp_path, stages, seed=5))
    result = train(config)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    got = [(s["stage"], s["attempt"], s["stalled"], s["updates"]) for s in summary["stages"]]
    assert got == [
        ("listener", 0, False, 2),
        ("joint", 0, True, 2),  # stalled at its first check
        ("listener", 1, False, 2),
        ("joint", 1, False, 3),  # no restarts left: the stage runs on
    ]
    # Every attempt drew its own episodes, and the run says which.
    seeds = RunSeeds.from_config(config)
    assert [s["seed"] for s in summary["stages"]] == [
        seeds.episodes[0],
        seeds.episodes[1],
        seeds.stage_episodes(0, 1),
        seeds.stage_episodes(1, 1),
    ]
    assert len({s["seed"] for s in summary["stages"]}) == 4
    # The speaker started over from fresh weights, drawn with a recorded seed.
    assert summary["stages"][1]["reinit"] == {"speaker": seeds.reinit(0, 1)}
    assert "reinit" not in summary["stages"][3]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [(r["stage"], r["attempt"]) for r in rows] == [
        ("listener", 0),
        ("listener", 0),
        ("joint", 0),
        ("joint", 0),
        ("listener", 1),
        ("listener", 1),
        ("joint", 1),
        ("joint", 1),
        ("joint", 1),
    ]
    # The restored weights went to the pool as a new version: the listener's version after
    # the restart is one past the last update before it (2 + 2 updates, then the restore).
    assert rows[3]["version_listener"] == 4
    assert rows[4]["version_listener"] == 6
    assert result.checkpoints.keys() == {"speaker", "listener"}


def test_restart_rules_that_cannot_work_are_refused(tmp_path: Path) -> None:
    def stages(restart: dict[str, Any], kind: str = "rl") -> list[dict[str, Any]]:
        first = {"name": "listener", "agents": LISTENER, "train": ["listener"]}
        second = {"name": "joint", "agents": JOINT, "train": ["speaker"], "restart": restart}
        if kind == "reading":
            second = {"name": "joint", "kind": "reading", "train": ["speaker"], "restart": restart}
        return [first, second]

    later = {
        **stages({"after": 5, "below": 0.5})[0],
        "restart": {"after": 5, "below": 0.5, "back_to": "joint"},
    }
    cases = [
        (stages({"after": 5, "below": 0.5, "back_to": "nowhere"}), "back_to"),
        ([later, stages({})[1] | {"restart": None}], "back_to"),  # a later stage
        (stages({"after": 0, "below": 0.5}), "after >= 1"),
        (stages({"after": 5, "below": 0.5, "max": -1}), "max >= 0"),
        (stages({"after": 5, "below": 0.5}, kind="reading"), "rl stage"),
        (stages({"after": 5, "below": 0.5, "reinit": ["critic"]}), "reinit"),
    ]
    for bad, message in cases:
        with pytest.raises(ConfigError, match=message):
            load_train_config(data=_config(tmp_path, bad))


@pytest.mark.timeout(240)
def test_a_stage_restarts_itself_until_its_budget_is_spent(tmp_path: Path) -> None:
    # The second stage's own rule (no back_to), twice, each time with a fresh speaker.
    stages = [
        {"name": "listener", "agents": LISTENER, "train": ["listener"], "max_updates": 1},
        {
            "name": "speaker",
            "agents": JOINT,
            "train": ["speaker"],
            "max_updates": 2,
            "window": 1,
            "restart": {"after": 1, "below": 2.0, "max": 2, "reinit": ["speaker"]},
        },
    ]
    config = load_train_config(data=_config(tmp_path, stages, seed=3))
    train(config)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    got = [(s["stage"], s["attempt"], s["stalled"], s["updates"]) for s in summary["stages"]]
    assert got == [
        ("listener", 0, False, 1),
        ("speaker", 0, True, 1),
        ("speaker", 1, True, 1),
        ("speaker", 2, False, 2),
    ]
    seeds = RunSeeds.from_config(config)
    fresh = [s.get("reinit") for s in summary["stages"]]
    assert fresh == [None, {"speaker": seeds.reinit(0, 1)}, {"speaker": seeds.reinit(0, 2)}, None]


def test_a_new_run_into_the_same_out_starts_a_new_metrics_file(tmp_path: Path) -> None:
    from parley.arena.training.outputs import MetricsLogger

    for run in ("first", "second"):
        logger = MetricsLogger(tmp_path)
        logger.log({"update": 1, "run": run})
        logger.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert [r["run"] for r in rows] == ["second"]  # not two runs' rows mixed
