"""A tiny chat model, built from scratch in seconds and saved in Hugging Face format.

Nothing can be downloaded at run time on the machines parley's tests run on, so the
project makes its own model and loads it through exactly the path a real checkpoint
takes (``AutoTokenizer`` / ``AutoModelForCausalLM`` / vLLM by directory):

1. a byte-level BPE tokenizer trained with ``tokenizers`` on a bundled corpus
   (``tiny_corpus.txt``: varied English plus the vocabulary parley's scenarios use),
   with special tokens and a chat template;
2. a randomly initialised small Llama (default: hidden 128, 2 layers, 4 heads of 32 —
   vLLM's CPU attention needs a head size of at least 32).

The result is deterministic for a given :class:`TinyModelConfig` (same seed, same files).
The model is untrained: it produces fluent-looking token soup, which is all tests,
benchmarks and the demo need from it.

Chat format (the ``chat_template`` saved with the tokenizer)::

    <|bos|><|system|>\\n{system}<|end|>\\n<|user|>\\n{user}<|end|>\\n<|assistant|>\\n

``<|end|>`` is the end-of-sequence token: a model's turn ends when it produces it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console

from parley.protocols.errors import ConfigError, require

__all__ = [
    "TinyModelConfig",
    "build_tiny_model",
    "default_model_dir",
    "ensure_tiny_model",
]

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, "<|system|>", "<|user|>", "<|assistant|>")
"""Special tokens, in id order (ids 0..5): padding, begin, end of turn, role markers."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
"""Jinja chat template: role marker, newline, content, end marker, per message."""


