#!/usr/bin/env bash
# Without gradient accumulation, every strategy gives bitwise-identical weights at a
# fixed world size (N = 2, 3, 4; 3 exercises padding), with clipping active. At N = 2
# each run also samples after training (--sample-tokens, a KV-cache generation through
# the strategy's gathers): the same text under every strategy.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
for n in 2 3 4; do
  mb=$((12 / n))
  reference=""
  sample=()
  [ "$n" = 2 ] && sample=(--sample-tokens 16)
  for strategy in "ddp" "ddp --bucket-mb 0.01" "zero1" "zero2" "zero3 --prefetch 0" "zero3 --prefetch 1" \
                  "zero3 --prefetch 2" "zero3 --reshard-after-forward false"; do
    out="$WORK/n${n}_${strategy// /_}"
    # shellcheck disable=SC2086
    run_mpi "$n" "$SHARDLM" train "${TINY[@]}" --micro-batch "$mb" --global-batch 12 --steps 10 \
      --data "$WORK/data" --out "$out" --strategy $strategy "${sample[@]}" > "$out.log" 2>&1 \
      || { cat "$out.log"; fail "N=$n $strategy failed"; }
    d="$(digest_of "$out")"
    [ "${#sample[@]}" = 0 ] || d="$d sample $(grep -a -A2 -- '--- sample ---' "$out.log" | md5sum | cut -c1-12)"
    [ -n "$reference" ] || { reference="$d"; first="$strategy"; }
    [ "$d" = "$reference" ] || fail "N=$n: $strategy digest $d differs from $first $reference"
  done
  # Clipping was active (norm above the 0.5 clip) in the run that was compared.
  python3 -c 'import json,sys; n=[json.loads(l)["grad_norm"] for l in open(sys.argv[1])]; sys.exit(0 if max(n) > 0.5 else 1)' \
    "$WORK/n${n}_ddp/metrics.jsonl" || fail "clipping never active at N=$n"
  echo "N=$n: 8 strategy configurations bitwise identical ($reference)"
done
# The same with one flat unit per model unit (the default merges this tiny model's
# small units; merging changes the partition, so the two layouts are compared only
# within themselves).
reference=""
for strategy in ddp zero1 zero2 "zero3 --prefetch 2"; do
  out="$WORK/unmerged_${strategy// /_}"
  # shellcheck disable=SC2086
  run_mpi 3 "$SHARDLM" train "${TINY[@]}" --micro-batch 4 --global-batch 12 --steps 10 \
    --min-unit-params 0 --data "$WORK/data" --out "$out" --strategy $strategy > "$out.log" 2>&1 \
    || { cat "$out.log"; fail "unmerged N=3 $strategy failed"; }
  d="$(digest_of "$out")"
  [ -n "$reference" ] || reference="$d"
  [ "$d" = "$reference" ] || fail "unmerged N=3: $strategy differs"
done
echo "N=3, one flat unit per model unit: 4 strategy configurations bitwise identical"
echo "1 passed, 0 failed"
