#!/usr/bin/env bash
# What launch and mpirun write when nobody watches: a job's log redirected to a file holds
# plain lines (every --log-every step, no carriage returns or terminal escapes), though
# Open MPI gives the ranks a pseudo-terminal; launch's own messages start their own
# lines; a subcommand that does not exist is refused before mpirun starts.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
JOB=(train "${TINY[@]}" --global-batch 8 --data "$WORK/data" --steps 6 --log-every 2)

control_codes() { grep -c $'\r\|\e' "$1" || true; }

"$SHARDLM" launch -n 2 -- "${JOB[@]}" --out "$WORK/launched" > "$WORK/launched.log" 2>&1 \
  || { tail -n 20 "$WORK/launched.log"; fail "launch -n 2 train failed"; }
[ "$(control_codes "$WORK/launched.log")" -eq 0 ] || fail "launch's log to a file holds terminal control codes"
for step in 1 2 4 6; do
  grep -q "^step $step/6 |" "$WORK/launched.log" || fail "launch's log has no plain line for step $step"
done
! grep -q "^step 3/6 |" "$WORK/launched.log" || fail "--log-every 2 did not apply under launch (step 3 printed)"

run_mpi 2 "$SHARDLM" "${JOB[@]}" --out "$WORK/mpirun" > "$WORK/mpirun.log" 2>&1 \
  || { tail -n 20 "$WORK/mpirun.log"; fail "mpirun -n 2 train failed"; }
[ "$(control_codes "$WORK/mpirun.log")" -eq 0 ] || fail "mpirun's log to a file holds terminal control codes"
grep -q "^step 2/6 |" "$WORK/mpirun.log" || fail "mpirun's log has no plain line for step 2"

# A job that fails: launch's last message is a line of its own.
SHARDLM_FAULT_STEP=1:3:always "$SHARDLM" launch -n 2 -- "${JOB[@]}" --out "$WORK/failed" \
  > "$WORK/failed.log" 2>&1 && fail "a job whose rank dies succeeded"
tail -n 1 "$WORK/failed.log" | grep -q "^launch: job exited with status" \
  || fail "launch's final message does not start its own line: $(tail -n 2 "$WORK/failed.log")"

out="$("$SHARDLM" launch -n 2 -- frobnicate --out "$WORK/x" 2>&1)" && fail "launch of an unknown subcommand succeeded"
echo "$out" | grep -q "'frobnicate' is not a shardlm subcommand (expected one of: .*train" \
  || fail "unknown subcommand said: $out"
! echo "$out" | grep -q "mpirun" || fail "launch started mpirun before refusing the subcommand: $out"
[ ! -e "$WORK/x" ] || fail "launch of an unknown subcommand wrote $WORK/x"
echo "1 passed, 0 failed"
