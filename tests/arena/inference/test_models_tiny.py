"""The tiny model: deterministic, loadable as a real checkpoint, chat-ready."""

from __future__ import annotations

import argparse
import hashlib
import shutil
import threading
from pathlib import Path
from typing import Any

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


# --------------------------------------------------------------------- the first-use build


def _staged_build(source: Path, between: Any) -> Any:
    """A stand-in for build_tiny_model that writes the real model's files one at a time,
    ``config.json`` first and the weights last, calling ``between(directory)`` in between
    (where a Ctrl-C or a second first run lands); counts its builds in ``.builds``."""

    def build(directory: str | Path, config: Any = None) -> Path:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        names = sorted(p.name for p in source.iterdir())
        names.sort(key=lambda n: (n != "config.json", n == "model.safetensors"))
        build.builds += 1  # type: ignore[attr-defined]
        for name in names:
            if name == "model.safetensors":
                between(out)
            shutil.copyfile(source / name, out / name)
        return out

    build.builds = 0  # type: ignore[attr-defined]
    return build


def test_a_build_interrupted_midway_leaves_nothing_the_next_run_trips_on(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from parley.arena.inference.models import tiny

    def ctrl_c(_: Path) -> None:
        raise KeyboardInterrupt

    target = tmp_path / "cache" / "tiny-model"
    monkeypatch.setattr(tiny, "build_tiny_model", _staged_build(tiny_model_dir, ctrl_c))
    with pytest.raises(KeyboardInterrupt):
        tiny.ensure_tiny_model(target)
    assert sorted(p.name for p in target.parent.iterdir()) == [".tiny-model.lock"]
    monkeypatch.setattr(tiny, "build_tiny_model", _staged_build(tiny_model_dir, lambda _: None))
    assert digest(tiny.ensure_tiny_model(target)) == digest(tiny_model_dir)


def test_what_an_older_interrupted_build_left_is_rebuilt_and_nothing_else_is_deleted(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from parley.arena.inference.models import tiny

    monkeypatch.setattr(tiny, "build_tiny_model", _staged_build(tiny_model_dir, lambda _: None))
    broken = tmp_path / "tiny-model"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json"):  # a config and no weights
        shutil.copyfile(tiny_model_dir / name, broken / name)
    (tmp_path / ".tiny-model.building-x").mkdir()  # a build killed with -9
    assert digest(tiny.ensure_tiny_model(broken)) == digest(tiny_model_dir)
    assert not (tmp_path / ".tiny-model.building-x").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match="move it away"):
        tiny.ensure_tiny_model(mine)
    assert (mine / "notes.txt").read_text() == "keep"


@pytest.mark.timeout(60)
def test_two_first_runs_at_once_build_once_and_both_get_a_whole_model(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second run starts when the first has written config.json but no weights yet:
    it waits for that build (it used to return the half-written directory)."""
    from parley.arena.inference.models import tiny

    target = tmp_path / "tiny-model"
    threads: list[threading.Thread] = []
    answers: list[bool] = []

    def start_the_second(_: Path) -> None:
        def run() -> None:
            path = tiny.ensure_tiny_model(target)
            answers.append((path / "model.safetensors").is_file())

        threads.append(threading.Thread(target=run))
        threads[0].start()
        threads[0].join(timeout=2)  # returns at once if it did not wait for this build

    build = _staged_build(tiny_model_dir, start_the_second)
    monkeypatch.setattr(tiny, "build_tiny_model", build)
    assert digest(tiny.ensure_tiny_model(target)) == digest(tiny_model_dir)
    threads[0].join(timeout=30)
    assert answers == [True]
    assert build.builds == 1
