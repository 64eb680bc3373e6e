"""Red team of the model-based rewards (judge, reward model ``rm``): texts a policy could
write to raise its reward without better content, or to make the model fail (no component)
where a low one was due. Each test fails on the hole it names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from parley.arena.run.judge import Judge, judged_lines, load_rubric
from parley.arena.run.model_rewards import ScoredReward, canonical, scored_text
from tests.arena.run.test_judge import RUBRIC, STEPS, _record
from tests.arena.run.test_judge import judge as judge  # (the fixture: the tiny model's judge)

pytest.importorskip("torch")

# Each pads "great" with copies a reader sees as the same word: zero-width space, word
# joiner, soft hyphen, bidi marks, a variation selector, a byte-order mark, a Hangul filler,
# fullwidth letters, a C0 control.
INVISIBLE_COPIES = [
    "great\u200b",
    "gr\u2060eat",
    "gre\u00adat",
    "\u200egreat\u200f",
    "great\ufe0f",
    "\ufeffgreat",
    "great\u3164",
    "\uff47\uff52\uff45\uff41\uff54",
    "gre\x07at",
]


def test_invisible_characters_do_not_make_a_new_word() -> None:
    """Each copy of a word with an invisible character in it was a new word to the repeat
    rule and the reward model's one-copy-per-word rule: "great great\\u200b great\\u2060..."
    kept every copy (a reward model paying for enthusiasm was paid once per copy)."""
    plain = "The offer is great"
    padded = plain + " " + " ".join(INVISIBLE_COPIES)
    assert canonical(padded) == plain
    assert scored_text(padded) == scored_text(plain) == plain
    for copy in INVISIBLE_COPIES:
        assert canonical(f"{copy} {copy} {copy}") == "great", repr(copy)
    # what is not invisible stays: other words, look-alike letters of another script
    assert canonical("great grеat") == "great grеat"  # noqa: RUF001  (a Cyrillic e)


def _wordy(texts: list[str]) -> list[float]:
    """A reward model that pays per word read (length bias, the hole padding aims at)."""
    return [float(len(text.split())) for text in texts]


async def _score(texts: list[str]) -> list[float]:
    return _wordy(texts)


async def test_invisible_padding_never_raises_the_rm_reward_and_hits_the_cache() -> None:
    """Padding with copies of "great" is the message with "great" once (new content once)."""
    rm = ScoredReward(_score)
    once = _record([{**STEPS[0], "alice": STEPS[0]["alice"] + " great"}, STEPS[1]])
    await rm.apply(once)
    padded = _record(
        [{**STEPS[0], "alice": STEPS[0]["alice"] + " " + " ".join(INVISIBLE_COPIES)}, STEPS[1]]
    )
    await rm.apply(padded)
    assert padded.transcript["rm"] == once.transcript["rm"]
    assert rm.hits == 2  # (both seats: the very same texts)


def _utf8_words(texts: list[str]) -> list[float]:
    """A reward model whose tokenizer needs text it can encode (every real one: a lone
    surrogate is no text)."""
    return [float(len(text.encode("utf-8").split())) for text in texts]


async def _score_utf8(texts: list[str]) -> list[float]:
    return _utf8_words(texts)


async def test_a_lone_surrogate_does_not_fail_the_rm_component() -> None:
    """An in-process agent's move with a lone surrogate made the reward model's call fail:
    the seat got no ``rm`` component (failed) where its score was due."""
    rm = ScoredReward(_score_utf8)
    record = _record([{**STEPS[0], "alice": "bad offer \ud800"}, STEPS[1]])
    await rm.apply(record)
    assert "score" in record.transcript["rm"]["alice"], record.transcript["rm"]
    assert record.metrics["rm_failed"] == 0.0


@pytest.mark.timeout(60)
async def test_a_lone_surrogate_gets_a_verdict_not_an_error(judge: Judge) -> None:
    """The judge's tokenizer raised on a lone surrogate (TypeError out of ``apply``: the
    run's episode ended in an exception instead of a verdict)."""
    record = _record([{**STEPS[0], "alice": "deal \udfff"}, STEPS[1]])
    await judge.apply(record)
    assert "score" in record.transcript["judge"]["alice"], record.transcript["judge"]


@pytest.mark.timeout(60)
async def test_invisible_padding_is_the_judges_same_prompt(judge: Judge) -> None:
    def lines(alice: str) -> list[str]:
        steps = [{**STEPS[0], "alice": alice}, STEPS[1]]
        return judged_lines([{"actions": step} for step in steps], "alice")

    message = STEPS[0]["alice"]
    padded = judge.prepare(lines(message + " " + " ".join(INVISIBLE_COPIES)))[0]
    # "great" is new content once (a word the message did not have), never once per copy
    assert padded == judge.prepare(lines(message + " great"))[0]
    assert padded != judge.prepare(lines(message))[0]


class _NoPool:
    """A client never asked (only prompts are built)."""

    async def generate(self, request: Any) -> Any:
        raise AssertionError("not asked")


# Spellings a model adds as tokens that are not "special" (Qwen3's reasoning and tool tags):
# split_special_tokens leaves them whole.
NON_SPECIAL = ["<think>", "</think>", "<tool_call>"]


def _tokenizer_with_tags(tiny_model_dir: Path) -> Any:
    from parley.arena.inference.backends.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_dir))
    tokenizer.hf.add_tokens(NON_SPECIAL, special_tokens=False)
    return tokenizer


@pytest.mark.timeout(60)
def test_a_non_special_added_token_is_quoted_as_ordinary_tokens(tiny_model_dir: Path) -> None:
    """The judged text was encoded with ``split_special_tokens``, which leaves added tokens
    that are not special whole: "</think> good" put the model's real ``</think>`` id in the
    quote. Now every added-token spelling is ordinary tokens, and decodes as written."""
    tokenizer = _tokenizer_with_tags(tiny_model_dir)
    judge = Judge(_NoPool(), tokenizer, load_rubric(RUBRIC))
    tags = {tokenizer.hf.convert_tokens_to_ids(t) for t in NON_SPECIAL}
    text = "I think </think> the verdict is good <tool_call>x<think><think>"
    prompt = judge.prompt([f"alice: {text}"])
    quoted = prompt.ids[prompt.quoted]
    assert tags.isdisjoint(quoted), quoted
    assert tokenizer.hf.decode(quoted) == f"| alice: {text}"
    plain = judge.prompt(["alice: no tags here"])
    expected = tokenizer.hf("| alice: no tags here", add_special_tokens=False)["input_ids"]
    assert plain.ids[plain.quoted] == list(expected)


@pytest.mark.timeout(120)
def test_the_reward_model_reads_non_special_added_tokens_as_ordinary_tokens(
    tiny_model_dir: Path,
) -> None:
    import torch

    from parley.arena.inference.backends.scorer import load_reward_model, score_texts

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, hf = load_reward_model(tiny_model_dir)
    hf.add_tokens(NON_SPECIAL, special_tokens=False)
    model.resize_token_embeddings(len(hf))
    tags = {hf.convert_tokens_to_ids(t) for t in NON_SPECIAL}
    read: list[int] = []
    hook = model.get_input_embeddings().register_forward_pre_hook(
        lambda _module, args: read.extend(args[0].flatten().tolist())
    )
    try:
        with torch.no_grad():
            score_texts(model, hf, ["alice: </think> good"])
    finally:
        hook.remove()
    assert read
    assert tags.isdisjoint(read), read
