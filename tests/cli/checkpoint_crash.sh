#!/usr/bin/env bash
# Checkpoints survive crashes and bad disks: a process killed at each stage of a save
# before its commit marker leaves the previous checkpoint the newest committed one,
# intact and resumable; killed after the marker (before the `latest` hint moved), the
# new checkpoint is committed and loaded; --resume skips a corrupt newest checkpoint
# with a warning; a full disk or an unwritable checkpoint directory is a clear error
# that never commits a partial checkpoint.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
RUN=("${TINY[@]}" --global-batch 8 --data "$WORK/data" --save-every 5)
"$SHARDLM" train "${RUN[@]}" --steps 10 --out "$WORK/clean" > /dev/null
for point in ckpt_after_shard_files ckpt_before_rename ckpt_before_commit_marker ckpt_before_latest; do
  out="$WORK/crash_$point"
  # A run of 10 steps that dies at step 6, after its step-5 checkpoint.
  SHARDLM_FAULT_STEP=0:6 "$SHARDLM" train "${RUN[@]}" --steps 10 --out "$out" > /dev/null 2>&1 || true
  good="$(digest_of "$out")"
  rc=0
  SHARDLM_FAULT="$point:exit" "$SHARDLM" train "${RUN[@]}" --steps 10 --out "$out" --resume \
    > /dev/null 2>&1 || rc=$?
  [ "$rc" -eq 43 ] || fail "$point: expected the injected exit 43, got $rc"
  [ "$(cat "$out/checkpoints/latest")" = "step_00000005" ] || fail "$point: latest moved"
  if [ "$point" = ckpt_before_latest ]; then
    [ "$(digest_of "$out")" = "$(digest_of "$WORK/clean")" ] || fail "$point: committed step 10 not loaded"
    continue
  fi
  [ "$(digest_of "$out")" = "$good" ] || fail "$point: previous checkpoint changed"
  "$SHARDLM" train "${RUN[@]}" --steps 10 --out "$out" --resume > "$out.log" 2>&1 \
    || { cat "$out.log"; fail "$point: resume failed"; }
  [ "$(digest_of "$out")" = "$(digest_of "$WORK/clean")" ] || fail "$point: resumed run differs"
done

# Corrupt newest checkpoint: --resume warns, names it, and falls back to the older one.
out="$WORK/corrupt"
"$SHARDLM" train "${RUN[@]}" --steps 10 --out "$out" > /dev/null
printf 'garbage' | dd of="$out/checkpoints/step_00000010/rank_00000.bin" bs=1 seek=100 conv=notrunc 2> /dev/null
expect_error "sha256" "$SHARDLM" inspect "$out/checkpoints/step_00000010"
"$SHARDLM" train "${RUN[@]}" --steps 10 --out "$out" --resume > "$out.log" 2>&1 || { cat "$out.log"; fail "fallback"; }
grep -q "warning: skipping checkpoint '.*step_00000010': .*sha256" "$out.log" || { cat "$out.log"; fail "no warning"; }
grep -q "resumed from .*step_00000005" "$out.log" || fail "did not fall back to step 5"
[ "$(digest_of "$out")" = "$(digest_of "$WORK/clean")" ] || fail "fallback resume differs"

# Disk full (a file size limit; SIGXFSZ ignored so write() fails with EFBIG).
out="$WORK/full"
SHARDLM_FAULT_STEP=0:6 "$SHARDLM" train "${RUN[@]}" --steps 10 --out "$out" > /dev/null 2>&1 || true
good="$(digest_of "$out")"
rc=0
(trap '' XFSZ; ulimit -f 16; "$SHARDLM" train "${RUN[@]}" --steps 10 --out "$out" --resume) \
  > /dev/null 2> "$out.err" || rc=$?
[ "$rc" -ne 0 ] || fail "disk full: exit 0"
grep -q "^error: cannot write .*rank_00000.bin" "$out.err" || { cat "$out.err"; fail "disk full message"; }
[ "$(cat "$out/checkpoints/latest")" = "step_00000005" ] && [ "$(digest_of "$out")" = "$good" ] \
  || fail "disk full damaged the last checkpoint"
ls -a "$out/checkpoints" | grep -q "tmp" && fail "disk full left a temporary directory"

# Checkpoint directory not writable (a file where the directory should be).
mkdir -p "$WORK/blocked" && : > "$WORK/blocked/checkpoints"
expect_error "checkpoint" "$SHARDLM" train "${RUN[@]}" --steps 5 --out "$WORK/blocked"
[ -f "$WORK/blocked/checkpoints" ] || fail "the blocking file was replaced"
echo "1 passed, 0 failed"
