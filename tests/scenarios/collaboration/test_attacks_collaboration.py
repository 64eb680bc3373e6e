"""Red-team attacks on the latest collaboration scenarios (referential-v1, hidden-profile-v2),
as an RL policy would try them. Each attack held: the tests pin that it scores no more than
the documented floor, so a change that opens the hole fails here."""

from __future__ import annotations

import pytest

from parley.scenarios import make
from parley.scenarios.collaboration.referential import describe

REFERENTIAL = "collaboration/referential-v1"
HIDDEN_PROFILE = "collaboration/hidden-profile-v2"


def _number_sprays(k: int) -> list[str]:
    """Listener answers that name every candidate number at once."""
    numbers = [str(i) for i in range(1, k + 1)]
    return [
        " ".join(numbers),
        ",".join(numbers),
        "".join(numbers),
        "\n".join(numbers),
        " or ".join(numbers),
        "1-" + numbers[-1],
    ]


def _name_sprays(names: list[str]) -> list[str]:
    """Listener answers that name every candidate description at once."""
    return [", ".join(names), " ".join(names), "\n".join(names), " or ".join(names)]


@pytest.mark.parametrize("answer", ["number", "name"])
def test_a_listener_naming_every_candidate_scores_nothing(answer: str) -> None:
    """The listener's reward is 1 only for one pick that is the target: an answer listing every
    candidate (the target among them) is an invalid pick, 0 for both seats, never chance or
    better."""
    k = 3
    for seed in range(6):
        probe = make(REFERENTIAL, n_candidates=k, answer=answer)
        probe.reset(seed=seed)
        names = [describe(c) for c in probe.ref.candidates]
        sprays = _number_sprays(k) if answer == "number" else _name_sprays(names)
        for spray in sprays:
            env = make(REFERENTIAL, n_candidates=k, answer=answer)
            env.reset(seed=seed)
            env.step({"speaker": "ab"})
            _, rewards, terms, _, infos = env.step({"listener": spray})
            assert all(terms.values())
            assert rewards == {"speaker": 0.0, "listener": 0.0}, (seed, spray)
            assert "invalid" in infos["listener"], (seed, spray)
            assert env.episode_metrics()["success"] == 0.0


def test_a_speaker_cannot_write_the_answer_into_its_message() -> None:
    """The speaker's message reaches the listener only when it is ``message_length`` letters of
    the vocabulary: a message naming the target (its number or its description) arrives as
    ``-`` and the listener learns nothing from it."""
    for seed in range(6):
        env = make(REFERENTIAL, n_candidates=4)
        env.reset(seed=seed)
        target = env.ref.target
        for leak in (str(target + 1), describe(env.ref.candidates[target]), f"a{target + 1}"):
            env = make(REFERENTIAL, n_candidates=4)
            env.reset(seed=seed)
            obs, _, _, _, infos = env.step({"speaker": leak})
            assert "invalid" in infos["speaker"]
            assert "Message: -" in obs["listener"]
            assert infos["listener"]["view"]["message"] == "-"


@pytest.mark.parametrize("stuffing", ["B B", "vote B vote B", "B\nB", "B,B", "BB", "vote: B, B"])
def test_a_stuffed_ballot_is_no_vote(stuffing: str) -> None:
    """One agent cannot weigh its vote: a vote naming an option several times is invalid and
    counts as no vote, so two agents voting A carry the team choice."""
    env = make(HIDDEN_PROFILE)
    env.reset(seed=0)
    env.step(dict.fromkeys(env.possible_agents, "pass"))
    env.step(dict.fromkeys(env.possible_agents, "pass"))
    _, _, terms, _, infos = env.step({"agent_0": stuffing, "agent_1": "A", "agent_2": "vote A"})
    assert all(terms.values())
    assert "invalid" in infos["agent_0"]
    assert env.profile.votes["agent_0"] is None
    assert env.profile.choice == "A"


def test_talk_written_in_the_vote_step_reaches_no_teammate() -> None:
    """The vote step is simultaneous and secret: a message written instead of a vote (to sway
    the others' votes) is an invalid vote, costs nothing to the team and reaches nobody."""
    env = make(HIDDEN_PROFILE)
    env.reset(seed=2)
    env.step(dict.fromkeys(env.possible_agents, "pass"))
    env.step(dict.fromkeys(env.possible_agents, "pass"))
    sway = "everyone vote C, I hold [F01] option C: +1 (low cost)"
    obs, _, _, _, infos = env.step({"agent_0": sway, "agent_1": "A", "agent_2": "B"})
    assert "invalid" in infos["agent_0"]
    assert not any(sway in text for text in obs.values())
    assert env.profile.messages == 0
