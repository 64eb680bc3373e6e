"""The models of a training run: what the trainer trains and what the pool serves.

:func:`load_policies` loads each policy's initial checkpoint (``TrainConfig.model``, or the
tiny models built into ``OUT/base``) once for the trainer and once for the pool:

- Full fine-tuning (``lora`` unset): each policy is a whole model in the trainer
  (:class:`~parley.arena.training.adapters.FullWeights`) and a copy of it in its own
  backend in the pool, served under the policy's name.
- LoRA: the policies that start from the same checkpoint share one base. The trainer
  holds it once, frozen, with one adapter per policy
  (:func:`~parley.arena.training.adapters.attach_adapters`); the pool holds it once, in one
  backend served under a name of its own (``_base0``, ``_base1``, ... per distinct base), and
  each policy is an adapter of that backend (``InferencePool.add_adapter``), loaded from
  the adapter's initial PEFT directory ``OUT/adapters/<policy>`` (:meth:`Policies.attach`).
  The adapters of one base batch together in the pool; weight sync replaces one adapter.

The pool serves in the trainer's ``precision`` (the dtype its forward passes compute in),
so the logprobs recorded at generation are the ones the trainer recomputes up to rounding.
``gradient_checkpointing`` is switched on for the trainer's models only. Both copies live on
``device`` (the trainer computes wherever its model's parameters are).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parley.arena.training.adapters import FullWeights, PolicyWeights, attach_adapters
from parley.arena.training.config import RunSeeds, TrainConfig
from parley.arena.training.precision import check_precision, torch_dtype
from parley.protocols.errors import ConfigError, require

__all__ = ["Policies", "load_backend", "load_policies", "resolve_device"]


@dataclass
class Policies:
    """A run's policies: the trainer's weights, the pool's backends, the adapters to load."""

    weights: dict[str, PolicyWeights]
    """Policy name -> what the trainer trains of it."""
    tokenizer: Any
    """The policies' chat tokenizer (one for all: they share a vocabulary)."""
    served: dict[str, Any] = field(default_factory=dict)
    """Pool policy name -> backend, to build the pool with (LoRA: one per base)."""
    adapters: list[tuple[str, str, Path]] = field(default_factory=list)
    """(policy, base policy, initial adapter directory): loaded by :meth:`attach`."""

    async def attach(self, pool: Any) -> None:
        """Serve each adapter policy from its base's backend in ``pool`` (version 0)."""
        for policy, base, path in self.adapters:
            await pool.add_adapter(policy, base, str(path))


def load_policies(
    config: TrainConfig, seeds: RunSeeds, dirs: Mapping[str, Path], out: Path
) -> Policies:
    """Load every policy from its initial checkpoint ``dirs[policy]`` (blocking: call it
    in a worker thread). LoRA adapters' initial directories are written under ``out``."""
    from parley.arena.inference.backends.tokenizer import load_tokenizer

    device = resolve_device(config.device)
    check_precision(config.precision, device)
    tokenizer = load_tokenizer(str(next(iter(dirs.values()))))
    if config.lora is None:
        return _full_models(config, dirs, tokenizer, device)
    policies = Policies(weights={}, tokenizer=tokenizer)
    groups: dict[Path, list[str]] = {}
    for name in config.policies:
        groups.setdefault(Path(dirs[name]).resolve(), []).append(name)
    for i, (path, names) in enumerate(groups.items()):
        base_policy = _free_name(f"_base{i}", config.policies)
        base = _trainer_model(config, path, device)
        weights = attach_adapters(base, names, config.lora, seeds.lora, base_path=str(path))
        weights[names[0]].module.train()
        policies.weights.update(weights)
        served = _load(path, config.precision, device)
        policies.served[base_policy] = _backend(config, served, tokenizer)
        for name in names:
            initial = out / "adapters" / name
            weights[name].save(initial, tokenizer)
            policies.adapters.append((name, base_policy, initial))
    return policies


def _full_models(
    config: TrainConfig, dirs: Mapping[str, Path], tokenizer: Any, device: str
) -> Policies:
    policies = Policies(weights={}, tokenizer=tokenizer)
    dtype = torch_dtype(config.precision)
    for name in config.policies:
        model = _trainer_model(config, Path(dirs[name]), device)
        served = copy.deepcopy(model).to(dtype)
        if config.gradient_checkpointing:
            served.gradient_checkpointing_disable()
        policies.weights[name] = FullWeights(model)
        policies.served[name] = _backend(config, served, tokenizer)
    return policies


def resolve_device(device: str) -> str:
    """``device`` checked (:class:`ConfigError` for a name torch does not know or a GPU it
    does not see), with ``auto`` resolved."""
    torch: Any = require("torch", "train")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError as exc:
        raise ConfigError(f"device {device!r}: {exc}; use cpu, cuda, cuda:N or auto") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r}: torch sees no CUDA GPU here; use cpu or auto")
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"device {device!r}: parley trains on cpu or cuda")
    return device


def _trainer_model(config: TrainConfig, path: Path, device: str) -> Any:
    """The float32 model the trainer updates, in train mode."""
    model = _load(path, "fp32", device)
    if config.gradient_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ConfigError(
                f"gradient_checkpointing: {type(model).__name__} does not support it; "
                "set gradient_checkpointing: false"
            )
        # Non-reentrant checkpointing: gradients reach adapters behind a frozen base.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def _load(path: Path, precision: str, device: str) -> Any:
    from parley.arena.inference.backends.tokenizer import load_causal_lm

    return load_causal_lm(str(path), dtype=torch_dtype(precision)).to(device)


def load_backend(config: TrainConfig, path: Path) -> Any:
    """A pool backend serving the checkpoint ``path`` as the run serves its policies
    (``precision``, ``device``; blocking: call it in a worker thread)."""
    from parley.arena.inference.backends.tokenizer import load_tokenizer

    device = resolve_device(config.device)
    return _backend(config, _load(path, config.precision, device), load_tokenizer(str(path)))


def _backend(config: TrainConfig, model: Any, tokenizer: Any) -> Any:
    from parley.arena.inference.backends.transformers import TransformersBackend

    return TransformersBackend(
        model.eval(), tokenizer, max_batch_rows=config.max_batch_size, seed=config.seed
    )


def _free_name(name: str, taken: list[str]) -> str:
    """``name``, with underscores prepended until no policy is called that."""
    while name in taken:
        name = "_" + name
    return name
