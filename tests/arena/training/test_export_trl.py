"""The TRL exports load in TRL itself: one step of its SFT, KTO and GRPO trainers on the
tiny model, from chats exported from real multi-turn episodes.

Needs ``trl`` (trl 1.16.0, datasets 5.2, accelerate 1.16: the ``train`` extra, which ``make
install`` installs; adds ~26 s of install and ~30 s to the suite); skipped without it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def exported(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from parley.arena.cli import main
    from parley.arena.inference.backends.tokenizer import load_tokenizer
    from parley.arena.training.export import export, read_trajectories

    out = tmp_path_factory.mktemp("trl-export")
    agent = f"llm:{tiny_model_dir}?max_tokens=6"
    status = main(
        [
            *("run", "negotiation/simple-trade-v0", "--agents", f"{agent},{agent}"),
            *("--episodes", "2", "--no-progress", "--out", str(out), "-s", "max_turns=4"),
        ]
    )
    assert status == 0
    tokenizer = load_tokenizer(str(tiny_model_dir))
    source = out / "trajectories.jsonl"
    export(read_trajectories(source), out / "turn.jsonl", format="trl", tokenizer=tokenizer)
    conversation = out / "conversation.jsonl"
    export(
        read_trajectories(source),
        conversation,
        format="trl",
        tokenizer=tokenizer,
        conversation=True,
    )
    return out


def _args(config: Any, out: Path, **extra: Any) -> Any:
    return config(
        output_dir=str(out / "trainer"),
        max_steps=1,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        **extra,
    )


def _trained(trainer: Any) -> float:
    loss = float(trainer.train().training_loss)
    assert math.isfinite(loss)
    return loss


def _model_and_tokenizer(path: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    from parley.arena.inference.backends.tokenizer import load_tokenizer

    return AutoModelForCausalLM.from_pretrained(str(path)), load_tokenizer(str(path)).hf


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sft_on_whole_conversations(exported: Path, tiny_model_dir: Path) -> None:
    model, hf = _model_and_tokenizer(tiny_model_dir)
    ds = datasets.load_dataset("json", data_files=str(exported / "conversation.jsonl"))["train"]
    assert ds.column_names == ["messages"]
    args = _args(trl.SFTConfig, exported, max_length=512)
    _trained(trl.SFTTrainer(model=model, processing_class=hf, train_dataset=ds, args=args))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kto_on_labelled_turns(exported: Path, tiny_model_dir: Path) -> None:
    model, hf = _model_and_tokenizer(tiny_model_dir)
    ds = datasets.load_dataset("json", data_files=str(exported / "turn.jsonl"))["train"]
    ds = ds.remove_columns(["reward"])  # KTO reads prompt, completion, label
    args = _args(trl.KTOConfig, exported, max_length=512)
    _trained(trl.KTOTrainer(model=model, processing_class=hf, train_dataset=ds, args=args))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grpo_from_the_exported_prompts(exported: Path, tiny_model_dir: Path) -> None:
    model, hf = _model_and_tokenizer(tiny_model_dir)
    ds = datasets.load_dataset("json", data_files=str(exported / "turn.jsonl"))["train"]
    ds = ds.remove_columns(["completion", "label"])  # GRPO generates its own completions

    def reward(completions: list[Any], **_: Any) -> list[float]:
        return [float(len(c[0]["content"]) % 3) for c in completions]

    args = _args(trl.GRPOConfig, exported, num_generations=2, max_completion_length=6)
    trainer = trl.GRPOTrainer(
        model=model, processing_class=hf, reward_funcs=reward, train_dataset=ds, args=args
    )
    _trained(trainer)
