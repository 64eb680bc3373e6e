"""``parley train`` with ``lora:`` through the real path: runner, pool (one base, one adapter
per policy), sampler, trainer, in-process weight sync, adapter checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from parley.arena.training.loop import load_train_config, train
from tests.arena.training.referential import REFERENTIAL_K2, SCENARIO

KWARGS = REFERENTIAL_K2


def _config(model: Path, out: Path, stages: list[dict[str, Any]], **extra: Any) -> Any:
    return load_train_config(
        data={
            "scenario": SCENARIO,
            "scenario_kwargs": KWARGS,
            "model": str(model),
            "policies": ["speaker", "listener"],
            "agent": {"max_tokens": 4, "system_prompt": False},
            "threads": 2,
            "progress": False,
            "stages": stages,
            "out": str(out),
            **extra,
        }
    )


def _stage(name: str, learner: str, updates: int, **extra: Any) -> dict[str, Any]:
    speaker = "scripted" if learner == "listener" else "policy:speaker"
    return {
        "name": name,
        "agents": {"speaker": speaker, "listener": "policy:listener"},
        "train": [learner],
        "max_updates": updates,
        **extra,
    }


@pytest.mark.timeout(300)
def test_each_stage_moves_only_its_learners_adapter_in_the_pool(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from safetensors.numpy import load_file

    from parley.arena.cli.train import _spec

    config = _config(
        tiny_model_dir,
        tmp_path / "run",
        [
            {
                "name": "read",
                "kind": "reading",
                "train": ["listener"],
                "max_updates": 2,
                "reading": {"batch_size": 8},
            },
            _stage("listener", "listener", 2),
            _stage("speaker", "speaker", 2),
        ],
        lora={"r": 4, "alpha": 8},
        sampler={"batch_size": 8, "staleness": 0, "concurrency": 8},
        pg={"lr": 1e-2},
    )
    result = train(config)
    rows = [r for r in result.history if "version_listener" in r]
    assert [r["stage"] for r in rows] == ["listener"] * 2 + ["speaker"] * 2
    # The pool serves one base (under its own name) and an adapter per policy; only the
    # learner's adapter gets new versions, the base and the other adapter stay.
    # (The reading warm start trains the listener's adapter too: version 1.)
    assert [r["version_listener"] for r in rows] == [2, 3, 3, 3]
    assert [r["version_speaker"] for r in rows] == [0, 0, 4, 5]
    assert all(r["version__base0"] == 0 for r in rows)
    # Trainer and pool compute alike (float32): on-policy logprobs agree.
    assert all(r["logp_gap"] < 1e-4 for r in rows if "logp_gap" in r)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["models"]["lora"] is True
    assert summary["models"]["served_dtype"] == {"_base0": "float32"}
    trained = summary["models"]["trained_parameters"]
    # r = 4 on 7 linear layers (in + out widths 256, 192, 192, 256, 384, 384, 384) x 2 blocks
    assert trained == {"speaker": 4 * 2 * 2048, "listener": 4 * 2 * 2048}
    assert summary["seeds"]["lora"] == {"speaker": 0, "listener": 1}
    # Checkpoints are PEFT adapter directories; the initial adapters are kept beside them.
    for policy in ("speaker", "listener"):
        path = result.checkpoints[policy]
        assert sorted(p.name for p in path.iterdir()) == [
            "adapter_config.json",
            "adapter_model.safetensors",
        ]
        config_json = json.loads((path / "adapter_config.json").read_text())
        assert config_json["base_model_name_or_path"] == str(tiny_model_dir.resolve())
        # parley train prints the spec that plays it.
        assert _spec(path) == f"llm:{tiny_model_dir.resolve()}?adapter={path}"
        final = load_file(str(path / "adapter_model.safetensors"))
        initial = load_file(
            str(tmp_path / "run" / "adapters" / policy / "adapter_model.safetensors")
        )
        assert sorted(final) == sorted(initial)
        lora_b = [k for k in final if "lora_B" in k]
        assert all(not initial[k].any() for k in lora_b)  # a fresh adapter changes nothing
        assert any(final[k].any() for k in lora_b), f"{policy}'s adapter never learned"
    # The round trip: parley run plays the checkpoint as an adapter of the base.
    _play(tiny_model_dir, result.checkpoints["listener"], tmp_path / "play", 2)
    used = {
        t["policy"]
        for line in (tmp_path / "play" / "trajectories.jsonl").read_text().splitlines()
        for turn in json.loads(line)["turns"]
        for t in turn.get("tokens", [])
    }
    assert used == {"listener"}  # the adapter's policy (its directory's name), not the base


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lora_with_every_real_model_switch_on(tiny_model_dir: Path, tmp_path: Path) -> None:
    """bf16, gradient checkpointing and a token budget together, through the whole loop: the
    pool serves in bf16 and the metrics say how far its logprobs are from the trainer's."""
    config = _config(
        tiny_model_dir,
        tmp_path / "run",
        [_stage("listener", "listener", 2)],
        lora={"r": 4},
        precision="bf16",
        gradient_checkpointing=True,
        device="auto",
        sampler={"batch_size": 8, "staleness": 0, "concurrency": 8},
        pg={"lr": 1e-2, "token_budget": 64},
    )
    result = train(config)
    rows = [r for r in result.history if "version_listener" in r]
    assert [r["version_listener"] for r in rows] == [1, 2]
    for row in rows:
        assert row["micro_batches"] > 1  # 8 prompts of ~20 tokens do not fit 64 tokens
        assert 0 < row["logp_gap"] < 0.2, row["logp_gap"]  # bf16 both sides, not the same code
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["models"]["served_dtype"] == {"_base0": "bfloat16"}
    assert summary["models"]["precision"] == "bf16"


