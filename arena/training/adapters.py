"""What the trainer trains of each policy: a whole model, or a LoRA adapter on a shared base.

:class:`PolicyWeights` is the one interface :class:`~parley.arena.training.pg.PolicyGradientTrainer`
uses for a policy's weights, whatever they are:

- :class:`FullWeights` — full fine-tuning: the policy is a whole causal LM; every parameter
  learns; the KL reference (``pg.kl_coef > 0``) is a frozen deep copy taken when the policy
  first becomes trainable.
- :class:`AdapterWeights` — a LoRA adapter (``peft``) on a base model that other policies
  share: one ``PeftModel`` per distinct base holds one adapter per policy
  (:func:`attach_adapters`); the base is frozen; only the policy's adapter learns (its own
  optimizer over its own parameters); the KL reference is the base with the adapters
  disabled (no copy); the weights a sync ships are the adapter's tensors alone, named as
  ``peft.get_peft_model_state_dict`` names them (no adapter name in the keys); a checkpoint
  is a PEFT adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``),
  loadable by ``llm:BASE?adapter=DIR``.

A ``PeftModel`` has one *active* adapter at a time: :meth:`PolicyWeights.selected` makes the
policy's adapter the active one (and the only one with ``requires_grad``) for the forward
passes in its block. The trainer's models are used by one thread at a time (the update, or
a reading warm start), never by the inference pool, which serves its own copy.

Inside the ``PeftModel`` the adapters are named ``policy0``, ``policy1``, ... (the order of
``policies``), not by policy name: PEFT refuses dots in adapter names and mis-loads names
that occur in its ``lora_`` prefix (``a``, ``or``). Nothing outside sees these names.
"""

from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parley.protocols.errors import ConfigError, require

__all__ = [
    "AdapterWeights",
    "FullWeights",
    "LoraConfig",
    "PolicyWeights",
    "as_weights",
    "attach_adapters",
]


@dataclass
class LoraConfig:
    """LoRA adapters (``lora:`` in a training config; absent: full fine-tuning)."""

    r: int = 8
    """Rank of each adapter's update ``B @ A``."""
    alpha: float = 16.0
    """Scale: the update is multiplied by ``alpha / r``."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training (0: none; then the trainer scores
    tokens exactly as the pool generated them)."""
    target_modules: list[str] | None = None
    """Module names (or name suffixes) that get an adapter, e.g. ``[q_proj, v_proj]``.
    None: every linear layer of the attention and the MLP blocks (PEFT's ``all-linear``:
    every ``Linear`` but the output head)."""
    init_seed: int | None = None
    """Seeds the adapters' initialisation (A random, B zero, so a fresh adapter changes
    nothing): policy ``i`` of ``policies`` draws from ``init_seed + i``. None: the run's
    ``seed`` (recorded in ``summary.json``)."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ConfigError(f"lora.r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ConfigError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        targets = self.target_modules
        if targets is not None and not (targets and all(isinstance(m, str) and m for m in targets)):
            raise ConfigError(
                "lora.target_modules: a non-empty list of module names (e.g. [q_proj, v_proj]), "
                "or leave it out for every linear layer"
            )

    def to_peft(self) -> Any:
        """The equivalent ``peft.LoraConfig``."""
        peft: Any = require("peft", "train")
        targets: Any = list(self.target_modules) if self.target_modules else "all-linear"
        return peft.LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets,
            bias="none",
            task_type="CAUSAL_LM",
        )


class PolicyWeights(ABC):
    """One policy's trainable weights, as the trainer sees them."""

    module: Any
    """The ``torch`` module whose forward scores the policy (inside :meth:`selected`)."""

    @abstractmethod
    def parameters(self) -> list[Any]:
        """The parameters this policy learns (its optimizer's)."""

    @contextlib.contextmanager
    def selected(self) -> Iterator[Any]:
        """Forward passes in this block use this policy's weights; yields :attr:`module`."""
        yield self.module

    @abstractmethod
    def prepare_reference(self) -> None:
        """Fix the KL reference now (the policy as it is when it first becomes trainable)."""

    @abstractmethod
    def reference(self) -> contextlib.AbstractContextManager[Any]:
        """A block in which the yielded module computes the frozen reference policy."""

    @abstractmethod
    def state_tensors(self) -> dict[str, np.ndarray]:
        """What a weight update ships: the trained tensors as numpy arrays (copies)."""

    @abstractmethod
    def save(self, path: Path, tokenizer: Any) -> None:
        """Write a checkpoint that ``parley run --agents`` can load (see the subclasses)."""

    def trainable_numel(self) -> int:
        """How many numbers this policy learns."""
        return sum(int(p.numel()) for p in self.parameters())

    def snapshot(self) -> list[Any]:
        """A copy of the learned parameters, for :meth:`restore` (a stage's restart)."""
        return [p.detach().clone() for p in self.parameters()]

    def restore(self, saved: list[Any]) -> None:
        """Put back the parameters of a :meth:`snapshot` of this policy."""
        params = self.parameters()
        if len(params) != len(saved):
            raise ValueError(f"a snapshot of {len(saved)} tensors for {len(params)} parameters")
        torch: Any = require("torch", "train")
        with torch.no_grad():
            for param, value in zip(params, saved, strict=True):
                param.copy_(value)


