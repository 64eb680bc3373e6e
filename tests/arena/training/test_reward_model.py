"""Reward models: Bradley-Terry training on the tiny model, TRL-format checkpoints, export."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from parley.arena.cli import main
from parley.arena.run.episode import EpisodeLog, EpisodePlan
from parley.arena.run.model_rewards import MAX_SCORED_WORDS
from parley.arena.run.records import EpisodeRecord
from parley.arena.training.reward_model import (
    Preference,
    RewardModelConfig,
    RewardModelReward,
    export_preferences,
    load_reward_model,
    pair_accuracy,
    read_preferences,
    score_texts,
    seat_text,
    train_reward_model,
)
from parley.protocols.errors import ConfigError
from parley.protocols.messages import Action, Observation

torch = pytest.importorskip("torch")

_WORDS = ["the", "a", "deal", "offer", "book", "hat", "ball", "trade", "yes", "no", "give", "take"]


def synthetic_pairs(n: int, seed: int, token: str = "apple") -> list[Preference]:
    """Pairs whose chosen holds ``token`` where the rejected holds another word: the same
    number of words on both sides (a length-neutral preference)."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(6)]
        good = list(words)
        good[rng.randrange(6)] = token
        pairs.append(Preference("Reply: ", " ".join(good), " ".join(words)))
    return pairs


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reward model trained by ``parley train-rm`` on 40 synthetic pairs, without the
    padding term (~4 s of CPU; the padding guard's test trains its own, ``long``)."""
    work = tmp_path_factory.mktemp("rm")
    data = work / "preferences.jsonl"
    rows = [
        {"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected, "who": "test"}
        for p in synthetic_pairs(40, seed=1)
    ]
    rows.append({"prompt": "x", "chosen": "a", "rejected": "b", "tie": True})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = work / "model"
    status = main(
        ["train-rm", "--data", str(data), "--model", str(tiny_model_dir), "--out", str(out),
         "--lr", "3e-4", "--padding-penalty", "0"]
    )  # fmt: skip
    assert status == 0
    return out


def test_reward_model_ranks_held_out_pairs(reward_model_dir: Path) -> None:
    report = json.loads((reward_model_dir / "reward_model.json").read_text())
    assert report["pairs"] == 40
    assert report["ties"] == 1
    assert report["last_loss"] < report["first_loss"]
    model, tokenizer = load_reward_model(reward_model_dir)
    held_out = synthetic_pairs(20, seed=99)
    assert pair_accuracy(model, tokenizer, held_out) >= 0.8


def test_checkpoint_loads_as_trl_reward_model(reward_model_dir: Path) -> None:
    """TRL's RewardTrainer format: a one-label AutoModelForSequenceClassification that
    ``from_pretrained`` loads with its trained head (no newly initialised weights)."""
    transformers = pytest.importorskip("transformers")
    model, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        reward_model_dir, output_loading_info=True
    )
    assert model.config.num_labels == 1
    assert not info["missing_keys"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(reward_model_dir)
    ours, our_tokenizer = load_reward_model(reward_model_dir)
    text = "Reply: the apple deal"
    with torch.no_grad():
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        theirs = model(**ids).logits[0, 0]
        mine = score_texts(ours, our_tokenizer, [text])[0]
    assert torch.allclose(theirs, mine, atol=1e-5)


def test_training_leaves_the_process_rngs_alone(tiny_model_dir: Path, tmp_path: Path) -> None:
    state = torch.get_rng_state()
    python = random.getstate()
    config = RewardModelConfig(epochs=1, batch_size=4)
    train_reward_model(synthetic_pairs(4, seed=3), tiny_model_dir, tmp_path / "m", config)
    assert torch.equal(torch.get_rng_state(), state)
    assert random.getstate() == python


def test_bad_rows_and_no_pairs_are_user_errors(tmp_path: Path, tiny_model_dir: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n{"prompt": "p"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: 'chosen' must be a string"):
        read_preferences(bad)
    ties = [Preference("p", "a", "b", tie=True)]
    with pytest.raises(ConfigError, match="no preference pairs"):
        train_reward_model(ties, tiny_model_dir, tmp_path / "m")
    assert main(["train-rm", "--data", str(bad), "--model", "x", "--out", str(tmp_path)]) == 2


def test_export_writes_trl_dpo_and_rm_rows(tmp_path: Path) -> None:
    rows = [Preference("p", "a", "b"), Preference("", "c", "d"), Preference("p", "e", "f", True)]
    data = tmp_path / "preferences.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": r.prompt, "chosen": r.chosen, "rejected": r.rejected,
                        "tie": r.tie, "who": "me"}) + "\n"
            for r in rows
        )
    )  # fmt: skip
    assert (
        main(["train-rm", "--data", str(data), "--export", "dpo", "--out", str(tmp_path / "d")])
        == 0
    )
    dpo = [json.loads(line) for line in (tmp_path / "d").read_text().splitlines()]
    assert dpo == [{"prompt": "p", "chosen": "a", "rejected": "b"}]  # no tie, no empty prompt
    assert export_preferences(rows, tmp_path / "r", "rm") == 2
    with pytest.raises(ConfigError, match="choose one of"):
        export_preferences(rows, tmp_path / "x", "ppo")


