"""Per-seat LoRA adapters on one base model, for the transformers backend (``peft``).

:class:`LoraAdapters` keeps the adapters a :class:`TransformersBackend
<parley.arena.inference.backends.transformers.TransformersBackend>` serves: one ``peft`` LoRA
adapter per policy on one shared base, so requests of different policies decode in ONE
forward pass per step. How:

- The base model is wrapped in a ``peft.PeftModel`` when the first adapter is added (peft
  replaces each targeted linear layer, in place, by a LoRA layer around it: the backend's
  model is modified, so hand the backend a copy of a model something else trains).
- Every LoRA layer is kept with NO active adapter, so a forward pass without row names is
  exactly the base model. Before the forward passes of a batch the backend names each
  row's adapter (:meth:`LoraAdapters.set_rows`, ``"__base__"`` for the base), and the
  forward of each LoRA ``Linear`` (replaced) adds every row's own ``scale·B·A·x`` in two matmuls
  for the whole batch: the layer's adapters stacked (``A`` (ΣK, in), ``scale·B`` (out, ΣK),
  built once per adapter change) and a per-row mask that keeps only the row's own block of
  ``x·Aᵀ``. This costs N times the (small) rank-r products for N adapters, but no
  per-adapter loop, gathers or scatters, and memory of N·r·(in + out) per layer. Measured
  with ``parley bench pool`` (4 adapters of rank 16 on all 7 projections, 32 rows, on a
  loaded 2-core CPU): peft's own mixed-batch path (``adapter_names=[...]``: per layer, a
  Python loop over the adapters with an index gather and scatter each) ran at 0.53 of the
  plain model on the tiny model; forward hooks around peft's layers with the stacked form
  at 0.65-0.67; this forward at 0.63-0.69 on the tiny model (where each extra op costs as
  much as the base matmul it rides on) and 0.88 on a 9.4 M-parameter model. Per-row
  weights (``bmm`` with A, B gathered per row: exact flops) measured the same on the tiny
  model and need B·r·(in + out) per layer, gigabytes for a real model at batch 256.
  Other LoRA layer types (embeddings) take peft's path, through a pre-hook that hands it
  the row names (no per-step walk of the module tree, unlike
  ``PeftModel.forward(adapter_names=...)``).
- peft names adapters internally; policy names can be anything (dots, ``"__base__"``), so
  each adapter gets an internal key ``parley<N>``.

Adapter format (the contract of issue 17): a directory as ``save_pretrained`` writes it
(``adapter_config.json`` + ``adapter_model.safetensors``; pickled ``.bin`` weights are
refused); update tensors named as ``peft.get_peft_model_state_dict(model, adapter_name=...)``
names them (no adapter name in the keys). Every load and update is checked in full BEFORE
anything changes (config: plain LoRA, rank within ``max_rank``, target modules present;
tensors: exactly the adapter's names, their shapes, finite values of magnitude at most
``weight_limit``: :mod:`~parley.arena.inference.backends.weight_checks`), so a bad adapter
or update leaves every served adapter exactly as it was and says what is wrong.

Not supported (refused with a :class:`~parley.protocols.errors.ConfigError`): DoRA (peft's
mixed batches cannot run it), ``modules_to_save``, ``target_parameters``, aLoRA.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from parley.arena.inference.backends.errors import BackendError
from parley.arena.inference.backends.tokenizer import load_causal_lm
from parley.arena.inference.backends.weight_checks import WEIGHT_LIMIT, check_weights
from parley.protocols.errors import ConfigError, require
from parley.protocols.messages import WeightUpdate

torch: Any = require("torch", "torch")

__all__ = ["LoraAdapters", "save_random_adapter"]

BASE_ROW = "__base__"
"""peft's row name for "no adapter" in a mixed batch."""

_UNSUPPORTED = ("use_dora", "modules_to_save", "target_parameters", "alora_invocation_tokens")


