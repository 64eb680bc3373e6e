"""The tiny model: deterministic, loadable as a real checkpoint, chat-ready."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest

pytest.importorskip("torch")

from parley.arena.cli import model as model_command
from parley.arena.inference.models.tiny import SPECIAL_TOKENS, TinyModelConfig
from parley.protocols.errors import ConfigError


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_the_command_builds_the_same_files_as_the_fixture(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    parser = argparse.ArgumentParser()
    model_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["model", "tiny", str(tmp_path / "m")])
    assert args.func(args) == 0
    assert digest(tmp_path / "m") == digest(tiny_model_dir)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(digest(tiny_model_dir))


def test_it_loads_through_the_auto_classes(tiny_model_dir: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.hidden_size // config.num_attention_heads >= 32
    assert 512 <= len(tok) <= 2048
    assert tok.convert_ids_to_tokens(list(range(len(SPECIAL_TOKENS)))) == list(SPECIAL_TOKENS)
    text = tok.apply_chat_template(
        [{"role": "system", "content": "You sell hats."}, {"role": "user", "content": "offer 2"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert (
        text
        == "<|bos|><|system|>\nYou sell hats.<|end|>\n<|user|>\noffer 2<|end|>\n<|assistant|>\n"
    )
    for word in ("offer", " accept", " deny", " book", " hat", " ball"):
        assert tok.decode(tok.encode(word)) == word
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.eos_token_id == tok.eos_token_id


def test_other_seeds_give_other_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    from parley.arena.inference.models.tiny import build_tiny_model

    other = digest(build_tiny_model(tmp_path, TinyModelConfig(seed=1)))
    base = digest(tiny_model_dir)
    assert other["tokenizer.json"] == base["tokenizer.json"]
    assert other["model.safetensors"] != base["model.safetensors"]


def test_head_size_below_32_is_refused() -> None:
    with pytest.raises(ConfigError, match="head size"):
        TinyModelConfig(hidden_size=64, num_heads=4)
