"""Weight sync: after each update the pool serves the new weights, with a new version.

Two ways, one method (:meth:`WeightSync.push`):

- :class:`InProcessSync` — the pool lives in the trainer's process: the tensors go to
  :meth:`parley.arena.inference.pool.InferencePool.update_weights` as numpy arrays (no copy to disk,
  no encoding); the pool applies them between batches and sets the policy version.
- :class:`BusSync` — the pool is another process (``parley serve``): the weights are saved
  as safetensors under ``directory`` and a :class:`~parley.protocols.messages.WeightUpdate`
  carrying the path is sent to the pool's bus endpoint, which loads it. Only the newest
  ``keep`` files are kept.

With LoRA (``TrainConfig.lora``) the tensors are one policy's adapter alone, named as
``peft.get_peft_model_state_dict`` names them
(:meth:`~parley.arena.training.adapters.AdapterWeights.state_tensors`): the pool's backend
replaces that adapter only and bumps only that policy's version.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from parley.protocols.errors import require
from parley.protocols.messages import Error, WeightUpdate

__all__ = ["BusSync", "InProcessSync", "WeightSync", "WeightSyncError"]


class WeightSyncError(RuntimeError):
    """The pool refused or failed a weight update; the message says which and why."""


class WeightSync(ABC):
    """Publishes a policy's weights to wherever the agents generate."""

    @abstractmethod
    async def push(self, policy: str, version: int, tensors: dict[str, np.ndarray]) -> None:
        """Make ``policy`` serve ``tensors`` as ``version`` (newer than the served one)."""


class InProcessSync(WeightSync):
    """Updates an in-process :class:`~parley.arena.inference.pool.InferencePool`."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    async def push(self, policy: str, version: int, tensors: dict[str, np.ndarray]) -> None:
        await self.pool.update_weights(
            WeightUpdate(policy=policy, version=version, tensors=tensors)
        )


class BusSync(WeightSync):
    """Sends weight updates by path to the pool's bus endpoint (another process or host).

    ``endpoint`` is a connected :class:`~parley.protocols.bus.Endpoint`; ``peer`` the pool's
    endpoint name; ``directory`` must be readable by the pool (same host or shared disk).
    """

    def __init__(
        self,
        endpoint: Any,
        directory: str | Path,
        *,
        peer: str = "pool",
        keep: int = 2,
        timeout: float = 120.0,
    ) -> None:
        self.endpoint = endpoint
        self.directory = Path(directory)
        self.peer = peer
        self.keep = max(keep, 1)
        self.timeout = timeout
        self._written: list[Path] = []

    async def push(self, policy: str, version: int, tensors: dict[str, np.ndarray]) -> None:
        safetensors: Any = require("safetensors.numpy", "train")
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{policy}-v{version}.safetensors"
        safetensors.save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))
        update = WeightUpdate(policy=policy, version=version, path=str(path))
        reply = await self.endpoint.request(self.peer, update, timeout=self.timeout)
        if isinstance(reply, Error):
            raise WeightSyncError(f"pool refused weights v{version} of {policy!r}: {reply.message}")
        self._written.append(path)
        while len(self._written) > self.keep:
            self._written.pop(0).unlink(missing_ok=True)
