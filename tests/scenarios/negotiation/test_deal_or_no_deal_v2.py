"""deal-or-no-deal-v2: ``moves="proposals"`` (offered proposals, the ``deal`` claim, short
prompts); with the default ``moves="text"`` it plays exactly as v1."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from parley.agents.scripted.negotiation import DealNegotiator
from parley.scenarios import make
from parley.scenarios.conformance import play_episode
from parley.scenarios.negotiation.deal_or_no_deal import (
    DEAL,
    SELECTION,
    claim_text,
    divisions,
    parse_claim,
    proposal_text,
)

V1, V2 = "negotiation/deal-or-no-deal-v1", "negotiation/deal-or-no-deal-v2"
PROPOSALS = {"moves": "proposals", "max_turns": 6}


def _digest(scenario_id: str) -> str:
    digest = hashlib.sha256()
    for seed in range(10):
        digest.update(json.dumps(play_episode(scenario_id, seed=seed), default=str).encode())
    return digest.hexdigest()


def test_v2_with_its_defaults_plays_exactly_as_v1() -> None:
    assert _digest(V1) == _digest(V2)


def test_bad_moves_argument_is_refused() -> None:
    with pytest.raises(ValueError, match="moves"):
        make(V2, moves="telepathy")
    with pytest.raises(TypeError):
        make(V1, moves="proposals")


def test_offered_moves_are_every_proposal_and_every_complete_claim() -> None:
    env = make(V2, **PROPOSALS)
    obs, infos = env.reset(seed=3)
    speaker = env.deal.speaker
    counts = env.deal.counts
    assert obs[speaker].startswith("Items: book ")
    choices = infos[speaker]["constraint"]["choices"]
    assert choices[-1] == SELECTION
    assert choices[:-1] == [proposal_text(t) for t in divisions(counts)]
    obs, _, _, _, infos = env.step({speaker: SELECTION})
    for seat in env.possible_agents:
        claims = infos[seat]["constraint"]["choices"]
        assert claims[0] == DEAL
        assert claims[-1] == "no agreement"
        for claim in claims[1:-1]:
            take, reason = parse_claim(claim, counts, complete=True)
            assert reason is None
            assert take is not None


def test_deal_claims_the_last_proposal_from_either_side() -> None:
    env = make(V2, **PROPOSALS)
    env.reset(seed=5)
    first = env.deal.speaker
    other = env.partner(first)
    counts = env.deal.counts
    take = tuple(min(c, 1) for c in counts)
    env.step({first: proposal_text(take)})
    env.step({other: SELECTION})
    _, rewards, terms, _, _ = env.step({first: DEAL, other: DEAL})
    assert all(terms.values())
    assert env.deal.agreed
    rest = tuple(c - t for c, t in zip(counts, take, strict=True))
    assert env.deal.claims[first] == take
    assert env.deal.claims[other] == rest
    assert rewards[first] == sum(t * v for t, v in zip(take, env.deal.values[first], strict=True))


def test_deal_with_nothing_on_the_table_is_an_invalid_no_agreement() -> None:
    env = make(V2, **PROPOSALS)
    env.reset(seed=2)
    env.step({env.deal.speaker: SELECTION})
    _, rewards, _, _, infos = env.step(dict.fromkeys(env.possible_agents, DEAL))
    assert not env.deal.agreed
    assert all("no proposal" in infos[s]["invalid"] for s in env.possible_agents)
    assert all(r == -0.5 for r in rewards.values())


def test_a_proposal_beyond_the_counts_is_not_on_the_table() -> None:
    env = make(V2, **PROPOSALS)
    env.reset(seed=2)
    first, counts = env.deal.speaker, env.deal.counts
    env.step({first: "propose: book=1 hat=0 ball=0"})
    env.step({env.partner(first): "propose: book=9 hat=9 ball=9"})
    assert env.last_proposal(first) == (1, 0, 0)
    assert env.last_proposal(env.partner(first)) == (counts[0] - 1, counts[1], counts[2])


def test_hostile_moves_never_crash_and_episodes_end() -> None:
    rng = np.random.default_rng(0)
    junk = ["", "deal", "DEAL", "\x00", "propose: book=-1 hat=0 ball=0", "x" * 5000, SELECTION]
    for seed in range(30):
        env = make(V2, **PROPOSALS)
        env.reset(seed=seed)
        for _ in range(20):
            if not env.agents:
                break
            env.step({seat: junk[int(rng.integers(len(junk)))] for seat in env.agents})
        assert not env.agents, "an episode of junk moves must end within max_turns + 1 steps"


def test_scripted_pair_agrees_and_a_deal_claimer_agrees_with_it() -> None:
    """The scripted partner's deals are claimable by ``deal``: a seat that accepts its first
    proposal and claims ``deal`` always agrees."""

    class Acceptor(DealNegotiator):
        def decide(self, observation):  # type: ignore[no-untyped-def]
            view = observation.info.get("view", {})
            if view.get("phase") == "choose":
                return DEAL
            return SELECTION if view.get("last_message") else proposal_text((0, 0, 0))

    agreed = []
    for seed in range(40):
        env = make(V2, **PROPOSALS)
        agents = {"player_0": Acceptor(), "player_1": DealNegotiator()}
        play_episode(V2, seed=seed, env=env, agents=agents)  # type: ignore[arg-type]
        agreed.append(env.episode_metrics()["agreed"])
    assert np.mean(agreed) == 1.0
    assert claim_text((1, 0, 0), (2, 1, 1)) == "book=1 hat=0 ball=0 / book=1 hat=1 ball=1"
