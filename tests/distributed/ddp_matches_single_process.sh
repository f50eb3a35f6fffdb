#!/usr/bin/env bash
# DDP over N=2 and N=4 (oversubscribed) trains the same model as one process with
# gradient accumulation over the same global batch, replicas stay bitwise identical
# at every step (--check-replicas), different bucket sizes give identical results,
# and the TCP transport (as between machines) gives the same result as shared memory.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
COMMON=("${TINY[@]}" --global-batch 8 --steps 10 --data "$WORK/data")
"$SHARDLM" train "${COMMON[@]}" --micro-batch 2 --out "$WORK/single" > /dev/null
for n in 2 4; do
  run_mpi "$n" "$SHARDLM" train "${COMMON[@]}" --micro-batch $((8 / n)) --strategy ddp \
    --check-replicas --out "$WORK/ddp$n" > "$WORK/ddp$n.log" 2>&1 || { cat "$WORK/ddp$n.log"; fail "ddp N=$n"; }
  "$SHARDLM" inspect "$WORK/ddp$n" --compare "$WORK/single" --tolerance 1e-5 --relative-to norm \
    || fail "ddp N=$n differs from the single process"
  [ "$(metric "$WORK/ddp$n" world_size)" = "$n" ] || fail "metrics world_size"
  [ "$(metric "$WORK/ddp$n" strategy)" = "ddp" ] || fail "metrics strategy"
  python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); sys.exit(0 if r["comm_bytes"] > 0 and "exposed_comm_ms" in r and "comm_ms" in r else 1)' \
    "$WORK/ddp$n/metrics.jsonl" || fail "comm metrics missing at N=$n"
done
run_mpi 2 "$SHARDLM" train "${COMMON[@]}" --micro-batch 4 --strategy ddp --bucket-mb 0.02 \
  --out "$WORK/ddp2_small_buckets" > /dev/null || fail "small buckets"
[ "$(digest_of "$WORK/ddp2_small_buckets")" = "$(digest_of "$WORK/ddp2")" ] || fail "bucket size changed the result"
run_mpi 2 --mca btl tcp,self "$SHARDLM" train "${COMMON[@]}" --micro-batch 4 --strategy ddp \
  --out "$WORK/ddp2_tcp" > /dev/null || fail "tcp transport"
[ "$(digest_of "$WORK/ddp2_tcp")" = "$(digest_of "$WORK/ddp2")" ] || fail "tcp transport changed the result"
echo "1 passed, 0 failed"
