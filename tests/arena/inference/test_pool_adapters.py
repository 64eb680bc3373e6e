"""The pool's side of per-seat adapters: per-policy versions, add_adapter, the stale check.

These tests pin the pool's contract with a backend whose adapters only carry versions
(:class:`VersionedBackend`: the real transformers backend plus per-name versions), so they
hold for any backend implementing the Backend adapter API; the transformers backend's real
LoRA serving is tested in test_backends_lora.py.
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


class VersionedBackend(TransformersBackend):
    """Serves every adapter name with the base weights, but keeps a version per adapter."""

    supports_adapters = True

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._versions: dict[str, int] = {}
        self.seen_policies: list[list[str]] = []

    @property
    def adapters(self) -> dict[str, int]:
        return dict(self._versions)

    async def add_adapter(self, policy: str, path: str) -> None:
        if not await asyncio.to_thread(Path(path).is_dir):
            raise ConfigError(f"no adapter directory at {path}")
        self._versions[policy] = 0

    async def update_weights(self, update: WeightUpdate) -> None:
        if update.policy in self._versions:
            self._versions[update.policy] = update.version
        else:
            await super().update_weights(update)

    async def generate(self, requests, **kwargs):  # type: ignore[no-untyped-def,override]
        self.seen_policies.append([r.policy for r in requests])
        return await super().generate(requests, **kwargs)


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
    backend = await VersionedBackend.create(str(tiny_model_dir))
    async with InferencePool({"base": backend}, PoolConfig(max_wait=0.3)) as pool:
        await pool.add_adapter("alice", "base", str(tmp_path))
        await pool.add_adapter("bob", "base", str(tmp_path))
        with pytest.raises(ConfigError, match="already served"):
            await pool.add_adapter("bob", "base", str(tmp_path))
        with pytest.raises(ConfigError, match="no adapter directory"):
            await pool.add_adapter("carol", "base", str(tmp_path / "missing"))
        assert pool.policies == {"base": 0, "alice": 0, "bob": 0}  # carol is not served

        assert await pool.update_weights(WeightUpdate(policy="alice", version=5)) == 5
        assert pool.policies == {"base": 0, "alice": 5, "bob": 0}
        # The stale check compares with the adapter's own version, not the base's.
        with pytest.raises(PoolError) as err:
            await pool.update_weights(WeightUpdate(policy="alice", version=5))
        assert err.value.code == "stale_weights"
        assert "version 5" in err.value.message
        assert await pool.update_weights(WeightUpdate(policy="bob", version=1)) == 1

        jobs = [request(backend, i, p) for i, p in enumerate(["alice", "bob", "base"] * 2)]
        results = await asyncio.gather(*(pool.generate(r) for r in jobs))
    assert pool.stats.batches == 1  # the three policies batched together
    assert sorted(backend.seen_policies[-1]) == sorted(r.policy for r in jobs)
    assert [r.policy for r in results] == [r.policy for r in jobs]
