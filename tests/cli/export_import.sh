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

want="$(digest_of "$WORK/run")"
"$SHARDLM" train "${TINY[@]}" --steps 0 --data "$WORK/data" --out "$WORK/from_dir" --init-from "$WORK/hf" > /dev/null
[ "$(digest_of "$WORK/from_dir")" = "$want" ] || fail "init-from directory changed the weights"
cp "$WORK/hf/model.safetensors" "$WORK/bare.safetensors"
"$SHARDLM" train "${TINY[@]}" --steps 0 --data "$WORK/data" --out "$WORK/from_file" --init-from "$WORK/bare.safetensors" > /dev/null
[ "$(digest_of "$WORK/from_file")" = "$want" ] || fail "init-from file changed the weights"
# Training goes on from imported weights.
"$SHARDLM" train "${TINY[@]}" --steps 3 --data "$WORK/data" --out "$WORK/tuned" --init-from "$WORK/hf" > /dev/null \
  || fail "training from imported weights"

expect_error "config.json' has n_embd=32, but the model being trained has 64" \
  "$SHARDLM" train "${TINY[@]}" --n-embd 64 --steps 0 --data "$WORK/data" --out "$WORK/x1" --init-from "$WORK/hf"
expect_error "tensor 'transformer.wte.weight' has shape \[256, 32\], expected \[256, 64\]" \
  "$SHARDLM" train "${TINY[@]}" --n-embd 64 --steps 0 --data "$WORK/data" --out "$WORK/x2" --init-from "$WORK/bare.safetensors"
expect_error "not found" "$SHARDLM" train "${TINY[@]}" --steps 0 --data "$WORK/data" --out "$WORK/x3" --init-from "$WORK/nothing"

# transformers loads the export: same loss on the same 16 windows of val.bin.
ours="$("$SHARDLM" eval --checkpoint "$WORK/run" --data "$WORK/data" --seq-len 32 --windows 16 | awk '/^loss:/ {print $2}')"
rc=0
theirs="$(/usr/bin/python3 "$(dirname "$0")/../../tools/check_hf_export.py" "$WORK/hf" "$WORK/data/val.bin" 32 16 2>&1)" || rc=$?
if [ "$rc" -eq 77 ] || [ ! -x /usr/bin/python3 ]; then
  echo "$theirs"
else
  [ "$rc" -eq 0 ] || { echo "$theirs"; fail "transformers could not load the export"; }
  theirs="$(echo "$theirs" | awk '/^loss:/ {print $2}')"
  python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 1e-5*abs(b) else 1)" \
    "$ours" "$theirs" || fail "loss differs: shardlm $ours, transformers $theirs"
  echo "transformers loss $theirs, shardlm loss $ours"
fi
echo "1 passed, 0 failed"
