#!/usr/bin/env bash
# Nothing lost on preemption, 2 ranks: SIGTERM to `shardlm launch` reaches the ranks as
# a stop request; they agree on one stop step, write its checkpoint and exit 75, and so
# does launch; `--resume` then reaches the uninterrupted run's weights. The same when the
# signal reaches only rank 1 (not launch, not rank 0). A job that does not stop within
# --grace-s is ended. The signalled runs are held after step 3 until the signal reaches
# the rank named (SHARDLM_FAULT=hold_for_signal, a test hook): on a quiet machine the
# 300 steps took 0.4 s and ended before the SIGTERM came (launch exited 143, job status 0).
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
JOB=(train "${TINY[@]}" --global-batch 8 --micro-batch 4 --data "$WORK/data" --steps 300)

"$SHARDLM" launch -n 2 -- "${JOB[@]}" --out "$WORK/clean" > "$WORK/clean.log" 2>&1 \
  || { cat "$WORK/clean.log"; fail "clean launch"; }
clean="$(digest_of "$WORK/clean")"

wait_for_steps() {  # wait_for_steps RUN_DIR N PID
  for _ in $(seq 1 600); do
    [ -f "$1/metrics.jsonl" ] && [ "$(wc -l < "$1/metrics.jsonl")" -ge "$2" ] && return 0
    kill -0 "$3" 2> /dev/null || return 1
    sleep 0.05
  done
  return 1
}
rank_pid() {  # rank_pid LAUNCH_PID RANK: the rank's process, from its environment
  local mpirun
  mpirun="$(pgrep -P "$1" mpirun)"
  for p in $(pgrep -P "$mpirun"); do
    tr '\0' '\n' < "/proc/$p/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$p"; return 0; }
  done
  return 1
}
check_stopped() {  # check_stopped RUN_DIR LOG: the stop line names a checkpoint that exists
  local line step
  line="$(grep "^stopped by SIG[A-Z0-9]* at step" "$2")" || { cat "$2"; fail "no stop line in $2"; }
  step="$(echo "$line" | sed -n 's/^stopped by SIG[A-Z0-9]* at step \([0-9]*\): checkpoint step_[0-9]* written; continue with --resume$/\1/p')"
  [ "$step" = 3 ] || fail "unexpected stop line (expected a stop at the held step 3): $line"
  [ -d "$1/checkpoints/$(printf 'step_%08d' "$step")" ] || fail "no checkpoint at step $step"
  [ "$(wc -l < "$1/metrics.jsonl")" -eq "$step" ] || fail "metrics.jsonl does not end at step $step"
}
resume_matches_clean() {
  "$SHARDLM" launch -n 2 -- "${JOB[@]}" --out "$1" --resume > "$1.resume.log" 2>&1 \
    || { cat "$1.resume.log"; fail "resume of $1"; }
  [ "$(digest_of "$1")" = "$clean" ] || fail "$1: stopped and resumed, digest differs from the uninterrupted run"
}

# SIGTERM to launch.
SHARDLM_FAULT=hold_for_signal=0:3 "$SHARDLM" launch -n 2 -- "${JOB[@]}" --out "$WORK/term" > "$WORK/term.log" 2>&1 &
launcher=$!
wait_for_steps "$WORK/term" 3 "$launcher" || { cat "$WORK/term.log"; fail "job did not start"; }
kill -TERM "$launcher"
rc=0; wait "$launcher" || rc=$?
[ "$rc" -eq 75 ] || { cat "$WORK/term.log"; fail "SIGTERM to launch: status $rc, expected 75"; }
grep -q "^launch: stopped by signal 15 (SIGTERM): the job wrote a checkpoint and exited with status 75" "$WORK/term.log" \
  || { cat "$WORK/term.log"; fail "no launch line"; }
check_stopped "$WORK/term" "$WORK/term.log"
resume_matches_clean "$WORK/term"

# SIGTERM to rank 1 only: every rank stops at the same step.
SHARDLM_FAULT=hold_for_signal=1:3 "$SHARDLM" launch -n 2 -- "${JOB[@]}" --out "$WORK/rank1" > "$WORK/rank1.log" 2>&1 &
launcher=$!
wait_for_steps "$WORK/rank1" 3 "$launcher" || { cat "$WORK/rank1.log"; fail "job did not start"; }
kill -TERM "$(rank_pid "$launcher" 1)"
rc=0; wait "$launcher" || rc=$?
[ "$rc" -eq 75 ] || { cat "$WORK/rank1.log"; fail "SIGTERM to rank 1: status $rc, expected 75"; }
grep -q "^stopped by a signal to another rank at step" "$WORK/rank1.log" || { cat "$WORK/rank1.log"; fail "rank 0 did not say why"; }
grep -q "^launch: the job stopped at a checkpoint (status 75" "$WORK/rank1.log" || { cat "$WORK/rank1.log"; fail "no launch line"; }
sed -i 's/^stopped by a signal to another rank/stopped by SIGTERM/' "$WORK/rank1.log"
check_stopped "$WORK/rank1" "$WORK/rank1.log"
resume_matches_clean "$WORK/rank1"

# A job that does not stop within --grace-s (held by a test hook) is ended; the last
# checkpoint before it stays.
SHARDLM_TEST_STOP_DELAY_S=120 "$SHARDLM" launch -n 2 --grace-s 1 -- "${JOB[@]}" --steps 100000 --save-every 2 \
  --out "$WORK/slow" > "$WORK/slow.log" 2>&1 &
launcher=$!
wait_for_steps "$WORK/slow" 3 "$launcher" || { cat "$WORK/slow.log"; fail "job did not start"; }
kill -TERM "$launcher"
rc=0; wait "$launcher" || rc=$?
[ "$rc" -eq 143 ] || { cat "$WORK/slow.log"; fail "job past its grace period: status $rc, expected 143"; }
grep -q "launch: stopped by signal 15 (SIGTERM); the job was ended (it had not stopped within --grace-s 1" "$WORK/slow.log" \
  || { cat "$WORK/slow.log"; fail "no launch line"; }
"$SHARDLM" inspect "$WORK/slow" > /dev/null || fail "no valid checkpoint left after the job was ended"
echo "1 passed, 0 failed"
