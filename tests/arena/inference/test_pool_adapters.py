"""The pool's side of per-seat adapters: per-policy versions, add_adapter, the stale check.

With the real transformers backend and real (random) peft adapters; what the adapters
compute is tested in test_backends_lora.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from parley.arena.inference.backends.base import Backend
from parley.arena.inference.pool import InferencePool, PoolConfig, PoolError
from parley.protocols.errors import ConfigError
from parley.protocols.messages import GenerateRequest, SamplingParams, WeightUpdate

pytest.importorskip("torch")
from parley.arena.inference.backends.transformers import TransformersBackend

pytestmark = pytest.mark.timeout(120)


def request(backend: Backend, i: int, policy: str) -> GenerateRequest:
    ids = backend.tokenizer.encode_chat([{"role": "user", "content": f"offer {i}"}])
    return GenerateRequest(
        prompt_token_ids=ids, params=SamplingParams(max_tokens=3, seed=i), policy=policy
    )


async def test_default_backend_refuses_adapters_and_the_pool_is_unchanged(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    backend = await TransformersBackend.create(str(tiny_model_dir))
    plain = Backend.add_adapter  # the contract's default, whatever the subclass does
    async with InferencePool({"base": backend}) as pool:
        with pytest.raises(ConfigError, match="cannot serve LoRA adapters"):
            await plain(backend, "alice", str(tmp_path))
        assert Backend.version_of(backend, "alice") == backend.policy_version == 0
        assert Backend.adapters.fget(backend) == {}  # type: ignore[attr-defined]
        with pytest.raises(PoolError) as err:
            await pool.add_adapter("alice", "nobody", str(tmp_path))
        assert err.value.code == "unknown_policy"
        assert pool.policies == {"base": 0}


async def test_adapters_share_the_lane_and_keep_their_own_versions(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from parley.arena.inference.backends.lora import save_random_adapter

    path = str(save_random_adapter(tiny_model_dir, tmp_path / "adapter"))
    backend = await TransformersBackend.create(str(tiny_model_dir))
    async with InferencePool({"base": backend}, PoolConfig(max_wait=0.3)) as pool:
        await pool.add_adapter("alice", "base", path)
        await pool.add_adapter("bob", "alice", path)  # any policy of the backend names it
        with pytest.raises(ConfigError, match="already served"):
            await pool.add_adapter("bob", "base", path)
        with pytest.raises(ConfigError, match="no PEFT adapter"):
            await pool.add_adapter("carol", "base", str(tmp_path / "missing"))
        assert pool.policies == {"base": 0, "alice": 0, "bob": 0}  # carol is not served

        update = WeightUpdate(policy="alice", version=5, path=path)
        assert await pool.update_weights(update) == 5
        assert pool.policies == {"base": 0, "alice": 5, "bob": 0}
        # The stale check compares with the adapter's own version, not the base's.
        with pytest.raises(PoolError) as err:
            await pool.update_weights(WeightUpdate(policy="alice", version=5, path=path))
        assert err.value.code == "stale_weights"
        assert "version 5" in err.value.message
        assert await pool.update_weights(WeightUpdate(policy="bob", version=1, path=path)) == 1

        jobs = [request(backend, i, p) for i, p in enumerate(["alice", "bob", "base"] * 2)]
        results = await asyncio.gather(*(pool.generate(r) for r in jobs))
    assert pool.stats.batches == 1  # the three policies batched together
    assert [r.policy for r in results] == [r.policy for r in jobs]
    assert [r.policy_version for r in results] == [5, 1, 0] * 2
