#!/usr/bin/env bash
# Export to a Hugging Face GPT-2 directory and back: `--init-from` round trip keeps
# every weight bit; transformers (when installed) loads the export and its loss on
# the same tokens matches shardlm's; bad weights are refused by name.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
"$SHARDLM" train "${TINY[@]}" --global-batch 8 --steps 5 --data "$WORK/data" --out "$WORK/run" > /dev/null
"$SHARDLM" export --checkpoint "$WORK/run" --out "$WORK/hf" > /dev/null
[ -s "$WORK/hf/model.safetensors" ] && [ -s "$WORK/hf/config.json" ] || fail "export files"
grep -q '"model_type": "gpt2"' "$WORK/hf/config.json" || fail "config.json model_type"
expect_error "already exists" "$SHARDLM" export --checkpoint "$WORK/run" --out "$WORK/hf"
# A directory holding the user's own config.json is not written into.
mkdir "$WORK/mine" && echo '{"mine": true}' > "$WORK/mine/config.json"
expect_error "'$WORK/mine/config.json' already exists (export never overwrites; choose another --out)" \
  "$SHARDLM" export --checkpoint "$WORK/run" --out "$WORK/mine"
[ "$(cat "$WORK/mine/config.json")" = '{"mine": true}' ] && [ ! -e "$WORK/mine/model.safetensors" ] \
  || fail "export wrote into a directory holding a config.json"
# A failed export (disk full) leaves no temporary file and no directory it created.
rc=0
(trap '' XFSZ; ulimit -f 16; "$SHARDLM" export --checkpoint "$WORK/run" --out "$WORK/full/hf") \
  > /dev/null 2> "$WORK/full.err" || rc=$?
[ "$rc" -ne 0 ] && grep -q "^error: .*model.safetensors" "$WORK/full.err" || { cat "$WORK/full.err"; fail "disk-full export"; }
[ ! -e "$WORK/full" ] || fail "a failed export left $(find "$WORK/full")"
[ ! -e "$WORK/hf/.export.lock" ] || fail "a finished export left its lock file"
# A temporary left by an export that was killed is removed by the next export into OUT.
sh -c 'exit 0' & dead=$!; wait "$dead"
mkdir -p "$WORK/hf2/.export-tmp-$dead" && touch "$WORK/hf2/.export-tmp-$dead/model.safetensors"
"$SHARDLM" export --checkpoint "$WORK/run" --out "$WORK/hf2" 2> "$WORK/hf2.err" > /dev/null || fail "export into hf2"
[ ! -e "$WORK/hf2/.export-tmp-$dead" ] && grep -q "removed '.*\.export-tmp-$dead' (left by an export that did not finish)" "$WORK/hf2.err" \
  || fail "a dead export's temporary was not removed: $(cat "$WORK/hf2.err")"
cmp -s "$WORK/hf/model.safetensors" "$WORK/hf2/model.safetensors" || fail "two exports of one checkpoint differ"
# One export at a time into OUT: a held lock is refused by name; of two concurrent exports one
# writes and the other is refused (busy, or its files exist), never both.
# (The test holds the lock itself: a background `flock FILE sleep` creates the file
# before it holds the lock, so waiting for the file raced the export.)
mkdir -p "$WORK/busy"
exec {holder}> "$WORK/busy/.export.lock"
flock -n "$holder" || fail "could not lock $WORK/busy/.export.lock"
expect_error "'$WORK/busy' is in use by another export" "$SHARDLM" export --checkpoint "$WORK/run" --out "$WORK/busy"
exec {holder}>&-
for i in 1 2 3 4 5; do
  "$SHARDLM" export --checkpoint "$WORK/run" --out "$WORK/race$i" > /dev/null 2>&1 & first=$!
  "$SHARDLM" export --checkpoint "$WORK/run" --out "$WORK/race$i" > /dev/null 2>&1 & second=$!
  ok=0; wait "$first" && ok=$((ok + 1)); wait "$second" && ok=$((ok + 1))
  [ "$ok" -eq 1 ] || fail "$ok of two concurrent exports into one --out succeeded (expected 1)"
  cmp -s "$WORK/hf/model.safetensors" "$WORK/race$i/model.safetensors" || fail "concurrent exports mixed their files"
done
checkpoint_dir="$(dirname "$(find "$WORK/run" -name manifest.json | sort | tail -n 1)")"
expect_error "is inside the checkpoint being exported" "$SHARDLM" export --checkpoint "$WORK/run" --out "$checkpoint_dir/hf"
[ ! -e "$checkpoint_dir/hf" ] || fail "a refused export wrote into the checkpoint"
expect_error "--max-shard-size 1000 bytes is smaller than tensor" "$SHARDLM" export --checkpoint "$WORK/run" \
  --max-shard-size 0.000001 --out "$WORK/tiny_shards"
[ ! -e "$WORK/tiny_shards" ] || fail "a refused export created its --out"

want="$(digest_of "$WORK/run")"
"$SHARDLM" train "${TINY[@]}" --steps 0 --data "$WORK/data" --out "$WORK/from_dir" --init-from "$WORK/hf" > /dev/null
[ "$(digest_of "$WORK/from_dir")" = "$want" ] || fail "init-from directory changed the weights"
cp "$WORK/hf/model.safetensors" "$WORK/bare.safetensors"
"$SHARDLM" train "${TINY[@]}" --steps 0 --data "$WORK/data" --out "$WORK/from_file" --init-from "$WORK/bare.safetensors" > /dev/null
[ "$(digest_of "$WORK/from_file")" = "$want" ] || fail "init-from file changed the weights"
# Training goes on from imported weights.
"$SHARDLM" train "${TINY[@]}" --steps 3 --data "$WORK/data" --out "$WORK/tuned" --init-from "$WORK/hf" > /dev/null \
  || fail "training from imported weights"

