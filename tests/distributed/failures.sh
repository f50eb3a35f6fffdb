#!/usr/bin/env bash
# A rank that dies or raises an error takes the whole job down with a non-zero exit
# and a message naming the rank, well within the timeout; bad distributed input is
# refused with one clear line.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
COMMON=("${TINY[@]}" --global-batch 8 --micro-batch 4 --steps 20 --data "$WORK/data" --comm-timeout 20)

# Rank 1 is killed at step 3: the survivors must not wait forever.
start=$SECONDS
rc=0
SHARDLM_FAULT_STEP=1:3 run_mpi 2 "$SHARDLM" train "${COMMON[@]}" --out "$WORK/killed" \
  > "$WORK/killed.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "job with a killed rank exited 0"
[ "$rc" -ne 124 ] || fail "job with a killed rank hung until timeout(1)"
[ $((SECONDS - start)) -lt 120 ] || fail "job with a killed rank took $((SECONDS - start)) s"
grep -q "rank 1" "$WORK/killed.log" || { cat "$WORK/killed.log"; fail "no message names rank 1"; }

# Rank 1 raises an error (its data differs from rank 0's): every rank exits non-zero
# and the message names the rank and the differing field.
head -c 50000 "$SHARED_DATA/tinyshakespeare.txt" > "$WORK/other.txt"
"$SHARDLM" prepare --tokenizer byte --input "$WORK/other.txt" --out "$WORK/other" > /dev/null
rc=0
timeout 300 mpirun -n 1 --oversubscribe "$SHARDLM" train "${COMMON[@]}" --out "$WORK/mismatch" : \
  -n 1 "$SHARDLM" train "${COMMON[@]}" --data "$WORK/other" --out "$WORK/mismatch" \
  > "$WORK/mismatch.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "mismatched data across ranks: exit $rc"
grep -q "rank 1 disagrees with rank 0 on /data_sha256" "$WORK/mismatch.log" \
  || { cat "$WORK/mismatch.log"; fail "mismatch message"; }

# World size larger than the global batch; unknown strategy; bad hybrid group.
rc=0
run_mpi 4 "$SHARDLM" train "${TINY[@]}" --global-batch 2 --micro-batch 1 --steps 1 \
  --data "$WORK/data" --out "$WORK/big" > "$WORK/big.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "world size 4 is larger than the global batch of 2" "$WORK/big.log" \
  || { cat "$WORK/big.log"; fail "world larger than global batch"; }
expect_error "unknown strategy 'zero4'" "$SHARDLM" train "${TINY[@]}" --strategy zero4 \
  --data "$WORK/data" --out "$WORK/u" --steps 1
rc=0
run_mpi 4 "$SHARDLM" train "${TINY[@]}" --strategy hybrid --shard-group-size 3 --global-batch 8 \
  --micro-batch 2 --steps 1 --data "$WORK/data" --out "$WORK/h" > "$WORK/h.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "shard-group-size 3 must divide the world size 4" "$WORK/h.log" \
  || { cat "$WORK/h.log"; fail "bad shard group size"; }
echo "1 passed, 0 failed"
