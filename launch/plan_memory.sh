#!/usr/bin/env bash
# Memory plans of the paper configurations on fsdp=8 (fake CPU devices; minutes on 2 cores):
# alfworld_skill0 / search_skill0 × Qwen2.5-3B / 7B, full fine-tuning and LoRA rank 16 (bfloat16 base),
# plus the 7B ALFWorld step with unrolled layers (compile time). JSON in results/plan_memory/.
#   bash launch/plan_memory.sh && python -m skilljax.tools.plan_memory --summary results/plan_memory
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
out=results/plan_memory
mkdir -p "$out"
plan() {  # name, then plan_memory arguments
  local name=$1; shift
  "$PY" -m skilljax.tools.plan_memory --mesh fsdp=8 "$@" | tee /dev/stderr | tail -1 > "$out/$name.json"
}
for cfg in alfworld_skill0 search_skill0; do
  for m in qwen2p5_3b qwen2p5_7b; do
    plan "${cfg}_${m}_fsdp8" --config "configs/$cfg.py:checkpoint=$m"
    plan "${cfg}_${m}_fsdp8_lora16" --config "configs/$cfg.py:checkpoint=$m" \
      --config.model.lora.rank=16 --config.model.param_dtype=bfloat16
  done
done
plan alfworld_skill0_qwen2p5_7b_fsdp8_unrolled --config configs/alfworld_skill0.py:checkpoint=qwen2p5_7b \
  --config.model.scan_layers=False
