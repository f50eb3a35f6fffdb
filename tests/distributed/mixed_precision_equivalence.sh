#!/usr/bin/env bash
# Strategy equivalence holds under mixed precision: at a fixed world size every
# strategy gives bitwise-identical weights with --precision bf16 (N = 2 and 3, 3
# exercises padding), with activation checkpointing mixed in and with gradient
# accumulation; and with fp16 and a
# loss scale that overflows at first, so the skip decision (taken from the
# all-reduced gradient norm) must be the same on every rank for the weights to agree.
# Also with --reduce-dtype bf16 (gradients rounded to bf16 on the wire, summed in
# fp32): every strategy reduces through the same reduce-scatter, so they still agree.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data

# run_set NAME N EXTRA_FLAGS STRATEGY...: every strategy's digest must match the first.
STEPS=8
run_set() {
  local name="$1" n="$2" extra="$3"; shift 3
  local reference="" first="" strategy out d
  for strategy in "$@"; do
    out="$WORK/${name}_${strategy// /_}"
    # shellcheck disable=SC2086
    run_mpi "$n" "$SHARDLM" train "${TINY[@]}" --micro-batch $((12 / n)) --global-batch 12 \
      --steps $STEPS --data "$WORK/data" --out "$out" --strategy $strategy $extra > "$out.log" 2>&1 \
      || { cat "$out.log"; fail "$name: $strategy failed"; }
    d="$(digest_of "$out")"
    [ -n "$reference" ] || { reference="$d"; first="$strategy"; }
    [ "$d" = "$reference" ] || fail "$name: $strategy digest $d differs from $first $reference"
  done
  echo "$name: $# strategy configurations bitwise identical ($reference)"
}

run_set bf16_n2 2 "--precision bf16" ddp zero1 zero2 "zero3 --prefetch 1" \
  "zero3 --activation-checkpointing" "ddp --activation-checkpointing"
run_set bf16_n3 3 "--precision bf16" ddp zero2 "zero3 --prefetch 2"
run_set bf16_reduce_bf16_n3 3 "--precision bf16 --reduce-dtype bf16" ddp zero1 zero2 \
  "zero3 --prefetch 1"
run_set fp32_reduce_bf16_n2 2 "--reduce-dtype bf16" ddp zero2 "zero3 --prefetch 2"
# With gradient accumulation (2 micro-batches per rank and step): the strategies
# that reduce once per step, and those that reduce every micro-batch, agree within
# their group (as in fp32: tests/distributed/accumulation.sh).
run_set bf16_accumulation_n2 2 "--precision bf16 --global-batch 24" ddp zero1 \
  "ddp --activation-checkpointing"
run_set bf16_accumulation_sharded_n2 2 "--precision bf16 --global-batch 24" zero2 \
  "zero3 --activation-checkpointing"
STEPS=12 run_set fp16_n2 2 "--precision fp16 --loss-scale 5e7 --loss-scale-growth-interval 3" \
  ddp zero1 "zero3 --activation-checkpointing"
# The fp16 runs skipped some steps (on every rank alike, or the digests would
# differ) and applied others.
python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; s=r[-1]["skipped_steps"]; sys.exit(0 if 0 < s < len(r) else 1)' \
  "$WORK/fp16_n2_ddp/metrics.jsonl" || fail "the fp16 runs must both skip and apply steps"
# bf16 really differs from fp32 (the flag reached the model).
run_mpi 2 "$SHARDLM" train "${TINY[@]}" --micro-batch 6 --global-batch 12 --steps 8 \
  --data "$WORK/data" --out "$WORK/fp32_n2" > "$WORK/fp32_n2.log" 2>&1 \
  || { cat "$WORK/fp32_n2.log"; fail "fp32 run failed"; }
[ "$(digest_of "$WORK/fp32_n2")" != "$(digest_of "$WORK/bf16_n2_ddp")" ] \
  || fail "bf16 weights are bitwise fp32's"
# bf16 on the wire really rounds (the flag reached the communicator).
[ "$(digest_of "$WORK/fp32_reduce_bf16_n2_ddp")" != "$(digest_of "$WORK/fp32_n2")" ] \
  || fail "--reduce-dtype bf16 weights are bitwise fp32-reduced ones"
echo "1 passed, 0 failed"
