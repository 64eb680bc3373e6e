"""The ``similarity`` reward component (:mod:`parley.scenarios.similarity`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parley.protocols.errors import ConfigError
from parley.scenarios import make
from parley.scenarios.similarity import (
    EmbeddingSimilarity,
    SimilarityReward,
    chrf,
    similarity_scorer,
)

pytest.importorskip("sacrebleu")


def test_chrf_known_values() -> None:
    assert chrf("Tessamar", "Tessamar") == 1.0
    assert chrf("", "Tessamar") == 0.0
    # sacrebleu 2.x sentence chrF (character 6-grams, beta 2), / 100
    assert chrf("the cat sat on the mat", "a cat sat on a mat") == pytest.approx(0.551117, abs=1e-6)
    assert chrf("Tesamar", "Tessamar") == pytest.approx(0.525028, abs=1e-6)
    # partial credit orders answers where exact match gives every wrong one 0
    assert chrf("Tesamar", "Tessamar") > chrf("Rena Volk", "Tessamar") > 0.0
    assert similarity_scorer() is chrf
    assert similarity_scorer("chrf") is chrf


@pytest.mark.timeout(60)
def test_research_team_answers_get_partial_credit() -> None:
    env = SimilarityReward(make("tool_use/research-team-v0"), chrf, key="answer")
    env.reset(seed=3)
    reference = env.oracle("biographer")["answer"]
    misspelled = reference[:-1]
    _, rewards, _, _, infos = env.step(
        {"biographer": json.dumps({"answer": misspelled}), "geographer": "{}"}
    )
    part = chrf(misspelled, reference)
    assert 0.0 < part < 1.0
    assert infos["biographer"]["components"]["similarity"] == pytest.approx(part)
    assert "similarity" not in (infos["geographer"].get("components") or {})  # no answer yet
    # the scenario's own task reward (token F1) of a misspelled one-word answer is 0
    assert rewards["biographer"] == pytest.approx(sum(infos["biographer"]["components"].values()))
    _, rewards, _, _, infos = env.step(
        {"biographer": "", "geographer": json.dumps({"answer": reference})}
    )
    assert infos["geographer"]["components"]["similarity"] == 1.0
    assert rewards["geographer"] == pytest.approx(sum(infos["geographer"]["components"].values()))
    assert "similarity" not in infos["biographer"]["components"]  # credited once, when it answered


@pytest.mark.timeout(60)
def test_embedding_cosine_on_the_tiny_model(tiny_model_dir: Path) -> None:
    score = similarity_scorer(str(tiny_model_dir))
    assert isinstance(score, EmbeddingSimilarity)
    assert score("I offer two books", "I offer two books") == pytest.approx(1.0, abs=1e-5)
    other = score("I offer two books", "hat ball hat ball")
    assert -1.0 <= other < 1.0 - 1e-4
    assert other == pytest.approx(score("hat ball hat ball", "I offer two books"), abs=1e-5)


def test_an_unloadable_embedding_model_says_what_to_give(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    with pytest.raises(ConfigError, match="no model for chrF"):
        EmbeddingSimilarity(str(tmp_path))("a", "b")


@pytest.mark.timeout(60)
def test_a_run_enables_the_component_by_config() -> None:
    from parley.arena.run.config import RunConfig
    from parley.arena.run.runner import run

    config = RunConfig(
        "tool_use/research-team-v0",
        episodes=2,
        progress=False,
        similarity="chrf",
        similarity_key="answer",
    )
    result = run(config, keep_records=True)
    for record in result.records:
        assert not record.failed
        for trajectory in record.trajectories:  # the scripted researchers answer exactly
            assert trajectory.components["similarity"] == 1.0
            assert trajectory.reward == pytest.approx(sum(trajectory.components.values()))
    plain = run(config.replace(similarity=""), keep_records=True)
    assert all("similarity" not in t.components for r in plain.records for t in r.trajectories)