expect_error "config.json' describes another model than the one being trained (n_embd=32 there, 64 here): .*, or set --n-embd 32\$" \
  "$SHARDLM" train "${TINY[@]}" --n-embd 64 --steps 0 --data "$WORK/data" --out "$WORK/x1" --init-from "$WORK/hf"
expect_error "tensor 'transformer.wte.weight' has shape \[256, 32\], expected \[256, 64\] for the model being trained (gpt2, 2 layers, 64 wide" \
  "$SHARDLM" train "${TINY[@]}" --n-embd 64 --steps 0 --data "$WORK/data" --out "$WORK/x2" --init-from "$WORK/bare.safetensors"
expect_error "not found" "$SHARDLM" train "${TINY[@]}" --steps 0 --data "$WORK/data" --out "$WORK/x3" --init-from "$WORK/nothing"
for x in x1 x2 x3; do [ ! -e "$WORK/$x" ] || fail "a refused import left the run directory $x"; done

# Every config field that changes the computation is honoured or refused by name.
edit_config() {  # edit_config DIR python-statement-on-c
  rm -rf "$1" && cp -r "$WORK/hf" "$1"
  python3 - "$1/config.json" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); exec(sys.argv[2]); json.dump(c, open(sys.argv[1], "w"))
PY
}
while IFS='|' read -r edit message; do
  edit_config "$WORK/edited" "$edit"
  expect_error "$message" "$SHARDLM" train "${TINY[@]}" --steps 0 --data "$WORK/data" --out "$WORK/x4" --init-from "$WORK/edited"
done <<'CASES'
c["activation_function"] = "relu"|has activation_function="relu", but shardlm computes only "gelu_new" or "gelu_pytorch_tanh"
c["layer_norm_epsilon"] = 1e-6|has layer_norm_epsilon=1e-06, but shardlm computes only 1e-05
c["scale_attn_by_inverse_layer_idx"] = True|has scale_attn_by_inverse_layer_idx=true, but shardlm computes only false
c["scale_attn_weights"] = False|has scale_attn_weights=false, but shardlm computes only true
c["reorder_and_upcast_attn"] = True|has reorder_and_upcast_attn=true, but shardlm computes only false
c["tie_word_embeddings"] = False|describes another model than the one being trained (tie_embeddings=false there, true here)
c["n_positions"] = 64; c["n_ctx"] = 64|describes another model than the one being trained (max_seq_len=64 there, 256 here): .*, or set --context-len 64$
c["rotary_dim"] = 8|has field 'rotary_dim'=8, which shardlm does not know
CASES
# An untied head stored beside a tied model's embedding is refused, not dropped.
python3 - "$WORK/hf/model.safetensors" "$WORK/untied.safetensors" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n]); body = bytearray(data[8 + n:])
wte = header["transformer.wte.weight"]
start, end = wte["data_offsets"]
head = bytearray(body[start:end]); head[0:4] = struct.pack("<f", 0.5)  # differs from wte
header["lm_head.weight"] = {"dtype": "F32", "shape": wte["shape"], "data_offsets": [len(body), len(body) + len(head)]}
body += head
text = json.dumps(header).encode(); text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + bytes(body))
PY
expect_error "holds an lm_head.weight that differs from the token embedding (an untied head), but the model being trained ties them" \
  "$SHARDLM" train "${TINY[@]}" --steps 0 --data "$WORK/data" --out "$WORK/x5" --init-from "$WORK/untied.safetensors"
# The context length is a flag (--context-len): a 64-position GPT-2 exports and imports.
"$SHARDLM" train "${TINY[@]}" --context-len 64 --steps 2 --data "$WORK/data" --out "$WORK/ctx64" > /dev/null
"$SHARDLM" export --checkpoint "$WORK/ctx64" --out "$WORK/ctx64_hf" > /dev/null
grep -q '"n_positions": 64' "$WORK/ctx64_hf/config.json" || fail "n_positions not 64"
"$SHARDLM" train "${TINY[@]}" --context-len 64 --steps 0 --data "$WORK/data" --out "$WORK/ctx64_in" \
  --init-from "$WORK/ctx64_hf" > /dev/null || fail "import of a 64-position model"
[ "$(digest_of "$WORK/ctx64_in")" = "$(digest_of "$WORK/ctx64")" ] || fail "64-position round trip changed weights"

# transformers loads the export: same loss on the same 16 windows of val.bin.
ours="$("$SHARDLM" eval --checkpoint "$WORK/run" --data "$WORK/data" --seq-len 32 --windows 16 | awk '/^loss:/ {print $2}')"
rc=0
theirs="$("${SHARDLM_REF_PYTHON:-/usr/bin/python3}" "$(dirname "$0")/../../tools/check_hf_export.py" "$WORK/hf" "$WORK/data/val.bin" 32 16 2>&1)" || rc=$?
if [ "$rc" -eq 77 ] || [ ! -x "${SHARDLM_REF_PYTHON:-/usr/bin/python3}" ]; then
  echo "$theirs"
else
  [ "$rc" -eq 0 ] || { echo "$theirs"; fail "transformers could not load the export"; }
  theirs="$(echo "$theirs" | awk '/^loss:/ {print $2}')"
  python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 1e-5*abs(b) else 1)" \
    "$ours" "$theirs" || fail "loss differs: shardlm $ours, transformers $theirs"
  echo "transformers loss $theirs, shardlm loss $ours"
fi
echo "1 passed, 0 failed"
