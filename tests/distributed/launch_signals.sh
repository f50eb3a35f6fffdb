#!/usr/bin/env bash
# A job never outlives `shardlm launch`: SIGTERM or SIGINT to launch ends mpirun and
# every rank; so does SIGKILL of launch (mpirun's parent-death signal), and SIGKILL of
# mpirun (the ranks notice their launcher is gone). A rank that dies before the first
# checkpoint is restarted from step 0 and the job ends where an uninterrupted one
# ends. Under mpirun (ranks bound to cores) no oversubscription warning is printed.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
JOB=(train "${TINY[@]}" --global-batch 8 --micro-batch 4 --data "$WORK/data")

# Processes of one job, found by its unique run directory on their command lines.
job_processes() { pgrep -f -- "--out $1( |\$)" || true; }
wait_until_gone() {
  for _ in $(seq 1 100); do [ -z "$(job_processes "$1")" ] && return 0; sleep 0.1; done
  return 1
}
start_long_job() {
  "$SHARDLM" launch -n 2 -- "${JOB[@]}" --steps 1000000 --out "$1" > "$1.log" 2>&1 &
  launcher=$!
  for _ in $(seq 1 300); do [ -s "$1/metrics.jsonl" ] && break; sleep 0.1; done
  # launch, mpirun and both ranks are running, and the search below finds them.
  [ "$(job_processes "$1" | wc -l)" -ge 4 ] && return 0
  kill -KILL "$launcher"; fail "job $1 did not start: $(tail -c 2000 "$1.log")"
}

for signal in TERM INT; do
  out="$WORK/sig$signal"
  start_long_job "$out"
  kill "-$signal" "$launcher"
  rc=0; wait "$launcher" || rc=$?
  [ "$rc" -ne 0 ] || fail "SIG$signal: launch exited 0"
  wait_until_gone "$out" || fail "SIG$signal to launch left: $(ps -o pid,args -p "$(job_processes "$out" | tr '\n' ',')0")"
  grep -q "launch: stopped by signal" "$out.log" || fail "SIG$signal: no message"
done

out="$WORK/killed_launch"
start_long_job "$out"
kill -KILL "$launcher"; wait "$launcher" || true
wait_until_gone "$out" || fail "SIGKILL of launch left its job running"

out="$WORK/killed_mpirun"
start_long_job "$out"
kill -KILL "$(pgrep -P "$launcher" mpirun)"
wait "$launcher" || true
wait_until_gone "$out" || fail "SIGKILL of mpirun left its ranks running"

# Rank 1 dies at step 3, before the first checkpoint (step 5): restart from step 0.
"$SHARDLM" launch -n 2 -- "${JOB[@]}" --steps 8 --save-every 5 --out "$WORK/clean" \
  > "$WORK/clean.log" 2>&1 || fail "clean launch"
if grep -q "warning: .*threads" "$WORK/clean.log"; then
  fail "oversubscription warning under mpirun: $(grep "warning" "$WORK/clean.log")"
fi
SHARDLM_FAULT_STEP=1:3 "$SHARDLM" launch -n 2 --max-restarts 1 -- "${JOB[@]}" --steps 8 \
  --save-every 5 --out "$WORK/early" > "$WORK/early.log" 2>&1 \
  || { cat "$WORK/early.log"; fail "job that died before its first checkpoint did not complete"; }
grep -q "restarting from step 0 (no checkpoint yet) (restart 1 of 1)" "$WORK/early.log" \
  || { cat "$WORK/early.log"; fail "no restart from step 0"; }
[ "$(digest_of "$WORK/early")" = "$(digest_of "$WORK/clean")" ] || fail "restarted run differs"
python3 - "$WORK/early/metrics.jsonl" <<'PY' || fail "metrics.jsonl repeats steps after the restart"
import json, sys
steps = [json.loads(line)["step"] for line in open(sys.argv[1])]
assert steps == list(range(1, 9)), steps
PY

# A directory that held another run before launch started is not restarted into.
rc=0
SHARDLM_FAULT_STEP=1:2 "$SHARDLM" launch -n 2 --max-restarts 2 -- "${JOB[@]}" --steps 8 \
  --out "$WORK/clean" > "$WORK/other.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "launch into another run's directory exited 0"
grep -q "already holds a run" "$WORK/other.log" || { cat "$WORK/other.log"; fail "no refusal"; }
grep -q "not restarting: the run directory held checkpoints before this job started" "$WORK/other.log" \
  || { cat "$WORK/other.log"; fail "restarted into another run"; }
echo "1 passed, 0 failed"
