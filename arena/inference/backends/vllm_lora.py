"""Many LoRA adapters on one vLLM engine: checking, staging and hot-swapping PEFT adapters.

The vLLM backend (:mod:`parley.arena.inference.backends.vllm`) serves one base model and
any number of PEFT LoRA adapters on it with vLLM's multi-LoRA serving: the engine is
started with ``enable_lora=True``, ``max_loras`` (adapters in one batch) and
``max_lora_rank``, and every request of an adapter's policy carries that adapter's
``LoRARequest``, so requests of different adapters and of the plain base run in the same
engine steps. This module holds the adapter side; it imports vLLM only when it talks to
the engine.

Rules (the owner's choices where the contract in issue 17 is silent):

- An adapter is checked here before vLLM sees it: a directory with ``adapter_config.json``
  (``peft_type`` LORA) and ``adapter_model.safetensors``; every ``lora_A`` / ``lora_B``
  tensor must sit on a weight of the base with matching shapes (the base's safetensors
  headers are read; an adapter trained on another base fails here, where vLLM would load
  it and fail in the middle of a batch); its rank must not exceed the engine's
  ``max_lora_rank``; the staged copy's values must be finite and of magnitude at most
  ``weight_limit`` (:mod:`~parley.arena.inference.backends.weight_checks`: vLLM accepted
  an adapter of NaN, whose requests then decoded token 0 with NaN logprobs, and the issue
  saw the base so corrupted). vLLM then checks the target modules and features itself.
  Any failure is a :class:`~parley.protocols.errors.ConfigError` (``add_adapter``) or a
  :class:`~parley.arena.inference.backends.base.BackendError` (``update_weights``), and
  nothing served changes.
- Every adapter version is copied into a staging directory the backend owns (vLLM may
  evict an adapter from its cache and reload it from its path later; a trainer that
  rewrites its checkpoint directory must not change what is served silently).
- A hot swap registers the new version under a NEW ``lora_int_id``, points the policy at
  it, and removes the old id from the engine once no running request uses it: requests
  already running finish on the old adapter and report the old version; every other
  adapter and the base keep serving throughout.
- ``update.tensors`` (or a ``.safetensors`` file) may name a subset of the adapter's
  tensors; the others keep their values. Names and shapes must be the adapter's own.
- At most ``max_loras`` adapters are served (one more is a ConfigError naming the option).
  The engine gets one slot more, so a version being swapped out and its successor can
  run side by side (a second swap waits for the first's old version to drain), and on
  CPU one more again that stays empty: vLLM's CPU LoRA ops (``torch_ops.bgmv_*``) read
  the "no adapter" index -1 of base-model tokens as the LAST slot, so a base request
  batched with adapter requests got the adapter in the last slot applied (measured here:
  with 2 slots and 2 adapters, base requests decoded exactly as one adapter;
  vllm-project/vllm#48421, open). vLLM fills the lowest free slot first and a removed
  adapter's slot is zeroed, so with at most slots - 1 registered the last stays zero.
  (The grouped CPU ops the backend installs, :mod:`~parley.arena.inference.backends.vllm_cpu_lora`,
  skip index -1 themselves; the empty slot also covers an engine without them.)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parley.arena.inference.backends.errors import BackendError
from parley.arena.inference.backends.weight_checks import WEIGHT_LIMIT, check_weight_files
from parley.protocols.errors import ConfigError, require
from parley.protocols.messages import WeightUpdate

__all__ = [
    "AdapterInfo",
    "LoRAAdapters",
    "read_adapter",
    "lora_engine_args",
]

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts (``vllm.config.lora.MaxLoRARanks``)."""

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_log = logging.getLogger(__name__)


def rank_limit(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds adapters of ``rank``."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ConfigError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank {LORA_RANKS[-1]}")


def spare_slots(cpu: bool) -> int:
    """Engine LoRA slots beyond ``max_loras``: one for a swap, and on CPU one kept empty
    (see the module docstring)."""
    return 2 if cpu else 1


