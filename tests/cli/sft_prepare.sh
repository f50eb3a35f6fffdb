#!/usr/bin/env bash
# prepare --sft end to end: GSM8K with the qwen.tiktoken tokenizer (chatml by default),
# the summary line and meta.json, and one-line errors for bad chat data and flags.
source "$(dirname "$0")/lib/common.sh" "$@"
TOK="tiktoken:$SHARED_DATA/qwen/qwen.tiktoken"
out="$("$SHARDLM" prepare --sft --tokenizer "$TOK" --input "$SHARED_DATA/sft/gsm8k_test.jsonl" \
        --val-fraction 0.1 --max-len 200 --out "$WORK/sft")"
# 1319 lines; one prompt is so long that --max-len 200 leaves no answer token: dropped.
echo "$out" | grep -q "prepared $WORK/sft: 1187 train examples.* 131 val examples.*, 1 dropped" || fail "unexpected summary: $out"
echo "$out" | grep -q "template chatml" || fail "expected chatml: $out"
grep -q '"kind": "sft"' "$WORK/sft/meta.json" || fail "meta.json has no kind sft"
grep -q "\"val_examples\": 131" "$WORK/sft/meta.json" || fail "expected 131 val examples (floor(1318 * 0.1))"
[ -s "$WORK/sft/train.sft" ] && [ -s "$WORK/sft/val.sft" ] || fail "missing train.sft/val.sft"

printf '%s\n' '{"prompt": "q", "response": "r"}' '{"prompt": ' > "$WORK/bad.jsonl"
expect_error "bad.jsonl line 2: malformed JSON" "$SHARDLM" prepare --sft --tokenizer "$TOK" --input "$WORK/bad.jsonl" --out "$WORK/s2"
printf '%s\n' '{"messages": [{"role": "narrator", "content": "x"}]}' > "$WORK/role.jsonl"
expect_error "role.jsonl line 1 message 0: unknown role" "$SHARDLM" prepare --sft --tokenizer "$TOK" --input "$WORK/role.jsonl" --out "$WORK/s2"
printf '%s\n' '{"messages": [{"role": "user", "content": "x"}]}' > "$WORK/noanswer.jsonl"
expect_error "no assistant turn" "$SHARDLM" prepare --sft --tokenizer "$TOK" --input "$WORK/noanswer.jsonl" --out "$WORK/s2"
: > "$WORK/empty.jsonl"
expect_error "has no examples" "$SHARDLM" prepare --sft --tokenizer "$TOK" --input "$WORK/empty.jsonl" --out "$WORK/s2"
expect_error "unknown chat template 'zephyr'" "$SHARDLM" prepare --sft --template zephyr --tokenizer "$TOK" --input "$SHARED_DATA/sft/gsm8k_test.jsonl" --out "$WORK/s2"
expect_error "line 1 (example 1): the conversation has 156 tokens, more than --max-len 10" "$SHARDLM" prepare --sft --max-len 10 --no-truncate --tokenizer "$TOK" --input "$SHARED_DATA/sft/gsm8k_test.jsonl" --out "$WORK/s2"
expect_error "--template applies to chat datasets only" "$SHARDLM" prepare --template chatml --tokenizer byte --input "$SHARED_DATA/sft/gsm8k_test.jsonl" --out "$WORK/s2"
expect_error "already holds a prepared dataset" "$SHARDLM" prepare --sft --tokenizer "$TOK" --input "$SHARED_DATA/sft/gsm8k_test.jsonl" --out "$WORK/sft"
[ ! -e "$WORK/s2/meta.json" ] || fail "a failed prepare left meta.json behind"
echo "sft_prepare: ok"