def _record(last: str = "deal?") -> EpisodeRecord:
    """A finished two-seat episode of two steps, task reward 1 to alice at the end; alice's
    last move is ``last``."""
    seats = ["alice", "bob"]
    plan = EpisodePlan(0, task=0, trial=0, seed=1, agent_seeds={"alice": 1, "bob": 2})
    log = EpisodeLog(plan, "negotiation/deal-or-no-deal-v0", seats, dict.fromkeys(seats, "llm"))
    steps = [{"alice": "I offer the apple deal", "bob": "no"}, {"alice": last, "bob": "yes"}]
    for turn, step in enumerate(steps):
        shown = {s: Observation(agent=s, text=f"turn {turn}") for s in step}
        acts = {s: Action(agent=s, text=text) for s, text in step.items()}
        rewards = {"alice": float(turn), "bob": 0.0}
        infos: dict[str, dict[str, Any]] = {s: {"components": {"task": rewards[s]}} for s in seats}
        log.add_step(turn, shown, acts, {}, rewards, {}, {}, infos)
    return log.record()


@pytest.mark.timeout(60)
async def test_rm_component_credits_each_seat_its_score(reward_model_dir: Path) -> None:
    component = RewardModelReward.from_dir(reward_model_dir, weight=0.5)
    record = _record()
    await component.apply(record)
    model, tokenizer = load_reward_model(reward_model_dir)
    texts = [component.unit(record.transcript, s) for s in ("alice", "bob")]
    with torch.no_grad():
        expected = [0.5 * float(score_texts(model, tokenizer, [t])[0]) for t in texts]
    alice, bob = record.trajectories
    assert alice.components["rm"] == pytest.approx(expected[0], abs=1e-4)
    assert bob.components["rm"] == pytest.approx(expected[1], abs=1e-4)
    assert alice.reward == pytest.approx(1.0 + expected[0], abs=1e-4)
    last = record.transcript["steps"][-1]
    assert last["infos"]["bob"]["components"] == {"task": 0.0, "rm": bob.components["rm"]}
    assert record.transcript["returns"] == {"alice": alice.reward, "bob": bob.reward}
    assert record.metrics["rm_failed"] == 0.0


def paddings(reply: str, seed: int = 0) -> list[str]:
    """60 paddings of ``reply``: 15 each of whitespace, back-to-back repeats, 1-64 of its
    own words in random order, and all three mixed."""
    rng = random.Random(seed)
    words = reply.split()
    spaces = [" ", "  ", "\n", "\t", "\n\n", " \u00a0", "\r\n", "\u2028", "\u3000", "\x0b"]
    out = []
    for n in range(15):
        out.append(reply.replace(" ", rng.choice(spaces) * (n + 1)) + rng.choice(spaces) * n)
    for n in range(15):
        cut = rng.randrange(len(words))
        out.append(reply + (" " + " ".join(words[cut:])) * (n + 2))
    own = [" ".join(rng.choices(words, k=rng.randint(1, 64))) for _ in range(30)]
    out += [f"{reply} {filler}" for filler in own[:15]]
    for n, filler in enumerate(own[15:]):
        tail = " ".join(words[-2:])
        out.append(f"{reply}{spaces[n % len(spaces)]}{filler} {tail} {tail}\n")
    return out


@pytest.mark.timeout(60)
async def test_padding_a_reply_never_changes_its_rm_reward(reward_model_dir: Path) -> None:
    """60 paddings of a reply (whitespace, repeats, its own words in any order, all mixed)
    and 10 of a reply at the word cap with new words: each scores exactly the plain
    reply's reward (the reward model reads scored_text; canonical alone let own-word
    filler through)."""
    component = RewardModelReward.from_dir(reward_model_dir)
    reply = "I take the deal if you give me the hat and two books?"
    plain = _record(reply)
    await component.apply(plain)
    padded = [_record(text) for text in paddings(reply)]
    long_reply = " ".join(f"w{i}" for i in range(MAX_SCORED_WORDS))
    long_plain = _record(long_reply)
    await component.apply(long_plain)
    padded_long = [_record(f"{long_reply} new{i} words{i} here") for i in range(10)]
    await asyncio.gather(*(component.apply(r) for r in padded + padded_long))
    expected = plain.trajectories[0].components["rm"]
    assert [r.trajectories[0].components["rm"] for r in padded] == [expected] * 60
    expected = long_plain.trajectories[0].components["rm"]
    assert [r.trajectories[0].components["rm"] for r in padded_long] == [expected] * 10
    # Every padding read the very text of its plain reply: the only texts asked are the
    # plain reply's seats (alice, bob) and the long reply's alice (bob says the same).
    assert component.requests == 3


async def test_a_failing_reward_model_leaves_the_component_out_with_why() -> None:
    async def broken(texts: list[str]) -> list[float]:
        raise RuntimeError("reward model gone")

    record = _record()
    await RewardModelReward(broken).apply(record)
    assert "rm" not in record.trajectories[0].components
    assert record.trajectories[0].reward == 1.0
    failed = {"failed": "rm_failed: RuntimeError: reward model gone"}
    assert record.transcript["rm"] == {"alice": failed, "bob": failed}
    assert record.metrics["rm_failed"] == 1.0


def test_seat_text_is_what_the_rate_page_shows() -> None:
    """A reward model trained on ratings of ``parley view --rate --seat S`` scores, as a
    reward, the same text the rater was shown."""
    from parley.arena.view.rate import shown_items, shown_text

    record = _record()
    for seat in ("alice", "bob"):
        shown = shown_text(shown_items(record.transcript, seat))
        assert seat_text(record.transcript, seat) == shown
