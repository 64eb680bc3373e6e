"""Per-seat LoRA adapters on one base model, for the transformers backend (``peft``).

:class:`LoraAdapters` keeps the adapters a :class:`TransformersBackend
<parley.arena.inference.backends.transformers.TransformersBackend>` serves: one ``peft`` LoRA
adapter per policy on one shared base, so requests of different policies decode in ONE
forward pass per step. How:

- The base model is wrapped in a ``peft.PeftModel`` when the first adapter is added (peft
  replaces each targeted linear layer, in place, by a LoRA layer around it: the backend's
  model is modified, so hand the backend a copy of a model something else trains).
- Every LoRA layer is kept with NO active adapter, so a forward pass without row names is
  exactly the base model. Before each forward the backend sets :attr:`LoraAdapters.rows`
  (one adapter key per batch row, ``"__base__"`` for the base); a forward pre-hook on each
  LoRA layer hands them to peft's mixed-batch path (``adapter_names=[...]``), which adds
  each row's own ``B·A·x·scale``. One hook call per layer per step; no per-step walk of
  the module tree (``PeftModel.forward(adapter_names=...)`` registers and removes a hook
  on every layer at every call).
- peft names adapters internally; policy names can be anything (dots, ``"__base__"``), so
  each adapter gets an internal key ``parley<N>``.

Adapter format (the contract of issue 17): a directory as ``save_pretrained`` writes it
(``adapter_config.json`` + ``adapter_model.safetensors``; pickled ``.bin`` weights are
refused); update tensors named as ``peft.get_peft_model_state_dict(model, adapter_name=...)``
names them (no adapter name in the keys). Every load and update is checked in full BEFORE
anything changes (config: plain LoRA, rank within ``max_rank``, target modules present;
tensors: exactly the adapter's names, their shapes, finite values), so a bad adapter or
update leaves every served adapter exactly as it was and says what is wrong.

Not supported (refused with a :class:`~parley.protocols.errors.ConfigError`): DoRA (peft's
mixed batches cannot run it), ``modules_to_save``, ``target_parameters``, aLoRA.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from parley.arena.inference.backends.errors import BackendError
from parley.protocols.errors import ConfigError, require
from parley.protocols.messages import WeightUpdate

torch: Any = require("torch", "torch")

__all__ = ["LoraAdapters", "BASE_ROW", "save_random_adapter"]

BASE_ROW = "__base__"
"""peft's row name for "no adapter" in a mixed batch."""

_UNSUPPORTED = ("use_dora", "modules_to_save", "target_parameters", "alora_invocation_tokens")


