"""The vLLM backend's adapter checks, without an engine: what reaches vLLM is a PEFT LoRA
directory that fits the base; everything else is a ConfigError saying what is wrong."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from parley.arena.inference.backends.vllm_lora import (
    LoRAAdapters,
    base_shapes,
    check_fits,
    lora_engine_args,
    rank_limit,
    read_adapter,
)
from parley.protocols.errors import ConfigError

pytest.importorskip("peft")
from tests.arena.inference.lora_util import make_adapter

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    return make_adapter(tiny_model_dir, tmp_path_factory.mktemp("lora") / "a", rank=4)


def copy(adapter: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(adapter, tmp_path / "copy"))


def test_rank_limits_are_values_vllm_accepts() -> None:
    assert [rank_limit(r) for r in (1, 2, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(ConfigError, match="above vLLM's largest"):
        rank_limit(513)


def test_engine_args_keep_spare_slots() -> None:
    assert lora_engine_args(0, 8, cpu=True) == {}
    cpu = lora_engine_args(2, 4, cpu=True)
    assert cpu == {"enable_lora": True, "max_loras": 4, "max_lora_rank": 8, "max_cpu_loras": 4}
    assert lora_engine_args(2, 0, cpu=False)["max_loras"] == 3
    assert lora_engine_args(2, 0, cpu=False)["max_lora_rank"] == 16


def test_a_real_adapter_fits_its_base(adapter: Path, tiny_model_dir: Path) -> None:
    info = read_adapter(adapter)
    assert info.rank == 4
    assert len(info.shapes) == 2 * 7 * 2  # A and B, 7 modules, 2 layers
    check_fits(info, base_shapes(str(tiny_model_dir)), max_rank=8)
    with pytest.raises(ConfigError, match="rank 4, above this engine's max_lora_rank 1"):
        check_fits(info, base_shapes(str(tiny_model_dir)), max_rank=1)
    assert base_shapes("org/some-hub-model") is None  # not local: vLLM's own checks only


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("no_dir", "no adapter directory"),
        ("no_weights", "needs adapter_config.json and adapter_model.safetensors"),
        ("bad_json", "is not valid JSON"),
        ("not_lora", "peft_type must be LORA"),
        ("garbage_weights", "not a readable safetensors file"),
        ("huge_header", "not a readable safetensors file"),
    ],
)
def test_malformed_adapter_dirs_are_config_errors(
    adapter: Path, tmp_path: Path, damage: str, message: str
) -> None:
    path = copy(adapter, tmp_path)
    weights, config = path / "adapter_model.safetensors", path / "adapter_config.json"
    if damage == "no_dir":
        shutil.rmtree(path)
    elif damage == "no_weights":
        weights.unlink()
    elif damage == "bad_json":
        config.write_text("{not json")
    elif damage == "not_lora":
        config.write_text(json.dumps({**json.loads(config.read_text()), "peft_type": "IA3"}))
    elif damage == "garbage_weights":
        weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    else:  # a header claiming 2**62 bytes must not be read into memory
        weights.write_bytes((2**62).to_bytes(8, "little") + b"{}")
    with pytest.raises(ConfigError, match=message):
        read_adapter(path)


def test_an_adapter_of_another_shape_or_module_does_not_fit(
    adapter: Path, tiny_model_dir: Path
) -> None:
    base = base_shapes(str(tiny_model_dir))
    assert base is not None
    info = read_adapter(adapter)
    key = next(k for k in info.shapes if k.endswith("q_proj.lora_A.weight"))
    wider = {**info.shapes, key: (4, 256)}
    with pytest.raises(ConfigError, match="does not fit"):
        check_fits(type(info)(info.path, 4, wider), base, max_rank=8)
    moved = {k.replace("layers.1.", "layers.7."): v for k, v in info.shapes.items()}
    with pytest.raises(ConfigError, match="which this base model does not have"):
        check_fits(type(info)(info.path, 4, moved), base, max_rank=8)


def test_an_engine_without_lora_refuses_adapters(adapter: Path) -> None:
    adapters = LoRAAdapters(lambda: None, max_rank=0, base=None)
    with pytest.raises(ConfigError, match="started without LoRA: create the backend with"):
        asyncio.run(adapters.add("a", str(adapter)))
    assert adapters.versions == {}


def test_lora_on_a_gpu_needs_16_bit_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's triton lora_shrink asserts float16/bfloat16 inputs: float32 + LoRA on a GPU
    would fail in the first adapter batch, so it is refused (or avoided) at start."""
    pytest.importorskip("vllm")
    from parley.arena.inference.backends import vllm as backend

    assert backend._lora_dtype(None, lora=True) == "float32"  # CPU: torch ops take float32
    monkeypatch.setattr(backend, "_on_cpu", lambda: False)
    assert backend._lora_dtype(None, lora=False) == "float32"
    assert backend._lora_dtype(None, lora=True) == "bfloat16"
    assert backend._lora_dtype("float16", lora=True) == "float16"
    with pytest.raises(ConfigError, match="take float16 or bfloat16 weights, not float32"):
        backend._lora_dtype("float32", lora=True)


def test_grouped_cpu_ops_equal_vllms_except_that_base_rows_get_no_adapter() -> None:
    """parley's grouped CPU LoRA ops against vLLM's own torch ops, on random batches of
    mixed adapters: the same numbers for adapter rows; base rows (index -1) get nothing,
    where vLLM's ops applied the last slot's adapter (vllm-project/vllm#48421)."""
    pytest.importorskip("vllm")
    import torch
    from vllm.lora.ops.torch_ops import lora_ops as stock

    from parley.arena.inference.backends import vllm_cpu_lora as grouped

    g = torch.Generator().manual_seed(0)
    slots, rank, width, tokens = 3, 8, 48, 11
    x = torch.randn(tokens, width, generator=g)
    a = torch.randn(slots, 1, rank, width, generator=g)  # shrink weights (S, 1, r, in)
    b = torch.randn(slots, 1, width, rank, generator=g)  # expand weights (S, 1, out, r)
    idx = torch.tensor([0, 2, -1, 1, 1, -1, 0, 2, 2, -1, 1])
    adapter = idx >= 0

    def run(ops: Any, base: Any) -> tuple[Any, Any, Any]:
        h = torch.zeros(tokens, rank)
        ops.bgmv_shrink(x, a, h, idx, 0.5)
        y, z = base.clone(), base.clone()
        ops.bgmv_expand(h, b, y, idx, add_inputs=True)
        ops.bgmv_expand_slice(h, b[:, :, :16], z, idx, 8, 16, add_inputs=False)
        return h, y, z

    base = torch.randn(tokens, width, generator=g)
    mine, theirs = run(grouped, base), run(stock, base)
    for m, t in zip(mine, theirs, strict=True):
        assert torch.allclose(m[adapter], t[adapter], atol=1e-5)
    h, y, z = mine
    assert not h[~adapter].any()
    assert torch.equal(y[~adapter], base[~adapter])  # the base rows are left alone
    assert not z[~adapter][:, 8:24].any()
    assert not torch.allclose(theirs[1][~adapter], base[~adapter])  # vLLM's bug, as measured