class LoraAdapters:
    """The LoRA adapters served on ``base`` (a Hugging Face causal LM), by policy name.

    Methods that touch tensors block (call them on the backend's torch thread, under its
    lock). ``versions`` maps policy -> weights version; the backend sets it.
    ``weight_limit``: the largest magnitude a loaded tensor may hold (adapters and base).
    """

    def __init__(
        self, base: Any, *, max_rank: int = 64, weight_limit: float = WEIGHT_LIMIT
    ) -> None:
        self.base = base
        self.max_rank = max_rank
        self.weight_limit = weight_limit
        self.peft: Any = None  # the peft.PeftModel around base, once an adapter exists
        self.versions: dict[str, int] = {}
        self.keys: dict[str, str] = {}  # policy -> peft adapter name
        self.rows: list[str] | None = None  # per-row peft names for the next forward
        self._hooked: set[int] = set()
        self._count = 0
        self._stacks: dict[int, tuple[tuple[tuple[str, int], ...], Any, Any]] = {}
        self._masks: dict[tuple[tuple[str, int], ...], Any] = {}

    def set_rows(self, policies: list[str]) -> None:
        """Name each batch row's policy for the forward passes that follow (rows whose
        policy is no adapter use the base; no rows: plain base forwards)."""
        names = [self.keys.get(p, BASE_ROW) for p in policies]
        self.rows = None if all(n == BASE_ROW for n in names) else names
        self._masks = {}

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
            self._stacks = {}
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
        self._stacks = {}

    def load_base(self, state: dict[str, Any]) -> None:
        """Copy full-model tensors (the base's own names, as before any adapter) into the
        base; LoRA tensors are not among them. All names and shapes are checked first."""
        params = dict(self.base.named_parameters())
        params.update(dict(self.base.named_buffers()))
        # peft moved each wrapped layer's weight to `<layer>.base_layer.weight`.
        params = {n.replace(".base_layer.", "."): p for n, p in params.items() if ".lora_" not in n}
        shapes = {n: tuple(p.shape) for n, p in params.items()}
        _check(state, shapes, "weight update", limit=self.weight_limit)
        with torch.no_grad():
            for name, tensor in state.items():
                params[name].copy_(tensor)

    # --- internals ----------------------------------------------------------------------

    def _copy(self, key: str, tensors: dict[str, Any], what: str, *, complete: bool) -> None:
        peft: Any = require("peft", "torch")
        # get_peft_model_state_dict returns views of the adapter's parameters: copying into
        # them sets the parameters.
        own = peft.get_peft_model_state_dict(self.peft, adapter_name=key)
        shapes = {n: tuple(t.shape) for n, t in own.items()}
        _check(tensors, shapes, what, complete=complete, limit=self.weight_limit)
        # peft also saves the (base) embedding matrix of an adapter on the embeddings; the
        # base is shared by every policy, so such a tensor must be the base's own.
        for name in [n for n in tensors if ".lora_" not in n]:
            if not torch.equal(own[name], tensors[name].to(own[name].dtype)):
                raise BackendError(
                    f"{what}: {name!r} is a base-model tensor that differs from the served "
                    "base; an adapter may change only its LoRA tensors (the base is shared)"
                )
        with torch.no_grad():
            for name, tensor in tensors.items():
                if ".lora_" in name:
                    own[name].copy_(tensor)

    def _deactivate(self) -> None:
        """No adapter active in any layer (a forward without row names is the base), and
        every LoRA layer hooked to apply the adapters of :attr:`rows`."""
        lora: Any = require("peft.tuners.lora", "torch")
        for module in self.base.modules():
            if isinstance(module, lora.LoraLayer):
                module.set_adapter([], inference_mode=True)
                if id(module) in self._hooked:
                    continue
                if type(module) is lora.Linear:
                    # An instance forward (as accelerate's hooks do) instead of a forward
                    # hook around peft's: peft's Python per call plus the hook path cost 14%
                    # of the tiny model's decoding speed with no adapter in the batch.
                    module.forward = functools.partial(self._linear_forward, module)
                else:
                    module.register_forward_pre_hook(self._peft_hook, with_kwargs=True)
                self._hooked.add(id(module))

    def _peft_hook(self, module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if self.rows is not None:
            kwargs["adapter_names"] = self.rows
        return args, kwargs

    def _linear_forward(self, module: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        """The base layer's output plus each row's own adapter: x·Aᵀ for the layer's
        stacked adapters, masked to the row's own block, times the stacked scale·Bᵀ.
        Shapes: x (B, T, in); x·Aᵀ (B, T, ΣK); out (B, T, out)."""
        out = module.base_layer(x, *args, **kwargs)
        rows = self.rows
        if rows is None:
            return out
        layout, a_t, b_t = self._stack(module)
        mask = self._mask(layout, rows, a_t) if layout else None
        if mask is None:
            return out
        h = torch.matmul(x.to(a_t.dtype), a_t).mul_(mask)  # (B, T, ΣK)
        flat = torch.addmm(out.reshape(-1, out.shape[-1]), h.reshape(-1, h.shape[-1]), b_t)
        return flat.view(out.shape)

    def _stack(self, module: Any) -> tuple[tuple[tuple[str, int], ...], Any, Any]:
        """The layer's adapters as (layout ((key, rank), ...), Aᵀ (in, ΣK), scale·Bᵀ
        (ΣK, out)), in the base weight's dtype."""
        stack = self._stacks.get(id(module))
        if stack is None:
            keys = list(module.lora_A)  # every adapter of the layer (a failed add is gone)
            dtype = module.base_layer.weight.dtype
            a = [module.lora_A[k].weight for k in keys]
            b = [module.lora_B[k].weight * module.scaling[k] for k in keys]
            layout = tuple((k, int(w.shape[0])) for k, w in zip(keys, a, strict=True))
            cat = (None, None)
            if keys:
                cat = (
                    torch.cat(a).T.contiguous().to(dtype),
                    torch.cat(b, dim=1).T.contiguous().to(dtype),
                )
            stack = self._stacks[id(module)] = (layout, *cat)
        return stack

    def _mask(self, layout: tuple[tuple[str, int], ...], rows: list[str], like: Any) -> Any:
        """(B, 1, ΣK), on ``like``'s device and dtype: ones where row ``i``'s own adapter's
        block lies in ``layout``; None when no row uses an adapter of this layer."""
        if layout not in self._masks:
            blocks, start = {}, 0
            for key, rank in layout:
                blocks[key] = (start, start + rank)
                start += rank
            mask = torch.zeros(len(rows), 1, start, dtype=like.dtype)
            for i, key in enumerate(rows):
                if key in blocks:
                    mask[i, 0, slice(*blocks[key])] = 1.0
            used = any(k in blocks for k in rows)
            self._masks[layout] = mask.to(like.device) if used else None
        return self._masks[layout]


def save_random_adapter(
    model_dir: str | Path,
    out: str | Path,
    *,
    seed: int = 0,
    rank: int = 8,
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    std: float = 0.3,
    zero_b: bool = False,
) -> Path:
    """Write a LoRA adapter with random ``A`` and ``B`` (N(0, std)) for the model in
    ``model_dir`` to ``out`` (``save_pretrained`` format); returns ``out``.

    For tests and benchmarks: adapters whose outputs differ from the base and each other.
    ``zero_b``: ``B = 0`` (as peft initialises an untrained adapter), so the outputs are
    exactly the base's while the adapter costs what any adapter of its shape costs.
    """
    peft: Any = require("peft", "torch")
    model = load_causal_lm(str(model_dir), dtype=torch.float32)
    config = peft.LoraConfig(r=rank, lora_alpha=rank, target_modules=list(targets))
    wrapped = peft.get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if ".lora_" in name:
                noise = torch.randn(param.shape, generator=generator) * std
                param.copy_(noise * 0 if zero_b and ".lora_B" in name else noise)
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
    tensors: dict[str, Any],
    shapes: dict[str, tuple[int, ...]],
    what: str,
    complete: bool = False,
    *,
    limit: float,
) -> None:
    """Raise (BackendError) unless every tensor is known, of the right shape, finite and
    within ``limit``; with ``complete``, every known name must be given too."""
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
    if complete and (missing := sorted(set(shapes) - set(tensors))):
        raise BackendError(f"{what} lacks {len(missing)} tensors, e.g. {missing[0]!r}")
    check_weights(tensors, what, limit=limit)
