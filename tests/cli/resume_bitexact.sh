#!/usr/bin/env bash
# 20 steps straight vs 10 steps + resume to 20: identical weights digests.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
"$SHARDLM" train "${TINY[@]}" --data "$WORK/data" --out "$WORK/straight" --steps 20 \
  --global-batch 8 > /dev/null
"$SHARDLM" train "${TINY[@]}" --data "$WORK/data" --out "$WORK/split" --steps 20 \
  --global-batch 8 --save-every 10 > /dev/null
# Drop the final checkpoint so the resume starts from step 10.
rm -rf "$WORK/split/checkpoints/step_00000020"
echo step_00000010 > "$WORK/split/checkpoints/latest"
"$SHARDLM" train "${TINY[@]}" --data "$WORK/data" --out "$WORK/split" --steps 20 \
  --global-batch 8 --save-every 10 --resume > "$WORK/resume.log"
grep -q "resumed from" "$WORK/resume.log" || fail "did not resume"
a="$(digest_of "$WORK/straight")"
b="$(digest_of "$WORK/split")"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "digests differ: straight $a vs resumed $b"
# Metrics: one line per step, with the required fields.
lines=$(wc -l < "$WORK/straight/metrics.jsonl")
[ "$lines" -eq 20 ] || fail "metrics.jsonl has $lines lines, expected 20"
for field in step loss lr grad_norm tokens_per_s step_ms mem val_loss; do
  grep -q "\"$field\"" "$WORK/straight/metrics.jsonl" || fail "metrics lack $field"
done
echo "1 passed, 0 failed"