class LoraAdapters:
    """The LoRA adapters served on ``base`` (a Hugging Face causal LM), by policy name.

    Methods that touch tensors block (call them on the backend's torch thread, under its
    lock). ``versions`` maps policy -> weights version; the backend sets it.
    """

    def __init__(self, base: Any, *, max_rank: int = 64) -> None:
        self.base = base
        self.max_rank = max_rank
        self.peft: Any = None  # the peft.PeftModel around base, once an adapter exists
        self.versions: dict[str, int] = {}
        self.keys: dict[str, str] = {}  # policy -> peft adapter name
        self.rows: list[str] | None = None  # per-row peft names for the next forward
        self._hooked: set[int] = set()
        self._count = 0

    def row_names(self, policies: list[str]) -> list[str] | None:
        """peft names for batch rows of ``policies`` (None: every row is the base)."""
        names = [self.keys.get(p, BASE_ROW) for p in policies]
        return None if all(n == BASE_ROW for n in names) else names

    # --- loading ------------------------------------------------------------------------

    def add(self, policy: str, path: str) -> None:
        """Load the adapter directory ``path`` and serve it as ``policy`` (blocking)."""
        peft: Any = require("peft", "torch")
        if policy in self.keys:
            raise ConfigError(f"an adapter named {policy!r} is served already")
        config = _read_config(peft, Path(path), self.max_rank)
        tensors = _read_tensors(Path(path) / "adapter_model.safetensors")
        self._count += 1
        key = f"parley{self._count}"
        try:
            if self.peft is None:
                # Wrapping injects the LoRA layers; PeftModel() also leaves the model in
                # training mode, hence the eval().
                self.peft = peft.PeftModel(self.base, config, adapter_name=key).eval()
            else:
                self.peft.add_adapter(key, config)
                self.peft.eval()
        except ValueError as exc:  # peft: no target module matches, bad config values
            raise ConfigError(f"adapter {path} does not fit this base model: {exc}") from exc
        try:
            self._copy(key, tensors, f"adapter {path}", complete=True)
        except BaseException as exc:
            self.peft.delete_adapter(key)
            if isinstance(exc, BackendError):
                raise ConfigError(str(exc)) from exc
            raise
        finally:
            self._deactivate()
        self.keys[policy] = key
        self.versions[policy] = 0

    def update(self, policy: str, update: WeightUpdate) -> None:
        """Replace tensors of adapter ``policy`` (blocking): all it names, or none. An
        update may name a subset of the adapter's tensors (the rest stay)."""
        if update.path:
            path = Path(update.path)
            if path.is_dir():
                served = self.peft.peft_config[self.keys[policy]]
                config = _read_config(require("peft", "torch"), path, self.max_rank)
                for field in ("r", "lora_alpha", "use_rslora", "target_modules"):
                    if getattr(config, field) != getattr(served, field):
                        raise ConfigError(
                            f"adapter {update.path} has {field}={getattr(config, field)!r}, "
                            f"the served adapter {policy!r} {getattr(served, field)!r}; an "
                            "update keeps the adapter's shape: add it as a new adapter instead"
                        )
                path = path / "adapter_model.safetensors"
            tensors = _read_tensors(path)
        else:
            tensors = {k: torch.from_numpy(np.asarray(v)) for k, v in update.tensors.items()}
        self._copy(self.keys[policy], tensors, f"update of adapter {policy!r}", complete=False)

    def load_base(self, state: dict[str, Any]) -> None:
        """Copy full-model tensors (the base's own names, as before any adapter) into the
        base; LoRA tensors are not among them. All names and shapes are checked first."""
        params = dict(self.base.named_parameters())
        params.update(dict(self.base.named_buffers()))
        # peft moved each wrapped layer's weight to `<layer>.base_layer.weight`.
        params = {n.replace(".base_layer.", "."): p for n, p in params.items() if ".lora_" not in n}
        _check(state, {n: tuple(p.shape) for n, p in params.items()}, "weight update")
        with torch.no_grad():
            for name, tensor in state.items():
                params[name].copy_(tensor)

    # --- internals ----------------------------------------------------------------------

    def _copy(self, key: str, tensors: dict[str, Any], what: str, *, complete: bool) -> None:
        peft: Any = require("peft", "torch")
        # get_peft_model_state_dict returns views of the adapter's parameters: copying into
        # them sets the parameters.
        own = peft.get_peft_model_state_dict(self.peft, adapter_name=key)
        _check(tensors, {n: tuple(t.shape) for n, t in own.items()}, what, complete=complete)
        with torch.no_grad():
            for name, tensor in tensors.items():
                own[name].copy_(tensor)

    def _deactivate(self) -> None:
        """No adapter active in any layer (a forward without row names is the base), and
        every LoRA layer hooked to take :attr:`rows`."""
        lora: Any = require("peft.tuners.lora", "torch")
        for module in self.base.modules():
            if isinstance(module, lora.LoraLayer):
                module.set_adapter([], inference_mode=True)
                if id(module) not in self._hooked:
                    module.register_forward_pre_hook(self._hook, with_kwargs=True)
                    self._hooked.add(id(module))

    def _hook(self, module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if self.rows is not None:
            kwargs["adapter_names"] = self.rows
        return args, kwargs


def save_random_adapter(
    model_dir: str | Path,
    out: str | Path,
    *,
    seed: int = 0,
    rank: int = 8,
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    std: float = 0.3,
) -> Path:
    """Write a LoRA adapter with random ``A`` and ``B`` (N(0, std)) for the model in
    ``model_dir`` to ``out`` (``save_pretrained`` format); returns ``out``.

    For tests and benchmarks: adapters whose outputs differ from the base and each other
    (peft's default initialisation, ``B = 0``, would equal the base exactly).
    """
    peft: Any = require("peft", "torch")
    transformers: Any = require("transformers", "torch")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = peft.LoraConfig(r=rank, lora_alpha=rank, target_modules=list(targets))
    wrapped = peft.get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if ".lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
    wrapped.save_pretrained(str(out))
    return Path(out)


def _read_config(peft: Any, path: Path, max_rank: int) -> Any:
    """The LoraConfig of adapter directory ``path``, checked; ConfigError if unusable."""
    file = path / "adapter_config.json"
    if not path.is_dir() or not file.is_file():
        raise ConfigError(
            f"no PEFT adapter at {path}: expected a directory with adapter_config.json and "
            "adapter_model.safetensors (as peft's save_pretrained writes)"
        )
    try:
        raw = json.loads(file.read_text())
        if not isinstance(raw, dict):
            raise TypeError("not a JSON object")
        kind = raw.get("peft_type")
        if kind != "LORA":
            raise ConfigError(f"adapter {path} is a {kind!r} adapter; only LORA is served")
        config = peft.LoraConfig.from_pretrained(str(path))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"adapter {path}: unreadable adapter_config.json: {exc}") from exc
    for field in _UNSUPPORTED:
        if getattr(config, field, None):
            raise ConfigError(f"adapter {path} uses {field}, which parley cannot serve")
    ranks = [config.r, *dict(config.rank_pattern or {}).values()]
    if not all(isinstance(r, int) and 1 <= r <= max_rank for r in ranks):
        raise ConfigError(
            f"adapter {path} has rank {max(ranks, key=lambda r: r if isinstance(r, int) else 0)}"
            f"; this backend serves ranks 1..{max_rank} (raise max_lora_rank)"
        )
    config.inference_mode = True
    return config


