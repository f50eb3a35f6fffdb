#!/usr/bin/env bash
# A disk that fills at a save (simulated: SHARDLM_FAULT_DISK_FULL=SUBSTRING fails every
# write to a path containing it with ENOSPC, core/fault_injection.hpp): one error line
# naming the file and the reason; a job that ends before the run directory holds a
# committed checkpoint takes back what it wrote (config.json, config.toml, metrics.jsonl,
# RUN/tb, sft's RUN/data, the directory itself when it made it) and nothing blocks a
# rerun; a job whose run already holds a checkpoint keeps everything, and resumes.
# (tests/cli/disk_full_tmpfs.sh does the same on a real full file system, where it can.)
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
RUN=("${TINY[@]}" --global-batch 8 --data "$WORK/data")

# A fresh directory: nothing is left of it.
SHARDLM_FAULT_DISK_FULL=/checkpoints/ expect_error \
  "cannot write '$WORK/fresh/checkpoints/.tmp-step_00000002/rank_00000.bin': No space left on device (no checkpoint was committed: removed what this job wrote in '$WORK/fresh')\$" \
  "$SHARDLM" train "${RUN[@]}" --steps 2 --tensorboard --out "$WORK/fresh"
[ ! -e "$WORK/fresh" ] || fail "a job that never committed a checkpoint left $(ls -A "$WORK/fresh")"
rc=0
SHARDLM_FAULT_DISK_FULL=/checkpoints/ "$SHARDLM" train "${RUN[@]}" --steps 2 --out "$WORK/fresh" \
  > /dev/null 2> "$WORK/fresh.err" || rc=$?
[ "$rc" -ne 0 ] && [ "$(grep -c . "$WORK/fresh.err")" -eq 1 ] || fail "expected one error line, got: $(cat "$WORK/fresh.err")"

# A directory that existed (with a file of the user's): only what was there stays, and
# the same command then runs.
mkdir -p "$WORK/existing" && echo notes > "$WORK/existing/notes.txt"
SHARDLM_FAULT_DISK_FULL=/checkpoints/ expect_error "rank_00000.bin': No space left on device" \
  "$SHARDLM" train "${RUN[@]}" --steps 2 --tensorboard --out "$WORK/existing"
left="$(ls -A "$WORK/existing" | tr '\n' ' ')"
[ "$left" = "notes.txt run.lock " ] || fail "expected only notes.txt and the lock file, got: $left"
"$SHARDLM" train "${RUN[@]}" --steps 2 --out "$WORK/existing" > /dev/null || fail "the rerun failed"
[ "$(metric "$WORK/existing" step)" = 2 ] || fail "the rerun's metrics"
[ "$(cat "$WORK/existing/notes.txt")" = notes ] || fail "the user's file changed"

# sft: its prepared data goes too.
head -n 16 "$SHARED_DATA/sft/gsm8k_train.jsonl" > "$WORK/gsm.jsonl"
SFT=(--model qwen3-tiny --tokenizer "gpt2:$SHARED_DATA/gpt2" --dataset "$WORK/gsm.jsonl" --max-len 128
     --threads 1 --micro-batch 4 --global-batch 8 --steps 1 --eval-batches 1)
SHARDLM_FAULT_DISK_FULL=/checkpoints/ expect_error "rank_00000.bin': No space left on device" \
  "$SHARDLM" sft "${SFT[@]}" --out "$WORK/sft"
[ ! -e "$WORK/sft" ] || fail "a failed sft left $(ls -A "$WORK/sft")"

# A run with a committed checkpoint keeps everything when a later save fails, and resumes.
SHARDLM_FAULT_DISK_FULL=step_00000002 expect_error "step_00000002/rank_00000.bin': No space left on device\$" \
  "$SHARDLM" train "${RUN[@]}" --steps 2 --save-every 1 --out "$WORK/kept"
for f in config.json config.toml metrics.jsonl checkpoints/step_00000001/commit.json; do
  [ -e "$WORK/kept/$f" ] || fail "a run with a committed checkpoint lost $f"
done
[ "$(metric "$WORK/kept" step)" = 1 ] || fail "step 1's record is gone"
"$SHARDLM" train "${RUN[@]}" --steps 2 --save-every 1 --out "$WORK/kept" --resume > "$WORK/kept.log" \
  || fail "resume after the failed save"
grep -q "resumed from .*step_00000001" "$WORK/kept.log" || fail "did not resume from step 1"
echo "1 passed, 0 failed"
