#!/usr/bin/env bash
# One run directory, one job, and nothing a job leaves behind misleads the next one:
# a second job on a directory in use fails at once naming the holder; --resume-if-exists
# starts at step 0 when no checkpoint was committed and cleans what a killed save left;
# metrics.jsonl keeps one record per step across resumes; a diverged update (weights
# not finite) is never committed and the last good checkpoint stays the one loaded;
# export refuses non-finite weights.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
RUN=("${TINY[@]}" --global-batch 8 --data "$WORK/data")

# A second job while the first runs: refused at once, naming the first one's pid.
"$SHARDLM" train "${RUN[@]}" --steps 100000 --out "$WORK/busy" > "$WORK/busy.log" 2>&1 &
first=$!
for _ in $(seq 1 100); do [ -s "$WORK/busy/metrics.jsonl" ] && break; sleep 0.1; done
[ -s "$WORK/busy/metrics.jsonl" ] || { kill "$first"; fail "first job did not start"; }
expect_error "run directory '$WORK/busy' is in use by another job (pid $first on host " \
  "$SHARDLM" train "${RUN[@]}" --steps 100000 --out "$WORK/busy" --resume-if-exists
kill -KILL "$first"; wait "$first" || true  # (SIGTERM would make it save a checkpoint)
[ ! -e "$WORK/busy/checkpoints" ] || fail "the refused job wrote checkpoints"
# The lock went with its holder (however it ended): the directory is usable again.
"$SHARDLM" train "${RUN[@]}" --steps 2 --out "$WORK/busy" --resume-if-exists > /dev/null \
  || fail "run directory still locked after its job ended"

# Restart before the first checkpoint: a save killed before its commit leaves a
# temporary directory and no checkpoint; --resume-if-exists starts at step 0, removes
# the temporary and ends where an uninterrupted run ends.
"$SHARDLM" train "${RUN[@]}" --steps 8 --save-every 4 --out "$WORK/clean" > /dev/null
rc=0
SHARDLM_FAULT=ckpt_before_rename:exit "$SHARDLM" train "${RUN[@]}" --steps 8 --save-every 4 \
  --out "$WORK/restart" > /dev/null 2>&1 || rc=$?
[ "$rc" -eq 43 ] || fail "expected the injected exit 43, got $rc"
[ -d "$WORK/restart/checkpoints/.tmp-step_00000004" ] || fail "no temporary left by the killed save"
expect_error "--resume: run directory '$WORK/restart' holds no committed checkpoint" \
  "$SHARDLM" train "${RUN[@]}" --steps 8 --save-every 4 --out "$WORK/restart" --resume
"$SHARDLM" train "${RUN[@]}" --steps 8 --save-every 4 --out "$WORK/restart" --resume-if-exists \
  > "$WORK/restart.log" 2>&1 || { cat "$WORK/restart.log"; fail "restart from step 0"; }
# (The temporary is gone as soon as the new job holds the lock; a job that fails before
# its first save shows it: here its Hugging Face weights hold a NaN, which is found only
# when the values are read, after the lock. A missing tensor is found from the file's
# header before the lock, and then nothing under --out is touched.)
SHARDLM_FAULT=ckpt_before_rename:exit "$SHARDLM" train "${RUN[@]}" --steps 8 --save-every 4 \
  --out "$WORK/early_end" > /dev/null 2>&1 || true
