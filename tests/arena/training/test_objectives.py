"""The published objectives against losses and gradients computed by hand.

Two sequences, right-aligned into T = 3 (the first has 2 tokens, the second 3), with
token ratios pi/pi_old != 1 chosen so that each clip side is active somewhere:

    sequence 0, A = +1: ratios 1.25, 1.1        (1.25 > 1 + 0.2: clipped for GRPO; under
                                                  DAPO's eps_high = 0.28 it is not)
    sequence 1, A = -2: ratios 0.5, 1.0, 1.3    (0.5 < 1 - 0.2: clipped; 1.3 with A < 0:
                                                  the unclipped side is the minimum)

Per token, l = -min(r A, clip(r) A); its derivative with respect to log pi is -r A where
the unclipped side is the minimum, and 0 where the clipped side is.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from parley.arena.training.objectives import (  # noqa: E402
    OBJECTIVES,
    LossInputs,
    LossSettings,
    clipped_tokens,
)
from parley.arena.training.pg import PGConfig  # noqa: E402
from parley.protocols.errors import ConfigError  # noqa: E402

OLD = [[0.0, -1.0, -0.5], [-0.3, -0.7, -0.2]]  # log pi_old; [0][0] is padding
RATIOS = [[1.0, 1.25, 1.1], [0.5, 1.0, 1.3]]
VALID = [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
ADV = [1.0, -2.0]


def _inputs(kl: float = 0.0) -> LossInputs:
    logp = torch.tensor(
        [
            [o + math.log(r) if v else 0.0 for o, r, v in zip(*row, strict=True)]
            for row in zip(OLD, RATIOS, VALID, strict=True)
        ],
        dtype=torch.float64,
        requires_grad=True,
    )
    valid = torch.tensor(VALID, dtype=torch.float64)
    return LossInputs(
        logp=logp,
        old=torch.tensor(OLD, dtype=torch.float64) * valid,
        valid=valid,
        adv=torch.tensor(ADV, dtype=torch.float64),
        kl=kl * valid,
        sequences=2,
        tokens=5,
    )


def _loss_and_grad(
    name: str, settings: LossSettings, kl: float = 0.0
) -> tuple[float, list[list[float]]]:
    x = _inputs(kl)
    loss = OBJECTIVES[name].loss(x, settings)
    loss.backward()
    return float(loss.detach()), x.logp.grad.tolist()


def _close(got: list[list[float]], want: list[list[float]]) -> None:
    for g_row, w_row in zip(got, want, strict=True):
        assert g_row == pytest.approx(w_row, abs=1e-12)


def test_grpo_is_the_clipped_surrogate_token_mean_per_sequence_then_mean() -> None:
    loss, grad = _loss_and_grad("grpo", LossSettings(clip_low=0.2, clip_high=0.2))
    # sequence 0: l = -min(1.25, 1.2) = -1.2 (clipped), -1.1  -> mean -1.15
    # sequence 1: l = 1.6 (clipped: -min(-1.0, -1.6)), 2.0, 2.6 -> mean 6.2 / 3
    assert loss == pytest.approx((-1.15 + 6.2 / 3) / 2, abs=1e-12)
    # d/dlogp: -r A / |o_i| / n_sequences, 0 where clipped
    _close(grad, [[0.0, 0.0, -1.1 / 2 / 2], [0.0, 2.0 / 3 / 2, 2.6 / 3 / 2]])


def test_dapo_is_token_level_with_clip_higher() -> None:
    settings = PGConfig(objective="dapo").loss_settings()
    assert (settings.clip_low, settings.clip_high) == (0.2, 0.28)
    loss, grad = _loss_and_grad("dapo", settings)
    # 1.25 < 1.28: no longer clipped; every token weighs 1/5 whatever its sequence
    assert loss == pytest.approx((-1.25 - 1.1 + 1.6 + 2.0 + 2.6) / 5, abs=1e-12)
    _close(grad, [[0.0, -1.25 / 5, -1.1 / 5], [0.0, 2.0 / 5, 2.6 / 5]])


def test_dr_grpo_sums_tokens_over_a_constant_length() -> None:
    loss, grad = _loss_and_grad("dr_grpo", LossSettings(length_norm=4))
    assert loss == pytest.approx((-1.2 - 1.1 + 1.6 + 2.0 + 2.6) / (2 * 4), abs=1e-12)
    _close(grad, [[0.0, 0.0, -1.1 / 8], [0.0, 2.0 / 8, 2.6 / 8]])
    assert PGConfig(objective="dr_grpo").advantage_estimator == "dr_grpo"  # no std


@pytest.mark.parametrize("name", ["rloo", "reinforce"])
def test_rloo_and_reinforce_are_sequence_reinforce_with_truncated_weights(name: str) -> None:
    loss, grad = _loss_and_grad(name, LossSettings(is_cap=2.0))
    w0, w1 = 1.25 * 1.1, 0.5 * 1.0 * 1.3  # sequence ratios, both under the cap
    sum0 = (-1.0 + math.log(1.25)) + (-0.5 + math.log(1.1))
    sum1 = (-0.3 + math.log(0.5)) + (-0.7 + math.log(1.0)) + (-0.2 + math.log(1.3))
    assert loss == pytest.approx((-w0 * 1.0 * sum0 - w1 * -2.0 * sum1) / 2, abs=1e-12)
    # -w A per token of the sequence, over the 2 sequences (w is not differentiated)
    _close(grad, [[0.0, -w0 / 2, -w0 / 2], [w1 * 2 / 2] * 3])
    capped, capped_grad = _loss_and_grad(name, LossSettings(is_cap=1.2))
    _close(capped_grad, [[0.0, -1.2 / 2, -1.2 / 2], [w1 * 2 / 2] * 3])  # 1.375 -> 1.2
    assert capped != loss


def test_the_kl_penalty_follows_each_objectives_aggregation() -> None:
    base = {name: _loss_and_grad(name, LossSettings(length_norm=4))[0] for name in OBJECTIVES}
    with_kl = {
        name: _loss_and_grad(name, LossSettings(length_norm=4), kl=0.1)[0] for name in OBJECTIVES
    }
    added = {name: with_kl[name] - base[name] for name in OBJECTIVES}
    assert added["grpo"] == pytest.approx(0.1)  # mean of per-sequence means
    assert added["dapo"] == pytest.approx(0.1)  # mean over tokens
    assert added["dr_grpo"] == pytest.approx(0.1 * 5 / 8)  # 5 tokens / (2 sequences * 4)
    assert added["rloo"] == pytest.approx((0.2 + 0.3) / 2)  # per-sequence sums, then mean


def test_clipped_tokens_counts_the_active_clips() -> None:
    assert clipped_tokens(_inputs(), LossSettings(clip_low=0.2, clip_high=0.2)) == 2
    assert clipped_tokens(_inputs(), LossSettings(clip_low=0.2, clip_high=0.28)) == 1


def test_micro_batches_add_up_to_the_minibatch_loss() -> None:
    """Gradient accumulation is exact: each half, scaled by the whole's size, sums to it."""
    for name in OBJECTIVES:
        settings = LossSettings(length_norm=4)
        whole = float(OBJECTIVES[name].loss(_inputs(), settings).detach())
        x = _inputs()
        parts = 0.0
        for rows in ([0], [1]):
            part = LossInputs(
                logp=x.logp[rows],
                old=x.old[rows],
                valid=x.valid[rows],
                adv=x.adv[rows],
                kl=x.kl[rows],
                sequences=2,
                tokens=5,
            )
            parts += float(OBJECTIVES[name].loss(part, settings).detach())
        assert parts == pytest.approx(whole, abs=1e-12), name


def test_config_names_and_errors() -> None:
    assert PGConfig().objective == "grpo"
    assert PGConfig().advantage_estimator == "grpo"
    # pg.estimator (the advantage estimator) keeps its name and meaning.
    assert PGConfig(estimator="reinforce").advantage_estimator == "reinforce"
    assert PGConfig(objective="rloo").advantage_estimator == "rloo"
    with pytest.raises(ConfigError, match=r"objective 'ppo'.*dapo"):
        PGConfig(objective="ppo")
    with pytest.raises(ConfigError, match=r"pg\.objective"):
        PGConfig(estimator="dapo")
    with pytest.raises(ConfigError, match="epochs"):
        PGConfig(epochs=0)
