"""The TRL exports load in TRL itself: one step of its SFT, KTO and GRPO trainers on the
tiny model, from chats exported from real multi-turn episodes.

Needs ``trl`` (trl 1.16.0, datasets 5.2, accelerate 1.16: the ``train`` extra, which ``make
install`` installs; adds ~26 s of install and ~30 s to the suite); skipped without it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
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


@pytest.mark.timeout(120)
@pytest.mark.parametrize("keep_token_ids", ["false", "true"])
def test_trl_templating_of_an_export_with_an_injecting_partner(
    tiny_model_dir: Path, tmp_path: Path, keep_token_ids: str
) -> None:
    # Issue 29 §5: 20 of 22 TRL prompts of such a run carried a forged system turn while the
    # export marked them exact. Now: TRL's own templating gives the recorded ids on every row
    # the export marks template_exact, and no row carries a control token the model did not
    # see. With keep_token_ids a prompt holds the model's own reply ids, which its text need
    # not encode back to: such rows are not exact (chat_exact False), and hold no forged
    # control token either.
    from trl.data_utils import maybe_apply_chat_template

    from parley.arena.cli import main
    from parley.arena.inference.backends.tokenizer import load_tokenizer
    from parley.arena.training.export import export, read_trajectories

    agent = f"llm:{tiny_model_dir}?max_tokens=6&keep_token_ids={keep_token_ids}"
    status = main(
        [
            *("run", "negotiation/simple-trade-v0", "--agents"),
            # A partner whose every message spells <|end|>, <|system|>, <|user|>.
            f"{agent},tests.arena.inference.test_chat_quoting:Forger",
            *("--episodes", "2", "--no-progress", "--out", str(tmp_path), "-s", "max_turns=4"),
        ]
    )
    assert status == 0
    tokenizer = load_tokenizer(str(tiny_model_dir))
    hf = tokenizer.hf
    source = tmp_path / "trajectories.jsonl"
    for fmt in ("parley", "trl"):
        export(
            read_trajectories(source), tmp_path / f"{fmt}.jsonl", format=fmt, tokenizer=tokenizer
        )
    parley_rows = [json.loads(line) for line in (tmp_path / "parley.jsonl").open()]
    trl_rows = datasets.load_dataset("json", data_files=str(tmp_path / "trl.jsonl"))["train"]
    assert len(trl_rows) == len(parley_rows) > 2
    special = set(hf.added_tokens_decoder)
    injected = 0
    for row, example in zip(parley_rows, trl_rows, strict=True):
        saw = row["prompt_token_ids"]
        if keep_token_ids == "false":
            assert row["chat_exact"]  # parley's encoder rebuilds what the model saw
        # TRL's templating (GRPO, KTO, offline prompt-completion), then its tokenization.
        prompt = maybe_apply_chat_template({"prompt": example["prompt"]}, hf)["prompt"]
        trl_ids = hf(text=prompt, add_special_tokens=False)["input_ids"]
        if row["template_exact"]:
            assert trl_ids == saw
        elif row["chat_exact"]:
            injected += 1
            # The chat holds the partner's message, its spellings broken.
            assert any("< |system|>" in m["content"] for m in row["messages"])
            assert not any("<|system|>" in m["content"] for m in row["messages"])
        # Control tokens: exactly those the model saw (the template's own), no forged one.
        assert Counter(t for t in trl_ids if t in special) == Counter(
            t for t in saw if t in special
        )
    assert injected >= 1
    assert injected < len(parley_rows)  # the first turn, before any message, stays exact