[ -d "$WORK/early_end/checkpoints/.tmp-step_00000004" ] || fail "no temporary left by the killed save"
"$SHARDLM" train "${RUN[@]}" --steps 0 --out "$WORK/weights" > /dev/null
"$SHARDLM" export --checkpoint "$WORK/weights" --out "$WORK/hf_broken" > /dev/null
cp -r "$WORK/hf_broken" "$WORK/hf_missing"
python3 - "$WORK/hf_broken/model.safetensors" "$WORK/hf_missing/model.safetensors" <<'PY'
import json, struct, sys
def parts(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    return data, n, json.loads(data[8:8 + n])
# A NaN as the first value of the final norm's bias.
data, n, header = parts(sys.argv[1])
entry = header["transformer.ln_f.bias"]
assert entry["dtype"] == "F32", entry
at = 8 + n + entry["data_offsets"][0]
open(sys.argv[1], "wb").write(data[:at] + struct.pack("<f", float("nan")) + data[at + 4:])
# The same tensor left out of the header.
data, n, header = parts(sys.argv[2])
del header["transformer.ln_f.bias"]
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
expect_error "has no tensor 'transformer.ln_f.bias'" "$SHARDLM" train "${RUN[@]}" --steps 8 \
  --out "$WORK/early_end" --resume-if-exists --init-from "$WORK/hf_missing"
[ -d "$WORK/early_end/checkpoints/.tmp-step_00000004" ] || fail "a job refused before the lock touched --out"
expect_error "tensor 'transformer.ln_f.bias' holds non-finite values" "$SHARDLM" train "${RUN[@]}" --steps 8 \
  --out "$WORK/early_end" --resume-if-exists --init-from "$WORK/hf_broken"
ls -a "$WORK/early_end/checkpoints" | grep -q "tmp" && fail "temporary left after the lock was taken"
if grep -q "resumed from" "$WORK/restart.log"; then fail "resumed from nothing"; fi
ls -a "$WORK/restart/checkpoints" | grep -q "tmp" && fail "temporary directory not cleaned"
[ "$(digest_of "$WORK/restart")" = "$(digest_of "$WORK/clean")" ] || fail "restarted run differs"

# One record per step after a resume from an older checkpoint (steps 5-8 run twice).
rm -rf "$WORK/restart/checkpoints/step_00000008"
"$SHARDLM" train "${RUN[@]}" --steps 8 --save-every 4 --out "$WORK/restart" --resume > /dev/null
python3 - "$WORK/restart/metrics.jsonl" <<'PY' || fail "metrics.jsonl repeats or lacks steps"
import json, sys
steps = [json.loads(line)["step"] for line in open(sys.argv[1])]
assert steps == list(range(1, 9)), steps
PY

# A diverged update is never committed: step 0 is saved, the update at step 1 makes
# every weight infinite, the job stops with the divergence message and step 0 stays
# the checkpoint a resume (or inspect) loads.
HUGE=("${RUN[@]}" --lr 3e38 --weight-decay 10 --grad-clip 0 --warmup 0 --save-every 1)
"$SHARDLM" train "${HUGE[@]}" --steps 0 --out "$WORK/diverged" > /dev/null
good="$(digest_of "$WORK/diverged")"
expect_error "training diverged at step 1: after the update the weights of unit '.*' on rank 0 are not finite; nothing was saved" \
  "$SHARDLM" train "${HUGE[@]}" --steps 2 --out "$WORK/diverged" --resume
[ "$(ls "$WORK/diverged/checkpoints" | grep -c step_)" -eq 1 ] || fail "a diverged state was committed"
[ "$(digest_of "$WORK/diverged")" = "$good" ] || fail "the last good checkpoint changed"

# Export refuses non-finite weights (a checkpoint made non-finite by hand, its
# checksums recomputed so that only the values are wrong).
cp -r "$WORK/clean" "$WORK/nan"
python3 - "$WORK/nan/checkpoints/step_00000008" <<'PY'
import hashlib, json, struct, sys
d = sys.argv[1]
shard = bytearray(open(f"{d}/rank_00000.bin", "rb").read())
struct.pack_into("<f", shard, 0, float("nan"))
open(f"{d}/rank_00000.bin", "wb").write(shard)
m = json.load(open(f"{d}/manifest.json"))
m["shards"][0]["sha256"] = hashlib.sha256(shard).hexdigest()
text = json.dumps(m, indent=1)
open(f"{d}/manifest.json", "w").write(text)
marker = json.load(open(f"{d}/commit.json"))
marker["manifest_sha256"] = hashlib.sha256(text.encode()).hexdigest()
open(f"{d}/commit.json", "w").write(json.dumps(marker))
PY
expect_error "tensor 'transformer.wte.weight' holds non-finite values (NaN or infinity); refusing to export it" \
  "$SHARDLM" export --checkpoint "$WORK/nan" --out "$WORK/nan_hf"
[ ! -e "$WORK/nan_hf" ] || fail "a refused export created its directory"
# So do eval and sample (chat loads through the same check): one line, non-zero.
expect_error "checkpoint '.*step_00000008' tensor 'transformer.wte.weight' holds non-finite values (NaN or infinity); refusing to evaluate it" \
  "$SHARDLM" eval --checkpoint "$WORK/nan" --data "$WORK/data" --seq-len 32 --windows 2
expect_error "tensor 'transformer.wte.weight' holds non-finite values (NaN or infinity); refusing to sample from it" \
  "$SHARDLM" sample --checkpoint "$WORK/nan" --tokens 2
echo "1 passed, 0 failed"
