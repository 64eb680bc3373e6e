"""Who may change a served policy's weights: ``parley serve --curve-key --client-key
--weights-key`` lets its clients generate and only the ``--weights-key`` trainers push
weights (before, any admitted client, a seated third-party agent included, could swap the
weights every agent samples from or bump the version the trainer checks staleness by)."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.arena.cli.serve import ServeOptions, serving
from parley.protocols.bus import BusConfig, Endpoint
from parley.protocols.errors import ConfigError, RemoteError
from parley.protocols.keys import load_public_key, load_secret_key, make_key_pair
from parley.protocols.messages import (
    GenerateRequest,
    GenerateResult,
    Ok,
    SamplingParams,
    WeightUpdate,
)

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(120)

REQUEST = GenerateRequest(policy="p", prompt="hi", params=SamplingParams(max_tokens=2))


def _client(keys: Path, name: str) -> Endpoint:
    public, secret = load_secret_key(keys / f"{name}.key_secret")
    config = BusConfig(curve_public_key=public, curve_secret_key=secret,
                       curve_server_key=load_public_key(keys / "pool.key"))  # fmt: skip
    return Endpoint(name, config=config)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("keys")
    for name in ("pool", "agent", "trainer"):
        make_key_pair(folder, name)
    return folder


def _options(model: Path, keys: Path, *weights: str) -> ServeOptions:
    return ServeOptions(
        model=str(model), listen="tcp://127.0.0.1:0", policy="p",
        curve_key=str(keys / "pool.key_secret"),
        client_keys=(str(keys / "agent.key"),),
        weights_keys=tuple(str(keys / f"{name}.key") for name in weights),
    )  # fmt: skip


async def test_only_a_weights_key_changes_weights(tiny_model_dir: Path, keys: Path) -> None:
    async with serving(_options(tiny_model_dir, keys, "trainer")) as (address, _, pool):
        agent, trainer = _client(keys, "agent"), _client(keys, "trainer")
        try:
            await agent.connect(address, timeout=30)
            await trainer.connect(address, timeout=30)
            generated = await agent.request("pool", REQUEST, timeout=60)
            update = WeightUpdate(policy="p", version=5, path=str(tiny_model_dir))
            with pytest.raises(RemoteError) as refused:
                await agent.request("pool", update, timeout=60)
            assert pool.policies == {"p": 0}
            pushed = await trainer.request("pool", update, timeout=60)
            after = await agent.request("pool", REQUEST, timeout=60)
        finally:
            await agent.close()
            await trainer.close()
    assert isinstance(generated, GenerateResult)
    assert generated.policy_version == 0
    assert refused.value.code == "forbidden"
    assert "agent may generate but not change weights" in str(refused.value)
    assert isinstance(pushed, Ok)
    assert isinstance(after, GenerateResult)
    assert after.policy_version == 5


async def test_a_curve_pool_without_weights_keys_takes_no_weights(
    tiny_model_dir: Path, keys: Path
) -> None:
    async with serving(_options(tiny_model_dir, keys)) as (address, _, pool):
        agent = _client(keys, "agent")
        try:
            await agent.connect(address, timeout=30)
            update = WeightUpdate(policy="p", version=5, path=str(tiny_model_dir))
            with pytest.raises(RemoteError) as refused:
                await agent.request("pool", update, timeout=60)
            generated = await agent.request("pool", REQUEST, timeout=60)
        finally:
            await agent.close()
        assert pool.policies == {"p": 0}
    assert refused.value.code == "unexpected_kind"
    assert isinstance(generated, GenerateResult)


def test_weights_keys_need_curve(tiny_model_dir: Path, keys: Path) -> None:
    options = ServeOptions(model=str(tiny_model_dir), weights_keys=(str(keys / "trainer.key"),))
    with pytest.raises(ConfigError, match="need --curve-key"):
        options.bus_security()