@dataclasses.dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny model; the defaults are what tests and the demo use."""

    seed: int = 0
    """Seeds the weight initialisation (the tokenizer is deterministic by itself)."""
    vocab_size: int = 1024
    """Target BPE vocabulary size, special tokens included (512-2048 is sensible)."""
    hidden_size: int = 128
    """Width of the residual stream; ``num_heads * head_dim`` by construction."""
    num_layers: int = 2
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads; ``hidden_size / num_heads`` must be >= 32 (vLLM CPU attention)."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention when fewer than ``num_heads``)."""
    intermediate_size: int = 256
    """Width of the MLP."""
    max_position_embeddings: int = 2048
    """Longest sequence (prompt + completion) the model accepts."""
    initializer_range: float = 0.1
    """Std of the random weights. Larger than Llama's 0.02 so next-token distributions
    are peaked enough that greedy decoding is not decided by rounding noise."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}"
            )
        if self.hidden_size // self.num_heads < 32:
            raise ConfigError(
                f"head size {self.hidden_size // self.num_heads} < 32: vLLM's CPU attention "
                "rejects it; raise hidden_size or lower num_heads"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("num_heads must be a multiple of num_kv_heads")
        if not len(SPECIAL_TOKENS) + 256 < self.vocab_size <= 65536:
            raise ConfigError(f"vocab_size must be in (262, 65536], got {self.vocab_size}")


def corpus_text() -> str:
    """The bundled training corpus for the tokenizer."""
    return (
        resources.files("parley.arena.inference.models")
        .joinpath("tiny_corpus.txt")
        .read_text("utf-8")
    )


def build_tiny_model(directory: str | Path, config: TinyModelConfig | None = None) -> Path:
    """Train the tokenizer, initialise the model and save both into ``directory``.

    Writes ``tokenizer.json``, ``tokenizer_config.json``, ``config.json``,
    ``generation_config.json`` and ``model.safetensors`` (plus a ``parley_tiny.json``
    recording ``config``). The directory is created if needed; existing files of the
    same names are overwritten. Returns the directory as a :class:`~pathlib.Path`.
    """
    config = config or TinyModelConfig()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(config)
    tokenizer.save_pretrained(out)
    _make_portable(out / "tokenizer_config.json")
    _init_model(config, tokenizer).save_pretrained(out)
    (out / "parley_tiny.json").write_text(json.dumps(dataclasses.asdict(config), indent=2))
    return out


def _make_portable(tokenizer_config: Path) -> None:
    """Name the tokenizer class every transformers version knows and inline the template.

    transformers 5 writes ``TokenizersBackend`` and a separate ``chat_template.jinja``;
    older readers (and other engines' tokenizer loaders) expect
    ``PreTrainedTokenizerFast`` and ``chat_template`` inside ``tokenizer_config.json``.
    """
    data = json.loads(tokenizer_config.read_text())
    data["tokenizer_class"] = "PreTrainedTokenizerFast"
    data["chat_template"] = CHAT_TEMPLATE
    tokenizer_config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _train_tokenizer(config: TinyModelConfig):  # type: ignore[no-untyped-def]
    tk: Any = require("tokenizers", "torch")
    transformers: Any = require("transformers", "torch")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    assert tk is not None  # the require above raised otherwise; keeps the import explicit
    tok = tk.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        # Every byte is a token, so any text (and any regex constraint) can be produced.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = corpus_text().splitlines()
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        model_max_length=config.max_position_embeddings,
    )


def _init_model(config: TinyModelConfig, tokenizer):  # type: ignore[no-untyped-def]
    torch: Any = require("torch", "torch")
    transformers: Any = require("transformers", "torch")
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in (PAD, BOS, EOS)}
    llama = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.hidden_size // config.num_heads,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        pad_token_id=ids[PAD],
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        tie_word_embeddings=True,
        dtype="float32",
    )
    # fork_rng: seed the initialisation without touching the caller's global torch RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = transformers.LlamaForCausalLM(llama)
    model.generation_config.pad_token_id = ids[PAD]
    model.generation_config.bos_token_id = ids[BOS]
    model.generation_config.eos_token_id = ids[EOS]
    return model.eval()


def default_model_dir() -> Path:
    """Where the demo and the benchmarks keep the tiny model."""
    cache = os.environ.get("PARLEY_CACHE") or Path.home() / ".cache" / "parley"
    return Path(cache) / "tiny-model"


def ensure_tiny_model(directory: Path | None = None, console: Console | None = None) -> Path:
    """``directory`` (default :func:`default_model_dir`), with the tiny model built in it
    unless a model is already there (a ``config.json`` and its weights).

    Safe to call from several processes at once and to interrupt: the model is built in a
    temporary directory beside ``directory`` and renamed into place when whole, under a
    lock file (``.NAME.lock`` beside it), so a second first run waits for the first one's
    build and uses it. A directory an interrupted build left by an older parley (a
    ``config.json`` and no weights, only files a build writes) is replaced; anything else
    incomplete there is refused with :class:`ConfigError`.
    """
    directory = directory or default_model_dir()
    if _is_model(directory):
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(directory):
        if _is_model(directory):  # built by the run we waited for
            return directory
        _clear_leftovers(directory)
        console = console or Console(stderr=True)
        started = time.perf_counter()
        building = Path(
            tempfile.mkdtemp(prefix=f".{directory.name}.building-", dir=directory.parent)
        )
        try:
            with console.status(f"building the tiny model into {directory}"):
                build_tiny_model(building)
            os.rename(building, directory)  # atomic: the directory is whole or absent
        finally:
            shutil.rmtree(building, ignore_errors=True)  # gone unless the rename failed
    console.print(f"tiny model built in {directory} ({time.perf_counter() - started:.1f} s)")
    return directory


_BUILT_FILES = frozenset(
    {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json",
     "generation_config.json", "model.safetensors", "parley_tiny.json", "chat_template.jinja"}
)  # fmt: skip
"""Files :func:`build_tiny_model` writes (transformers' tokenizer writes a subset of the
tokenizer ones, by version): a directory holding only these is a build's."""


def _is_model(directory: Path) -> bool:
    """A checkpoint is there: its ``config.json`` and weights (safetensors or torch)."""
    if not (directory / "config.json").is_file():
        return False
    return any(directory.glob("*.safetensors")) or any(directory.glob("pytorch_model*.bin"))


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """Hold ``.NAME.lock`` beside ``directory`` (released by the kernel if this dies)."""
    import fcntl

    lock = directory.parent / f".{directory.name}.lock"
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # waits for another process's build
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _clear_leftovers(directory: Path) -> None:
    """Remove (under the build lock) what interrupted builds left: temporary directories
    beside ``directory``, and ``directory`` itself when it holds only a build's files."""
    for stale in directory.parent.glob(f".{directory.name}.building-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if not directory.exists():
        return
    names = {p.name for p in directory.iterdir()}
    if names - _BUILT_FILES or not directory.is_dir():
        raise ConfigError(
            f"{directory} holds no complete model (no config.json with weights) and files "
            "the tiny model build does not write: move it away, or pass another directory"
        )
    shutil.rmtree(directory)
