"""Version discipline (issue 10 s4): v1 scenarios match the published games, v0 stays
registered and byte-for-byte reproducible."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import numpy as np
import pytest

from parley.scenarios import make, registry
from parley.scenarios.conformance import play_episode
from parley.scenarios.negotiation.deal_or_no_deal import (
    generate_context,
    parse_claim,
    sample_context,
    valid_context,
    valid_contexts,
)

# sha256 (first 16 hex digits) of the baselines' transcripts over seeds 0-19, computed with
# the code of commit fa560eb (before issue 10) and again after it: identical.
V0_TRANSCRIPTS = {
    "negotiation/deal-or-no-deal-v0": "c47a4df34a26af11",
    "negotiation/simple-trade-v0": "1431701eeccc6504",
    "collaboration/referential-v0": "5152a77ab494c8ef",
    "collaboration/hidden-profile-v0": "7f3f3e994cd42a75",
    "negotiation/split-the-pie-v0": "2b8b5f20a45f07d7",
    "tool_use/calc-chain-v0": "5600bdd2260e8466",
}


@pytest.mark.parametrize("scenario_id", sorted(V0_TRANSCRIPTS))
def test_v0_transcripts_are_unchanged(scenario_id: str) -> None:
    digest = hashlib.sha256()
    for seed in range(20):
        digest.update(json.dumps(play_episode(scenario_id, seed=seed), default=str).encode())
    assert digest.hexdigest()[:16] == V0_TRANSCRIPTS[scenario_id]


def test_every_v1_keeps_its_v0_registered() -> None:
    ids = set(registry())
    for scenario_id in ids:
        if scenario_id.endswith("-v1"):
            assert scenario_id[:-1] + "0" in ids


def _totals(draw: object, n: int) -> dict[int, float]:
    rng = np.random.default_rng(0)
    counts = Counter(sum(draw(rng)[0]) for _ in range(n))  # type: ignore[operator]
    return {total: counts[total] / n for total in (5, 6, 7)}


def test_v1_contexts_are_uniform_over_the_5295_valid_contexts() -> None:
    contexts = valid_contexts()
    assert len(contexts) == 5295
    assert len(set(contexts)) == 5295
    assert all(valid_context(*c) for c in contexts)
    totals = _totals(sample_context, 20_000)
    # The published data: 47 / 38 / 15 %; the exact shares over the valid contexts.
    exact = Counter(sum(c[0]) for c in contexts)
    for total in (5, 6, 7):
        assert abs(totals[total] - exact[total] / 5295) < 0.015
    assert abs(totals[5] - 0.47) < 0.02
    assert abs(totals[7] - 0.15) < 0.02


def test_v0_contexts_keep_their_old_distribution() -> None:
    totals = _totals(generate_context, 20_000)
    assert abs(totals[5] - 0.21) < 0.02
    assert abs(totals[7] - 0.43) < 0.02


def test_v1_claims_must_add_up_to_the_counts() -> None:
    counts = (2, 1, 3)
    assert parse_claim("book=2 hat=0 ball=1 / book=0 hat=1 ball=2", counts, complete=True)[0]
    for claim in (
        "book=2 hat=1 ball=3 / book=2 hat=1 ball=3",  # both take everything
        "book=1 hat=0 ball=1 / book=0 hat=0 ball=0",  # items left over
    ):
        take, reason = parse_claim(claim, counts, complete=True)
        assert take is None
        assert reason is not None
        assert parse_claim(claim, counts)[0] is not None  # v0 accepted it


def test_v1_scores_an_incomplete_claim_as_invalid_and_no_deal() -> None:
    env = make("negotiation/deal-or-no-deal-v1")
    env.reset(seed=0)
    speaker = env.acting()[0]
    env.step({a: "<selection>" if a == speaker else "" for a in env.agents})
    counts = env.deal.counts
    everything = "book={} hat={} ball={}".format(*counts)
    nothing = "book=0 hat=0 ball=0"
    _, rewards, _, _, infos = env.step(
        {"player_0": f"{everything} / {everything}", "player_1": f"{nothing} / {everything}"}
    )
    assert "invalid" in infos["player_0"]
    assert not env.deal.agreed
    assert rewards["player_1"] == 0.0


def test_the_deal_negotiator_plays_v1_without_invalid_claims() -> None:
    agreed = 0.0
    for seed in range(30):
        metrics = json.loads(play_episode("negotiation/deal-or-no-deal-v1", seed=seed)[-1][1])
        assert metrics["invalid_moves"] == 0.0
        agreed += metrics["agreed"]
    assert agreed >= 20
