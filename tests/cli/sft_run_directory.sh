#!/usr/bin/env bash
# `sft` under the same guarantees as `train`: it owns its run directory before it writes
# anything under it (preparation included), so a second sft on the same --out with
# another dataset is refused, naming the first's pid, and RUN/data stays as it was; a
# preparation that fails leaves nothing; SIGTERM stops it at a checkpoint (status 75);
# `launch --max-restarts` restarts it after a rank dies, from its checkpoint and with
# the data it prepared, to the uninterrupted run's weights.
source "$(dirname "$0")/lib/common.sh" "$@"
head -n 48 "$SHARED_DATA/sft/gsm8k_train.jsonl" > "$WORK/a.jsonl"
sed -n '49,96p' "$SHARED_DATA/sft/gsm8k_train.jsonl" > "$WORK/b.jsonl"
SFT=(--model qwen3-tiny --tokenizer "gpt2:$SHARED_DATA/gpt2" --max-len 128 --threads 1 --lr 3e-3
     --warmup 1 --eval-batches 0 --micro-batch 2 --global-batch 4)

data_digest() { (cd "$1/data" && sha256sum meta.json train.sft val.sft); }

# The first job trains (long); a second one on the same --out with other data is refused.
"$SHARDLM" sft "${SFT[@]}" --dataset "$WORK/a.jsonl" --steps 100000 --out "$WORK/run" > "$WORK/first.log" 2>&1 &
first=$!
for _ in $(seq 1 600); do [ -s "$WORK/run/metrics.jsonl" ] && break; kill -0 "$first" || break; sleep 0.05; done
[ -s "$WORK/run/metrics.jsonl" ] || { cat "$WORK/first.log"; fail "first sft did not start training"; }
before="$(data_digest "$WORK/run")"
expect_error "run directory '$WORK/run' is in use by another job (pid $first on host" \
  "$SHARDLM" sft "${SFT[@]}" --dataset "$WORK/b.jsonl" --steps 2 --out "$WORK/run"
[ "$(data_digest "$WORK/run")" = "$before" ] || fail "the refused sft changed RUN/data"
[ ! -e "$WORK/run/data.preparing" ] || fail "the refused sft left a temporary"
grep -q "$WORK/a.jsonl" "$WORK/run/data/meta.json" || fail "RUN/data no longer names the first job's dataset"
# SIGTERM: the sft job stops at a checkpoint too.
kill -TERM "$first"
rc=0; wait "$first" || rc=$?
[ "$rc" -eq 75 ] || { cat "$WORK/first.log"; fail "SIGTERM to sft: status $rc, expected 75"; }
grep -q "^stopped by SIGTERM at step [0-9]*: checkpoint step_[0-9]* written; continue with --resume" "$WORK/first.log" \
  || { cat "$WORK/first.log"; fail "no stop line"; }
"$SHARDLM" inspect "$WORK/run" > /dev/null || fail "no valid checkpoint after SIGTERM"

# A preparation that fails writes nothing under --out.
printf '%s\n' '{"messages": [{"role": "user", "content": "x"}]}' > "$WORK/noanswer.jsonl"
expect_error "no assistant turn" "$SHARDLM" sft "${SFT[@]}" --dataset "$WORK/noanswer.jsonl" --steps 1 --out "$WORK/bad"
[ ! -e "$WORK/bad" ] || fail "a failed preparation left $(find "$WORK/bad")"

# launch restarts sft: rank 1 dies at step 7 (after the checkpoint at 5).
JOB=(sft "${SFT[@]}" --dataset "$WORK/a.jsonl" --steps 12 --save-every 5)
"$SHARDLM" launch -n 2 -- "${JOB[@]}" --out "$WORK/clean" > "$WORK/clean.log" 2>&1 \
  || { cat "$WORK/clean.log"; fail "clean sft launch"; }
SHARDLM_FAULT_STEP=1:7 "$SHARDLM" launch -n 2 --max-restarts 2 -- "${JOB[@]}" --out "$WORK/killed" \
  > "$WORK/killed.log" 2>&1 || { cat "$WORK/killed.log"; fail "killed sft job did not complete"; }
grep -q "restarting from .*step_00000005 (restart 1 of 2)" "$WORK/killed.log" \
  || { cat "$WORK/killed.log"; fail "no restart message"; }
[ "$(grep -c "^prepared $WORK/killed/data:" "$WORK/killed.log")" -eq 1 ] \
  || { cat "$WORK/killed.log"; fail "the restart did not reuse the data it prepared"; }
[ "$(digest_of "$WORK/killed")" = "$(digest_of "$WORK/clean")" ] || fail "restarted sft run differs"
echo "1 passed, 0 failed"
