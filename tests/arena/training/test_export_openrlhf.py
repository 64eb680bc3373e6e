"""The OpenRLHF rows against OpenRLHF's documented data contract (the library itself needs
DeepSpeed, Ray and a GPU build of torch, so it does not install in CI).

Contract, as OpenRLHF's ``openrlhf/datasets/sft_dataset.py`` (``preprocess_data``, main of
OpenRLHF 0.11, PyPI 0.11.2) and ``prompts_dataset.py`` read a row with ``--input_key input
--output_key output --label_key label --apply_chat_template``:

- SFT: ``prompt = template(row[input], add_generation_prompt=True)``, ``response =
  template(row[input] + row[output])[len(prompt):]``; ``input + output`` is a list
  concatenation, so when ``input`` is a chat ``output`` must be a message list too (a string
  raises TypeError there; this test caught our rows doing exactly that);
- PPO prompts: ``template(row[input], add_generation_prompt=True)`` and the ``label`` as is.

Here the tokenizer's own chat template plays OpenRLHF's part: the prompt must be exactly the
chat the model saw and the response exactly the completion.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from parley.arena.training.export import export, read_trajectories
from tests.arena.training.test_export import SYSTEM, _trajectory


def _rows(tmp_path: Path) -> list[dict]:
    source = tmp_path / "trajectories.jsonl"
    source.write_bytes(msgspec.json.encode(_trajectory()) + b"\n")
    out = tmp_path / "openrlhf.jsonl"
    export(read_trajectories(source), out, format="openrlhf", system_prompts=SYSTEM)
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_openrlhf_sft_rows_template_to_the_chat_and_the_completion(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    if not tok.chat_template:
        pytest.skip("the tiny tokenizer has no chat template")
    rows = _rows(tmp_path)
    for row in rows:
        assert isinstance(row["input"], list)
        assert isinstance(row["output"], list)
        prompt = tok.apply_chat_template(row["input"], tokenize=False, add_generation_prompt=True)
        whole = tok.apply_chat_template(row["input"] + row["output"], tokenize=False)
        assert whole.startswith(prompt)
        response = whole[len(prompt) :]
        assert response.startswith(row["output"][0]["content"])
        assert row["input"][0] == {"role": "system", "content": "You are a trader."}
    assert [r["output"][0]["content"] for r in rows] == ["a0", "a2"]
    assert [r["input"][-1]["content"] for r in rows] == ["o0", "o2"]


def test_openrlhf_prompt_rows_carry_a_label_and_a_chat(tmp_path: Path) -> None:
    for row in _rows(tmp_path):
        assert isinstance(row["label"], bool)
        assert isinstance(row["reward"], float)
        assert [m["role"] for m in row["input"]][-1] == "user"  # a generation prompt follows
        assert row["output"] == [{"role": "assistant", "content": row["output"][0]["content"]}]