def lora_engine_args(max_loras: int, max_lora_rank: int = 0, *, cpu: bool) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` that turn on multi-LoRA serving of ``max_loras`` adapters
    (empty when it is 0). ``max_lora_rank`` 0 means vLLM's default, 16; others are rounded
    up to an allowed value. The engine's slots and its adapter cache (``max_cpu_loras``)
    both hold ``max_loras + spare_slots(cpu)``, so nothing is ever evicted."""
    if max_loras <= 0:
        return {}
    slots = max_loras + spare_slots(cpu)
    return {
        "enable_lora": True,
        "max_loras": slots,
        "max_lora_rank": rank_limit(max_lora_rank or 16),
        "max_cpu_loras": slots,
    }


@dataclass(frozen=True)
class AdapterInfo:
    """What :func:`read_adapter` found in a PEFT adapter directory."""

    path: Path
    rank: int
    """The largest LoRA rank among its tensors."""
    shapes: dict[str, tuple[int, ...]]
    """Tensor name (as ``get_peft_model_state_dict`` names it) -> shape."""


def _header_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, read from a safetensors header (no tensor is loaded)."""
    try:
        with file.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size < 100_000_000:
                raise ValueError(f"header size {size}")
            header = json.loads(f.read(size))
        return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{file} is not a readable safetensors file: {exc}") from exc


def read_adapter(path: str | Path) -> AdapterInfo:
    """Check that ``path`` is a PEFT LoRA adapter directory and read its tensor shapes.

    Raises :class:`ConfigError` saying what is missing or wrong.
    """
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"no adapter directory at {path} (a PEFT save_pretrained directory)")
    config_file, weights = root / CONFIG_FILE, root / WEIGHTS_FILE
    if not config_file.is_file() or not weights.is_file():
        raise ConfigError(
            f"{path} is not a PEFT adapter: it needs {CONFIG_FILE} and {WEIGHTS_FILE} "
            "(what peft's save_pretrained writes)"
        )
    try:
        config = json.loads(config_file.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{config_file} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise ConfigError(f"{config_file}: peft_type must be LORA")
    shapes = _header_shapes(weights)
    ranks = [s[0] for k, s in shapes.items() if ".lora_A." in k and len(s) == 2]
    if not ranks:
        raise ConfigError(f"{weights} holds no lora_A tensors: not a LoRA adapter")
    return AdapterInfo(root, max(ranks), shapes)


def base_shapes(model: str) -> dict[str, tuple[int, ...]] | None:
    """Weight name -> shape of a local Hugging Face checkpoint (from its safetensors
    headers); ``None`` when ``model`` is not a local directory of safetensors (a hub id):
    then only vLLM's own checks apply."""
    root = Path(model)
    files = sorted(root.glob("*.safetensors")) if root.is_dir() else []
    if not files:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        shapes.update(_header_shapes(file))
    return shapes


def check_fits(info: AdapterInfo, base: dict[str, tuple[int, ...]] | None, max_rank: int) -> None:
    """Raise :class:`ConfigError` unless the adapter's rank is at most ``max_rank`` and each
    LoRA pair sits on a weight of ``base`` (``None``: not checked) with matching shapes:
    ``lora_A`` is (r, in_features) and ``lora_B`` (out_features, r) of a weight (out, in)."""
    if info.rank > max_rank:
        raise ConfigError(
            f"adapter {info.path} has rank {info.rank}, above this engine's max_lora_rank "
            f"{max_rank}: start the backend with max_lora_rank={rank_limit(info.rank)}"
        )
    if base is None:
        return
    for name, shape in info.shapes.items():
        for part, dim in ((".lora_A.", 1), (".lora_B.", 0)):
            if part not in name:
                continue
            target = name.removeprefix(_PREFIX).split(part)[0] + ".weight"
            if target not in base:
                raise ConfigError(
                    f"adapter {info.path}: {name} targets {target}, which this base model "
                    "does not have (an adapter of another model?)"
                )
            if len(shape) != 2 or shape[1 - dim] > max_rank or shape[dim] != base[target][dim]:
                raise ConfigError(
                    f"adapter {info.path}: {name} has shape {list(shape)}, which does not "
                    f"fit {target} of shape {list(base[target])} (an adapter of another model?)"
                )


@dataclass
class _Slot:
    """One registered adapter version in the engine."""

    request: Any  # vllm.lora.request.LoRARequest
    version: int
    directory: Path
    info: AdapterInfo
    users: int = 0
    retired: bool = False


@dataclass
class LoRAAdapters:
    """The adapters one vLLM engine serves: name -> current slot, with reference counts
    so a swapped-out version leaves the engine only when its last request ends.

    ``engine`` returns the current engine (it changes when a dead engine is restarted;
    registered adapters need no re-adding then: every request carries its adapter's path
    and vLLM loads what it has not seen). ``max_rank`` is the engine's ``max_lora_rank``
    (0: LoRA is not enabled); ``base`` the base's weight shapes (:func:`base_shapes`).
    """

    engine: Callable[[], Any]
    max_rank: int
    base: dict[str, tuple[int, ...]] | None
    limit: int = 0
    """Most adapters served (the engine's slots less :func:`spare_slots`)."""
    weight_limit: float = WEIGHT_LIMIT
    """The largest magnitude an adapter's tensor may hold."""
    _drained: asyncio.Event = field(default_factory=asyncio.Event)
    _current: dict[str, _Slot] = field(default_factory=dict)
    _slots: dict[int, _Slot] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _root: tempfile.TemporaryDirectory[str] | None = None

    @property
    def versions(self) -> dict[str, int]:
        """Adapter name -> the version serving it now."""
        return {name: slot.version for name, slot in self._current.items()}

    def acquire(self, policy: str) -> tuple[Any, int] | None:
        """The ``LoRARequest`` and version a request of ``policy`` runs with (``None``: not
        an adapter); pair with :meth:`release`."""
        slot = self._current.get(policy)
        if slot is None:
            return None
        slot.users += 1
        return slot.request, slot.version

    async def release(self, lora_request: Any) -> None:
        slot = self._slots.get(lora_request.lora_int_id)
        if slot is None:
            return
        slot.users -= 1
        await self._drop_if_done(slot)

    async def add(self, name: str, path: str) -> None:
        """Serve the adapter at ``path`` under ``name`` (version 0); :class:`ConfigError`
        when it is not a fitting adapter or ``name`` is taken."""
        if not self.max_rank:
            raise ConfigError(
                "this vLLM engine was started without LoRA: create the backend with "
                "max_loras=N (parley serve does so for each --adapter)"
            )
        if name in self._current:
            raise ConfigError(f"adapter {name!r} is served already; send a weight update")
        info = read_adapter(path)
        check_fits(info, self.base, self.max_rank)
        directory = self._stage_dir(name)
        try:
            shutil.copy2(info.path / CONFIG_FILE, directory / CONFIG_FILE)
            shutil.copy2(info.path / WEIGHTS_FILE, directory / WEIGHTS_FILE)
            await self._check_values(name, directory)
            if len(self._current) >= self.limit:
                raise ConfigError(
                    f"this vLLM engine serves at most {self.limit} adapters: create the "
                    f"backend with max_loras={len(self._current) + 1} or more"
                )
            await self._register(name, directory, info, version=0)
        except BackendError as exc:
            shutil.rmtree(directory, ignore_errors=True)
            raise ConfigError(str(exc)) from exc
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise

    async def update(self, update: WeightUpdate) -> None:
        """Swap ``update.policy``'s adapter for the weights in ``update`` (inline tensors, a
        ``.safetensors`` file of them, or a PEFT adapter directory) at ``update.version``."""
        old = self._current[update.policy]
        while len(self._slots) > self.limit:  # a swapped-out version still runs: wait
            self._drained.clear()
            await self._drained.wait()
        directory = self._stage_dir(update.policy)
        try:
            info = _stage_update(update, old, directory, self.base, self.max_rank)
            await self._check_values(update.policy, directory)
            await self._register(update.policy, directory, info, version=update.version)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        old.retired = True
        await self._drop_if_done(old)

    def close(self) -> None:
        if self._root is not None:
            self._root.cleanup()
            self._root = None

    # --- machinery ---------------------------------------------------------------------

    def _stage_dir(self, name: str) -> Path:
        if self._root is None:
            self._root = tempfile.TemporaryDirectory(prefix="parley-lora-")
        return Path(tempfile.mkdtemp(prefix=f"{len(self._slots)}-", dir=self._root.name))

    async def _check_values(self, name: str, directory: Path) -> None:
        """BackendError unless the staged weights are finite and within the limit: the
        staged copy is what vLLM reads, now and whenever it reloads an evicted adapter."""
        await asyncio.to_thread(check_weight_files, [directory / WEIGHTS_FILE],
                                f"adapter {name!r}", limit=self.weight_limit)  # fmt: skip

    async def _register(self, name: str, directory: Path, info: AdapterInfo, version: int) -> None:
        from vllm.lora.request import LoRARequest

        lora = LoRARequest(lora_name=f"{name}@{version}", lora_int_id=next(self._ids),
                           lora_path=str(directory))  # fmt: skip
        try:
            await self.engine().add_lora(lora)
        except Exception as exc:  # vLLM reports a worker's failure as a bare Exception
            raise BackendError(f"vLLM refused adapter {name!r}: {exc}") from exc
        slot = _Slot(lora, version, directory, info)
        self._slots[lora.lora_int_id] = slot
        self._current[name] = slot

    async def _drop_if_done(self, slot: _Slot) -> None:
        if not slot.retired or slot.users > 0 or slot.request.lora_int_id not in self._slots:
            return
        del self._slots[slot.request.lora_int_id]
        self._drained.set()
        try:
            await self.engine().remove_lora(slot.request.lora_int_id)
        except Exception as exc:  # the request that ended must not fail for it: a dead
            # engine forgets its adapters anyway, and a live one evicts unused ones (LRU)
            _log.warning("vLLM could not remove old adapter %s: %s", slot.request.lora_name, exc)
        finally:
            shutil.rmtree(slot.directory, ignore_errors=True)


def _stage_update(
    update: WeightUpdate,
    old: _Slot,
    directory: Path,
    base: dict[str, tuple[int, ...]] | None,
    max_rank: int,
) -> AdapterInfo:
    """Write the adapter version ``update`` describes into ``directory``; check it."""
    if update.path and Path(update.path).is_dir():
        try:
            info = read_adapter(update.path)
            check_fits(info, base, max_rank)
        except ConfigError as exc:
            raise BackendError(str(exc)) from exc
        shutil.copy2(info.path / CONFIG_FILE, directory / CONFIG_FILE)
        shutil.copy2(info.path / WEIGHTS_FILE, directory / WEIGHTS_FILE)
        return AdapterInfo(directory, info.rank, info.shapes)
    st: Any = require("safetensors.numpy", "torch")
    if update.path:
        if not Path(update.path).is_file():
            raise BackendError(f"no adapter directory or .safetensors file at {update.path}")
        new = st.load_file(update.path)
    elif update.tensors:
        new = dict(update.tensors)
    else:
        raise BackendError("weight update carries no tensors: set path or tensors")
    for name, array in new.items():
        if name not in old.info.shapes:
            raise BackendError(
                f"{name!r} is not a tensor of adapter {update.policy!r} (names are those "
                "peft.get_peft_model_state_dict returns)"
            )
        if tuple(array.shape) != old.info.shapes[name]:
            raise BackendError(
                f"{name!r} has shape {list(array.shape)}; adapter {update.policy!r} has "
                f"{list(old.info.shapes[name])}"
            )
    merged = st.load_file(str(old.directory / WEIGHTS_FILE))
    merged.update({k: v.copy() for k, v in new.items()})
    shutil.copy2(old.directory / CONFIG_FILE, directory / CONFIG_FILE)
    st.save_file(merged, str(directory / WEIGHTS_FILE))
    return AdapterInfo(directory, old.info.rank, old.info.shapes)
