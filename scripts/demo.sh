#!/usr/bin/env bash
# The main job (`make demo`): tokenize TinyShakespeare with the GPT-2 tokenizer, train
# a small GPT-2 on this machine's cores for a few minutes, then print a sample and the
# summary table. Output: runs/demo/ (data/, run/ with metrics.jsonl and checkpoints).
set -euo pipefail
SHARDLM="${1:-build/shardlm}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SHARED_DATA="${SHARDLM_SHARED_DATA:-$ROOT/../shared/data}"
OUT="$ROOT/runs/demo"
STEPS="${DEMO_STEPS:-120}"

[ -f "$SHARED_DATA/tinyshakespeare.txt" ] || {
  echo "error: $SHARED_DATA/tinyshakespeare.txt not found (expected ../shared/data beside the checkout)" >&2
  exit 1
}
mkdir -p "$OUT"
rm -rf "$OUT/data"  # the demo's own previous data (prepare never replaces a dataset)
"$SHARDLM" prepare --tokenizer "gpt2:$SHARED_DATA/gpt2" \
  --input "$SHARED_DATA/tinyshakespeare.txt" --out "$OUT/data" --val-fraction 0.1
rm -rf "$OUT/run"  # the demo's own previous run
"$SHARDLM" train --model gpt2-small-30m --data "$OUT/data" --out "$OUT/run" \
  --steps "$STEPS" --micro-batch 8 --seq-len 256 --lr 1e-3 --min-lr 1e-4 --warmup 15 \
  --eval-every 40 --eval-batches 4 --sample-tokens 120 --sample-prompt $'ROMEO:\n'
