"""Advantage estimators on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from parley.arena.training.advantages import BaselineState, SampleKey, compute_advantages

KEYS = [
    SampleKey("a", 0, "p1"),
    SampleKey("a", 0, "p1"),
    SampleKey("b", 0, "p2"),
    SampleKey("b", 1, "p2"),
]
REWARDS = [1.0, 0.0, 3.0, 1.0]


def test_grpo_normalises_within_groups() -> None:
    adv = compute_advantages(REWARDS, KEYS, estimator="grpo", grouping="role")
    # group a: mean 0.5, std 0.5 -> +1, -1; group b: mean 2, std 1 -> +1, -1
    np.testing.assert_allclose(adv, [1, -1, 1, -1], atol=1e-5)


def test_dr_grpo_only_centres() -> None:
    adv = compute_advantages(REWARDS, KEYS, estimator="dr_grpo", grouping="role")
    np.testing.assert_allclose(adv, [0.5, -0.5, 1.0, -1.0])


def test_rloo_uses_the_others_mean() -> None:
    adv = compute_advantages([1.0, 2.0, 6.0], [SampleKey("a")] * 3, estimator="rloo")
    # 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5
    np.testing.assert_allclose(adv, [-3.0, -1.5, 4.5])
    alone = compute_advantages([5.0], [SampleKey("a")], estimator="rloo")
    np.testing.assert_allclose(alone, [0.0])


def test_grouping_by_agent_turn_and_batch() -> None:
    by_turn = compute_advantages(REWARDS, KEYS, estimator="dr_grpo", grouping="agent_turn")
    # (a,0): [1,0] mean .5; (b,0): [3]; (b,1): [1]
    np.testing.assert_allclose(by_turn, [0.5, -0.5, 0.0, 0.0])
    batch = compute_advantages(REWARDS, KEYS, estimator="dr_grpo", grouping="batch")
    np.testing.assert_allclose(batch, np.array(REWARDS) - 1.25)


def test_grouping_by_context_where_it_repeats_else_by_role() -> None:
    # A speaker asked about two targets (contexts 1 and 2), twice each, and a listener
    # whose inputs never repeat.
    keys = [
        SampleKey("speaker", context=(1,)),
        SampleKey("speaker", context=(1,)),
        SampleKey("speaker", context=(2,)),
        SampleKey("speaker", context=(2,)),
        SampleKey("listener", context=(7,)),
        SampleKey("listener", context=(8,)),
        SampleKey("listener", context=(9,)),
    ]
    rewards = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5]
    mixed = compute_advantages(rewards, keys, estimator="dr_grpo", grouping="context_or_role")
    # speaker target 1: mean .5; target 2: both right, nothing to learn; the listener
    # against its role's mean (0.5), not alone in groups of one.
    np.testing.assert_allclose(mixed, [0.5, -0.5, 0.0, 0.0, 0.5, -0.5, 0.0])
    exact = compute_advantages(rewards, keys, estimator="dr_grpo", grouping="context")
    np.testing.assert_allclose(exact, [0.5, -0.5, 0.0, 0.0, 0.0, 0.0, 0.0])
    # Against the role's mean (0.75) the speaker's sure target 2 would be pushed up and
    # target 1's right answer less than its wrong one pushed down.
    role = compute_advantages(rewards, keys, estimator="dr_grpo", grouping="role")
    np.testing.assert_allclose(role[:4], [0.25, -0.75, 0.25, 0.25])


def test_reinforce_role_ema_baseline_decays_095() -> None:
    state = BaselineState(decay=0.95)
    keys = [SampleKey("x"), SampleKey("y")]
    first = compute_advantages([1.0, 0.0], keys, estimator="reinforce", state=state)
    # A group seen for the first time, alone in the batch: baselined by the others' mean,
    # never by itself (it had been: every such advantage was 0).
    np.testing.assert_allclose(first, [1.0, -1.0])
    assert state.values == {"x": 1.0, "y": 0.0}
    second = compute_advantages([0.0, 1.0], keys, estimator="reinforce", state=state)
    np.testing.assert_allclose(second, [-1.0, 1.0])  # scored against the old baselines
    assert state.values["x"] == pytest.approx(0.95 * 1.0 + 0.05 * 0.0)
    assert state.values["y"] == pytest.approx(0.95 * 0.0 + 0.05 * 1.0)


def test_unknown_names_are_refused() -> None:
    with pytest.raises(KeyError, match="estimator"):
        compute_advantages([1.0], [SampleKey("a")], estimator="ppo")
    with pytest.raises(KeyError, match="grouping"):
        compute_advantages([1.0], [SampleKey("a")], grouping="moon")


def test_reinforce_never_baselines_a_sample_by_itself_and_forgets_old_groups() -> None:
    """Found by review: grouping by prompt makes new groups every batch; each was baselined
    by its own reward (every advantage 0: nothing learned) and kept forever (2.5 GB after
    200 updates with 512-token contexts)."""
    rng = np.random.default_rng(0)
    state = BaselineState(max_groups=100)
    for update in range(50):
        keys = [SampleKey("a", prompt=f"{update}:{i}") for i in range(16)]
        rewards = (rng.random(16) < 0.5).astype(float)
        adv = compute_advantages(
            rewards, keys, estimator="reinforce", grouping="prompt", state=state
        )
        assert np.abs(adv).max() > 0.1
        assert len(state.values) <= 100
    assert state.overall == pytest.approx(0.5, abs=0.2)
    # Two samples of a new group: each is baselined by the other.
    keys = [SampleKey("a", prompt="new")] * 2
    adv = compute_advantages(
        [1.0, 0.0], keys, estimator="reinforce", grouping="prompt", state=state
    )
    np.testing.assert_allclose(adv, [1.0, -1.0])