class FullWeights(PolicyWeights):
    """A whole causal LM that learns every parameter (full fine-tuning)."""

    def __init__(self, model: Any) -> None:
        self.module = model
        self._ref: Any = None

    def parameters(self) -> list[Any]:
        return list(self.module.parameters())

    def prepare_reference(self) -> None:
        if self._ref is None:
            self._ref = copy.deepcopy(self.module).eval()
            for p in self._ref.parameters():
                p.requires_grad_(False)

    @contextlib.contextmanager
    def reference(self) -> Iterator[Any]:
        self.prepare_reference()
        yield self._ref

    def state_tensors(self) -> dict[str, np.ndarray]:
        # Tied weights appear once, under the name named_parameters gives them.
        return {k: _numpy(v) for k, v in self.module.named_parameters()}

    def reinitialise(self, seed: int) -> None:
        """Fresh random weights: the model class's own initialisation of its config, seeded
        by ``seed`` (for ``model: tiny``, exactly the tiny model built with that seed)."""
        torch: Any = require("torch", "train")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            fresh = dict(type(self.module)(self.module.config).named_parameters())
        with torch.no_grad():
            for name, param in self.module.named_parameters():
                param.copy_(fresh[name])
        # A fresh policy is a new start: its KL reference is fixed again when it next learns,
        # at these weights (kept, it would pull the fresh policy back to the one that stalled).
        self._ref = None

    def save(self, path: Path, tokenizer: Any) -> None:
        """A Hugging Face model directory with the tokenizer (``llm:DIR`` loads it)."""
        self.module.save_pretrained(path)
        tokenizer.hf.save_pretrained(path)


class AdapterWeights(PolicyWeights):
    """The LoRA adapter ``adapter`` of ``peft_model`` (a ``PeftModel`` other policies share)."""

    def __init__(self, peft_model: Any, adapter: str, base_path: str = "") -> None:
        self.module = peft_model
        self.adapter = adapter
        self.base_path = base_path
        """The base checkpoint (written into the adapter's config as PEFT does)."""

    def parameters(self) -> list[Any]:
        marker = f".{self.adapter}."
        return [p for n, p in self.module.named_parameters() if marker in n and "lora_" in n]

    @contextlib.contextmanager
    def selected(self) -> Iterator[Any]:
        # set_adapter also makes this adapter the only one with requires_grad.
        self.module.set_adapter(self.adapter)
        yield self.module

    def prepare_reference(self) -> None:
        """Nothing to copy: the reference is the shared base, adapters off."""

    @contextlib.contextmanager
    def reference(self) -> Iterator[Any]:
        with self.module.disable_adapter():
            yield self.module

    def state_tensors(self) -> dict[str, np.ndarray]:
        peft: Any = require("peft", "train")
        state = peft.get_peft_model_state_dict(self.module, adapter_name=self.adapter)
        return {k: _numpy(v) for k, v in state.items()}

    def save(self, path: Path, tokenizer: Any) -> None:
        """A PEFT adapter directory: ``adapter_config.json`` + ``adapter_model.safetensors``
        (``llm:BASE?adapter=DIR`` loads it; so does ``PeftModel.from_pretrained``)."""
        safetensors: Any = require("safetensors.numpy", "train")
        path.mkdir(parents=True, exist_ok=True)
        config = copy.copy(self.module.peft_config[self.adapter])
        if self.base_path:
            config.base_model_name_or_path = self.base_path
        config.save_pretrained(str(path))  # adapter_config.json, as PEFT writes it
        tensors = {k: np.ascontiguousarray(v) for k, v in self.state_tensors().items()}
        safetensors.save_file(tensors, str(path / "adapter_model.safetensors"))


def as_weights(model: Any) -> PolicyWeights:
    """``model`` itself if it is :class:`PolicyWeights`, else a :class:`FullWeights` of it."""
    return model if isinstance(model, PolicyWeights) else FullWeights(model)


def attach_adapters(
    base: Any,
    policies: Sequence[str],
    config: LoraConfig,
    seeds: Mapping[str, int],
    *,
    base_path: str = "",
) -> dict[str, AdapterWeights]:
    """Wrap ``base`` (a causal LM, modified in place and frozen) into one ``PeftModel``
    with a fresh adapter per policy, the adapter of ``policies[i]`` initialised from
    ``seeds[policy]``. Raises :class:`ConfigError` when a target module does not exist."""
    torch: Any = require("torch", "train")
    peft: Any = require("peft", "train")
    if not policies:
        raise ConfigError("attach_adapters needs at least one policy")
    model: Any = None
    weights: dict[str, AdapterWeights] = {}
    for i, name in enumerate(policies):
        adapter = f"policy{i}"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seeds[name]))
            try:
                if model is None:
                    model = peft.get_peft_model(base, config.to_peft(), adapter_name=adapter)
                else:
                    model.add_adapter(adapter, config.to_peft())
            except ValueError as exc:  # PEFT: a target module the model does not have
                raise ConfigError(f"lora: {exc}") from None
        weights[name] = AdapterWeights(model, adapter, base_path)
    for n, p in model.named_parameters():
        if "lora_" not in n:
            p.requires_grad_(False)  # the base is frozen, whatever the adapter set-up did
    return weights


def _numpy(tensor: Any) -> np.ndarray:
    """A float32 numpy copy of a parameter (bf16 has no numpy dtype)."""
    value = tensor.detach().cpu()
    if value.is_floating_point() and value.element_size() < 4:
        value = value.float()
    array: np.ndarray = value.numpy().copy()
    return array
