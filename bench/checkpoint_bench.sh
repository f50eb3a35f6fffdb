#!/usr/bin/env bash
# Checkpoint save and load time and bytes for GPT-2 124M under ddp N=1 and zero3 N=2,
# and restart-to-first-step time after a killed rank (shardlm launch --max-restarts).
# usage: bench/checkpoint_bench.sh [build/shardlm]
set -euo pipefail
SHARDLM="$(realpath "${1:-build/shardlm}")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SHARED="$ROOT/../shared/data"
WORK="$(mktemp -d /tmp/shardlm-ckpt-bench.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$SHARDLM" prepare --tokenizer "gpt2:$SHARED/gpt2" --input "$SHARED/tinyshakespeare.txt" --out "$WORK/data" > /dev/null
field() { python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print([x for x in r if sys.argv[2] in x][-1][sys.argv[2]])' "$1" "$2"; }
echo "| model | strategy | ranks | checkpoint MiB | save s | load s |"
echo "|---|---|---|---|---|---|"
for config in "ddp 1" "zero3 2"; do
  read -r strategy n <<< "$config"
  COMMON=(train --model gpt2 --data "$WORK/data" --seq-len 64 --micro-batch 1 --global-batch 2
          --eval-batches 0 --strategy "$strategy" --out "$WORK/$strategy")
  "$SHARDLM" launch -n "$n" -- "${COMMON[@]}" --steps 1 > /dev/null 2>&1
  save_ms="$(field "$WORK/$strategy/metrics.jsonl" save_ms)"
  bytes="$(field "$WORK/$strategy/metrics.jsonl" checkpoint_bytes)"
  load_s="$("$SHARDLM" launch -n "$n" -- "${COMMON[@]}" --steps 2 --resume 2>/dev/null \
    | sed -n 's/.*loaded in \([0-9.]*\) s.*/\1/p')"
  printf "| gpt2 124M | %s | %s | %.0f | %.2f | %s |\n" "$strategy" "$n" \
    "$(echo "$bytes / 1048576" | bc -l)" "$(echo "$save_ms / 1000" | bc -l)" "$load_s"
done
# Restart to first step: kill rank 1 at step 3 of 6, checkpoints every 2 steps.
JOB=(train --model gpt2-small-30m --data "$WORK/data" --seq-len 128 --micro-batch 2 --global-batch 4
     --eval-batches 0 --steps 6 --save-every 2 --out "$WORK/restart")
start=$(date +%s.%N)
SHARDLM_FAULT_STEP=1:3 "$SHARDLM" launch -n 2 --max-restarts 1 -- "${JOB[@]}" > "$WORK/restart.log" 2>&1
python3 - "$WORK/restart/metrics.jsonl" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
# The restarted trainer's first record is where the time since its start drops.
t = [r["since_start_s"] for r in records]
first = next(i for i in range(1, len(t)) if t[i] < t[i - 1])
print(f"restart to first step (gpt2-small-30m, 2 ranks): {t[first]:.2f} s from the restarted "
      f"trainer's start to the end of its first step (step {records[first]['step']})")
PY