def _play(model: Path, adapter: Path, out: Path, episodes: int) -> float:
    """Mean success of greedy ``llm:BASE?adapter=DIR`` listening to the scripted speaker."""
    from parley.arena.cli import main

    kwargs = [arg for k, v in KWARGS.items() for arg in ("-s", f"{k}={v}")]
    listener = f"llm:{model}?adapter={adapter}&max_tokens=4&temperature=0&system_prompt=none"
    status = main(
        [
            *("run", SCENARIO, "--agents", f"scripted,{listener}", *kwargs),
            *("--episodes", str(episodes), "--concurrency", str(episodes), "--seed", "123"),
            *("--no-progress", "--out", str(out), "--act-timeout", "120"),
        ]
    )
    assert status == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"]["failed"] == 0
    return float(summary["metrics"]["success"]["mean"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_lora_listener_learns_and_its_checkpoint_plays_as_trained(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Reward alone, against the scripted speaker's code, adapters only: from chance (0.5)
    to >= 0.85 (measured: ~0.95 in ~25 updates of 64 episodes); then ``parley run`` with
    ``llm:BASE?adapter=OUT/checkpoints/listener`` plays as well, the initial adapter not."""
    config = _config(
        tiny_model_dir,
        tmp_path / "run",
        [_stage("listener", "listener", 60, target=0.95, window=5)],
        lora={"r": 8},
        sampler={"batch_size": 64, "staleness": 0, "concurrency": 64},
        pg={"estimator": "grpo", "grouping": "role", "lr": 1e-3},
    )
    result = train(config)
    curve = result.stage_summaries[0]["curve"]
    assert np.mean(curve[:3]) < 0.7, f"the listener should start near chance: {curve[:3]}"
    assert np.mean(curve[-5:]) >= 0.85, f"the listener did not learn: {curve}"
    trained = _play(tiny_model_dir, result.checkpoints["listener"], tmp_path / "after", 32)
    initial = _play(
        tiny_model_dir, tmp_path / "run" / "adapters" / "listener", tmp_path / "before", 32
    )
    assert trained >= 0.8, (trained, initial)
    assert initial <= 0.75, (trained, initial)
