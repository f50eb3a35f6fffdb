#!/usr/bin/env bash
# One-line errors that name what was wrong and what was expected, and leave no run
# directory: sft --no-truncate with conversations longer than --max-len (the first by
# line and index, its tokens, how many, the longest and the flags that fix it), a
# --dataset that is a directory, --init-from a model of another shape than --model's
# (both shapes named, with the flags that would match them).
source "$(dirname "$0")/lib/common.sh" "$@"
head -n 16 "$SHARED_DATA/sft/gsm8k_train.jsonl" > "$WORK/gsm.jsonl"
SFT=(--model qwen3-tiny --tokenizer "gpt2:$SHARED_DATA/gpt2" --threads 1 --steps 1)

expect_error "gsm.jsonl line [0-9]* (example [0-9]*): the conversation has [0-9]* tokens, more than --max-len 64 (the sequence length), and --no-truncate does not cut it; [0-9]* of the file's 16 examples are longer, the longest [0-9]* tokens (line [0-9]*): raise --max-len to [0-9]* (ms-swift: --max_length), or leave out --no-truncate to cut them to 64 tokens" \
  "$SHARDLM" sft "${SFT[@]}" --dataset "$WORK/gsm.jsonl" --max-len 64 --no-truncate --out "$WORK/x1"
[ ! -e "$WORK/x1" ] || fail "a refused sft left $WORK/x1"
# The figures are right: the longest it names is the --max-len that takes every example
# and one less refuses it again; one less than the first example's count refuses that one.
out="$("$SHARDLM" sft "${SFT[@]}" --dataset "$WORK/gsm.jsonl" --max-len 64 --no-truncate --out "$WORK/x1" 2>&1 >/dev/null || true)"
longest="$(echo "$out" | sed -n 's/.*raise --max-len to \([0-9]*\) .*/\1/p')"
first="$(echo "$out" | sed -n 's/.*(example 1): the conversation has \([0-9]*\) tokens.*/\1/p')"
[ -n "$longest" ] && [ -n "$first" ] || fail "no figures in: $out"
"$SHARDLM" sft "${SFT[@]}" --dataset "$WORK/gsm.jsonl" --max-len "$longest" --no-truncate --steps 0 --out "$WORK/fits" > /dev/null \
  || fail "--max-len $longest (the longest named) does not take every example"
rm -rf "$WORK/fits"
expect_error "the longest $longest tokens" \
  "$SHARDLM" sft "${SFT[@]}" --dataset "$WORK/gsm.jsonl" --max-len "$((longest - 1))" --no-truncate --steps 0 --out "$WORK/fits"
expect_error "(example 1): the conversation has $first tokens" \
  "$SHARDLM" sft "${SFT[@]}" --dataset "$WORK/gsm.jsonl" --max-len "$((first - 1))" --no-truncate --steps 0 --out "$WORK/fits"

# A dataset path that is a directory: named as one, with the JSONL files it holds.
mkdir -p "$WORK/sets" && cp "$WORK/gsm.jsonl" "$WORK/sets/a.jsonl" && cp "$WORK/gsm.jsonl" "$WORK/sets/b.jsonl"
expect_error "dataset '$WORK/sets' is a directory (expected a JSONL file of conversations; it holds a.jsonl, b.jsonl: name each with --dataset)\$" \
  "$SHARDLM" sft "${SFT[@]}" --dataset "$WORK/sets" --max-len 128 --out "$WORK/x2"
mkdir -p "$WORK/empty_dir"
expect_error "dataset '$WORK/empty_dir' is a directory (expected a JSONL file of conversations; --dataset takes files, one flag each)\$" \
  "$SHARDLM" sft "${SFT[@]}" --dataset "$WORK/empty_dir" --max-len 128 --out "$WORK/x2"
[ ! -e "$WORK/x2" ] || fail "a refused sft left $WORK/x2"

# --init-from a model of another shape than --model's preset: both shapes, and how to match.
make_byte_data
"$SHARDLM" train "${TINY[@]}" --steps 0 --data "$WORK/data" --out "$WORK/w32" > /dev/null
"$SHARDLM" export --checkpoint "$WORK/w32" --out "$WORK/hf32" > /dev/null
cp "$WORK/hf32/model.safetensors" "$WORK/bare.safetensors"
expect_error "'$WORK/hf32/config.json' describes another model than the one being trained (n_embd=32 there, 128 here; n_head=2 there, 4 here; n_layer=2 there, 4 here): it is gpt2, 2 layers, 32 wide, 2 heads, vocab 256, context 256; the run's (--model and its flags) is gpt2, 4 layers, 128 wide, 4 heads, vocab 256, context 256; train it with --model $WORK/hf32 (its own shape), or set --n-embd 32 --n-head 2 --n-layer 2\$" \
  "$SHARDLM" train --model gpt2-tiny --seq-len 32 --steps 1 --data "$WORK/data" --out "$WORK/x3" --init-from "$WORK/hf32"
expect_error "'$WORK/bare.safetensors' tensor 'transformer.wte.weight' has shape \[256, 32\], expected \[256, 128\] for the model being trained (gpt2, 4 layers, 128 wide, 4 heads, vocab 256, context 256)\$" \
  "$SHARDLM" train --model gpt2-tiny --seq-len 32 --steps 1 --data "$WORK/data" --out "$WORK/x3" --init-from "$WORK/bare.safetensors"
expect_error "has no tensor 'transformer.h.2.ln_1.weight', which the model being trained (gpt2, 4 layers, 32 wide, 2 heads, vocab 256, context 256) needs" \
  "$SHARDLM" train "${TINY[@]}" --n-layer 4 --steps 1 --data "$WORK/data" --out "$WORK/x3" --init-from "$WORK/bare.safetensors"
[ ! -e "$WORK/x3" ] || fail "a refused import left $WORK/x3"
echo "1 passed, 0 failed"
