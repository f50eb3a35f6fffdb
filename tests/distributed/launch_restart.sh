#!/usr/bin/env bash
# `shardlm launch` restarts a training job whose rank died from its newest checkpoint:
# kill rank 1 at step 7 of 20 with --save-every 5 --max-restarts 2, the job completes
# and its final weights equal an uninterrupted run's; likewise a zero3 x context x tensor
# job. A failure that repeats with no progress, or without restarts left, ends the job
# non-zero.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
JOB=(train "${TINY[@]}" --global-batch 8 --micro-batch 4 --steps 20 --save-every 5 --data "$WORK/data")

# restarted_equals_clean NAME RANKS KILLED_RANK MAX_RESTARTS JOB...: the job killed at
# step 7 restarts once from step 5 and ends with the uninterrupted job's weights.
restarted_equals_clean() {
  local name="$1" ranks="$2" killed="$3" restarts="$4"; shift 4
  "$SHARDLM" launch -n "$ranks" -- "$@" --out "$WORK/${name}_clean" > /dev/null 2>&1 || fail "$name: clean launch"
  SHARDLM_FAULT_STEP="$killed:7" "$SHARDLM" launch -n "$ranks" --max-restarts "$restarts" -- "$@" \
    --out "$WORK/${name}_killed" > "$WORK/${name}_killed.log" 2>&1 \
    || { cat "$WORK/${name}_killed.log"; fail "$name: killed job did not complete"; }
  grep -q "restarting from .*step_00000005 (restart 1 of $restarts)" "$WORK/${name}_killed.log" \
    || { cat "$WORK/${name}_killed.log"; fail "$name: no restart message"; }
  [ "$(digest_of "$WORK/${name}_killed")" = "$(digest_of "$WORK/${name}_clean")" ] || fail "$name: restarted run differs"
}
restarted_equals_clean ddp 2 1 2 "${JOB[@]}"
# The same on a 3-D mesh (zero3 x context 2 x tensor 2 on 4 ranks): the restart rebuilds
# the context and tensor groups and loads each rank's pieces from the checkpoint.
restarted_equals_clean mesh 4 3 1 train --model llama-tiny --seq-len 32 --threads 1 --global-batch 8 \
  --micro-batch 4 --steps 10 --save-every 5 --eval-batches 0 --data "$WORK/data" --strategy zero3 \
  --tensor-parallel 2 --context-parallel 2

rc=0
SHARDLM_FAULT_STEP=1:7:always "$SHARDLM" launch -n 2 --max-restarts 3 -- "${JOB[@]}" \
  --out "$WORK/repeat" > "$WORK/repeat.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "a repeating failure exited 0"
grep -q "no progress past checkpoint step 5; giving up" "$WORK/repeat.log" \
  || { cat "$WORK/repeat.log"; fail "no give-up message"; }

rc=0
SHARDLM_FAULT_STEP=0:3 "$SHARDLM" launch -n 2 -- "${JOB[@]}" --out "$WORK/norestart" \
  > "$WORK/norestart.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "a failed job without restarts exited 0"
echo "1 passed, 0 failed"
