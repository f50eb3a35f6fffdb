#!/usr/bin/env bash
# Nothing lost on preemption, one process: SIGTERM to `train` finishes the step, writes
# a checkpoint and exits 75 with a line that says so; --resume then reaches the
# uninterrupted run's weights. A second signal (past the 2 s duplicate window) stops at
# once without a checkpoint and leaves the last good one as it was. --save-every-minutes
# saves by rank 0's clock without changing the run.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
JOB=(train "${TINY[@]}" --global-batch 8 --data "$WORK/data" --steps 300)

"$SHARDLM" train "${JOB[@]:1}" --out "$WORK/clean" > /dev/null || fail "clean run"
clean="$(digest_of "$WORK/clean")"

wait_for_steps() {  # wait_for_steps RUN_DIR N PID: until metrics.jsonl has N records
  for _ in $(seq 1 600); do
    [ -f "$1/metrics.jsonl" ] && [ "$(wc -l < "$1/metrics.jsonl")" -ge "$2" ] && return 0
    kill -0 "$3" 2> /dev/null || return 1
    sleep 0.05
  done
  return 1
}

# SIGTERM mid-run: a checkpoint at the step it stopped at, status 75, then --resume.
# The run is held after step 3 until the signal comes (SHARDLM_FAULT=hold_for_signal, a
# test hook): on a quiet machine 300 steps take about 0.4 s, less than the test may
# need to see step 3 and send the signal.
SHARDLM_FAULT=hold_for_signal=0:3 "$SHARDLM" "${JOB[@]}" --out "$WORK/stopped" > "$WORK/stopped.log" 2>&1 &
pid=$!
wait_for_steps "$WORK/stopped" 3 "$pid" || { cat "$WORK/stopped.log"; fail "run did not start"; }
kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
[ "$rc" -eq 75 ] || { cat "$WORK/stopped.log"; fail "SIGTERM: exit status $rc, expected 75"; }
line="$(grep "^stopped by SIGTERM at step" "$WORK/stopped.log")" || { cat "$WORK/stopped.log"; fail "no stop line"; }
step="$(echo "$line" | sed -n 's/^stopped by SIGTERM at step \([0-9]*\): checkpoint step_\([0-9]*\) written; continue with --resume$/\1/p')"
[ "$step" = 3 ] || fail "unexpected stop line (expected a stop at the held step 3): $line"
[ -d "$WORK/stopped/checkpoints/$(printf 'step_%08d' "$step")" ] || fail "no checkpoint at step $step"
[ "$(wc -l < "$WORK/stopped/metrics.jsonl")" -eq "$step" ] || fail "metrics.jsonl does not end at step $step"
"$SHARDLM" "${JOB[@]}" --out "$WORK/stopped" --resume > "$WORK/resumed.log" 2>&1 \
  || { cat "$WORK/resumed.log"; fail "resume after SIGTERM"; }
[ "$(digest_of "$WORK/stopped")" = "$clean" ] || fail "stopped at step $step and resumed: digest differs from the uninterrupted run"

# A second signal while the first is being served: at once, no checkpoint. The stop is
# held open by a test hook so that the second signal lands inside it.
"$SHARDLM" "${JOB[@]}" --steps 5 --out "$WORK/twice" > /dev/null || fail "first part of the twice run"
before="$(digest_of "$WORK/twice")"
SHARDLM_TEST_STOP_DELAY_S=60 "$SHARDLM" "${JOB[@]}" --steps 100000 --resume --out "$WORK/twice" \
  > "$WORK/twice.log" 2>&1 &
pid=$!
wait_for_steps "$WORK/twice" 8 "$pid" || { cat "$WORK/twice.log"; fail "twice run did not start"; }
kill -INT "$pid"
for _ in $(seq 1 100); do grep -q "^received SIGINT" "$WORK/twice.log" && break; sleep 0.05; done
sleep 3  # past the duplicate window
kill -TERM "$pid"
rc=0; wait "$pid" || rc=$?
[ "$rc" -eq 143 ] || { cat "$WORK/twice.log"; fail "second signal: exit status $rc, expected 143 (killed by SIGTERM)"; }
grep -q "^second signal: stopping at once, without a checkpoint" "$WORK/twice.log" || { cat "$WORK/twice.log"; fail "no second-signal line"; }
[ "$(ls "$WORK/twice/checkpoints" | grep -c '^step_')" -eq 1 ] || fail "the second signal left a new checkpoint: $(ls "$WORK/twice/checkpoints")"
[ "$(digest_of "$WORK/twice")" = "$before" ] || fail "the last good checkpoint changed"

# Time-based saves: a checkpoint before every step once the (tiny) interval has passed,
# none before the first; same weights as the clean run.
"$SHARDLM" "${JOB[@]}" --steps 6 --out "$WORK/clean6" > /dev/null || fail "clean 6-step run"
"$SHARDLM" "${JOB[@]}" --steps 6 --save-every-minutes 1e-9 --out "$WORK/timed" > /dev/null || fail "timed run"
[ "$(ls "$WORK/timed/checkpoints" | grep '^step_' | tr '\n' ' ')" = "step_00000001 step_00000002 step_00000003 step_00000004 step_00000005 step_00000006 " ] \
  || fail "--save-every-minutes: checkpoints $(ls "$WORK/timed/checkpoints")"
[ "$(digest_of "$WORK/timed")" = "$(digest_of "$WORK/clean6")" ] || fail "time-based saves changed the run"
expect_error "--save-every-minutes must be a finite number >= 0" "$SHARDLM" "${JOB[@]}" --save-every-minutes -1 --out "$WORK/x1"
[ ! -e "$WORK/x1" ] || fail "a refused run wrote its run directory"
echo "1 passed, 0 failed"
