#!/usr/bin/env bash
# With gradient accumulation (2 and 3 micro-batches): ddp and zero1 (both reduce once
# per step) stay bitwise identical; zero2/zero3 (reduce every micro-batch) and hybrid
# (N=4, G=2) agree with ddp within 1e-6 relative (L2 norm of the weight difference
# over the L2 norm of the weights; the per-tensor max figures are printed too).
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
for accum in 2 3; do
  G=$((2 * 2 * accum))
  for strategy in ddp zero1 zero2 zero3; do
    run_mpi 2 "$SHARDLM" train "${TINY[@]}" --micro-batch 2 --global-batch "$G" --steps 10 \
      --data "$WORK/data" --out "$WORK/a${accum}_$strategy" --strategy "$strategy" > /dev/null \
      || fail "accumulation $accum $strategy failed"
  done
  [ "$(digest_of "$WORK/a${accum}_ddp")" = "$(digest_of "$WORK/a${accum}_zero1")" ] \
    || fail "accumulation $accum: zero1 differs from ddp"
  for strategy in zero2 zero3; do
    "$SHARDLM" inspect "$WORK/a${accum}_$strategy" --compare "$WORK/a${accum}_ddp" \
      --tolerance 1e-6 --relative-to norm || fail "accumulation $accum: $strategy vs ddp"
  done
done
# Hybrid: shard groups of 2, replicated twice, against zero3 and ddp over 4 ranks.
for strategy in "hybrid --shard-group-size 2" zero3 ddp; do
  # shellcheck disable=SC2086
  run_mpi 4 "$SHARDLM" train "${TINY[@]}" --micro-batch 2 --global-batch 8 --steps 10 \
    --data "$WORK/data" --out "$WORK/h_${strategy%% *}" --strategy $strategy > /dev/null \
    || fail "N=4 $strategy failed"
done
"$SHARDLM" inspect "$WORK/h_hybrid" --compare "$WORK/h_ddp" --tolerance 1e-6 --relative-to norm \
  || fail "hybrid vs ddp"
"$SHARDLM" inspect "$WORK/h_zero3" --compare "$WORK/h_ddp" --tolerance 0 || fail "zero3 vs ddp at N=4"
echo "1 passed, 0 failed"