def _read_tensors(file: Path) -> dict[str, Any]:
    """The tensors of a .safetensors file; ConfigError if missing or unreadable."""
    safetensors: Any = require("safetensors.torch", "torch")
    if not file.is_file():
        raise ConfigError(
            f"no adapter weights at {file} (only .safetensors is read: pickled weights are refused)"
        )
    try:
        return dict(safetensors.load_file(str(file)))
    except Exception as exc:  # safetensors raises its own error types on bad bytes
        raise ConfigError(f"cannot read adapter weights {file}: {exc}") from exc


def _check(
    tensors: dict[str, Any], shapes: dict[str, tuple[int, ...]], what: str, complete: bool = False
) -> None:
    """Raise (BackendError) unless every tensor is known, of the right shape, and finite;
    with ``complete``, every known name must be given too."""
    if not tensors:
        raise BackendError(f"{what} carries no tensors: set path or tensors")
    for name, tensor in tensors.items():
        if name not in shapes:
            close = [n for n in shapes if n.split(".")[-2:] == name.split(".")[-2:]][:1]
            hint = f" (names look like {close[0]!r})" if close else ""
            raise BackendError(f"{what} names unknown tensor {name!r}{hint}")
        if tuple(tensor.shape) != shapes[name]:
            raise BackendError(
                f"{what}: tensor {name!r} has shape {tuple(tensor.shape)}, the model expects "
                f"{shapes[name]} (made for another base model or rank?)"
            )
        if not bool(torch.isfinite(tensor).all()):
            raise BackendError(f"{what}: tensor {name!r} holds NaN or infinite values")
    if complete and (missing := sorted(set(shapes) - set(tensors))):
        raise BackendError(f"{what} lacks {len(missing)} tensors, e.g. {missing[0]!r}")
