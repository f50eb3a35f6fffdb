#!/usr/bin/env bash
# `shardlm launch` restarts a training job whose rank died from its newest checkpoint:
# kill rank 1 at step 7 of 20 with --save-every 5 --max-restarts 2, the job completes
# and its final weights equal an uninterrupted run's. A failure that repeats with no
# progress, or without restarts left, ends the job non-zero.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
JOB=(train "${TINY[@]}" --global-batch 8 --micro-batch 4 --steps 20 --save-every 5 --data "$WORK/data")
"$SHARDLM" launch -n 2 -- "${JOB[@]}" --out "$WORK/clean" > /dev/null 2>&1 || fail "clean launch"
SHARDLM_FAULT_STEP=1:7 "$SHARDLM" launch -n 2 --max-restarts 2 -- "${JOB[@]}" --out "$WORK/killed" \
  > "$WORK/killed.log" 2>&1 || { cat "$WORK/killed.log"; fail "killed job did not complete"; }
grep -q "restarting from .*step_00000005 (restart 1 of 2)" "$WORK/killed.log" \
  || { cat "$WORK/killed.log"; fail "no restart message"; }
[ "$(digest_of "$WORK/killed")" = "$(digest_of "$WORK/clean")" ] || fail "restarted run differs"

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
