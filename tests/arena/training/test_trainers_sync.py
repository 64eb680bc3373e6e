"""Weight sync: the trainer's weights reach the pool in-process and over the bus."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import zmq.asyncio

from parley.arena.inference.backends.transformers import TransformersBackend
from parley.arena.inference.pool import InferencePool
from parley.arena.training.sync import BusSync, InProcessSync
from parley.protocols.bus import Endpoint


def _new_weights(backend: TransformersBackend) -> dict[str, np.ndarray]:
    # Every parameter scaled: a change the served model cannot miss.
    return {k: v.detach().numpy() * 0.5 for k, v in backend.model.named_parameters()}


def _served(backend: TransformersBackend) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in backend.model.named_parameters()}


@pytest.mark.timeout(120)
async def test_in_process_sync_sets_weights_and_version(tiny_model_dir: Path) -> None:
    backend = await TransformersBackend.create(str(tiny_model_dir))
    async with await InferencePool({"p": backend}).start() as pool:
        new = _new_weights(backend)
        await InProcessSync(pool).push("p", 1, new)
        assert backend.policy_version == 1
        for name, value in _served(backend).items():
            np.testing.assert_allclose(value, new[name])


@pytest.mark.timeout(120)
async def test_bus_sync_sends_a_path_the_pool_loads(tiny_model_dir: Path, tmp_path: Path) -> None:
    backend = await TransformersBackend.create(str(tiny_model_dir))
    context = zmq.asyncio.Context()
    pool_endpoint = Endpoint("pool", context=context)
    trainer_endpoint = Endpoint("trainer", context=context)
    try:
        async with await InferencePool({"p": backend}).start() as pool:
            pool.serve(pool_endpoint)
            address = await pool_endpoint.bind("inproc://sync-test")
            await trainer_endpoint.connect(address, timeout=10)
            sync = BusSync(trainer_endpoint, tmp_path / "weights", keep=1)
            for version in (1, 2):
                new = _new_weights(backend)
                await sync.push("p", version, new)
                assert backend.policy_version == version
                for name, value in _served(backend).items():
                    np.testing.assert_allclose(value, new[name])
            assert [p.name for p in (tmp_path / "weights").iterdir()] == ["p-v2.safetensors"]
    finally:
        await trainer_endpoint.close()
        await pool_endpoint.close()
        context.destroy(linger=0)
