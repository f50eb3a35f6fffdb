#!/usr/bin/env bash
# ms-swift's spellings of sft's flags (cli/swift_flags.cpp, docs/sft.md): the seeds' command
# lines resolve to the same RUN/config.json as shardlm's own spelling; a known ms-swift flag
# shardlm does not implement, a value it cannot map and a --model_type that is no preset
# are one-line errors naming them (never CLI11's "unexpected argument").
source "$(dirname "$0")/lib/common.sh" "$@"
head -n 16 "$SHARED_DATA/sft/gsm8k_train.jsonl" > "$WORK/gsm.jsonl"
BASE=(--tokenizer "gpt2:$SHARED_DATA/gpt2" --dataset "$WORK/gsm.jsonl" --threads 1 --warmup 0)

# RUN/config.json without what names the run's own directory.
config_of() {
  python3 - "$1" <<'PY'
import json, sys
run = sys.argv[1]
def strip(v):
    if isinstance(v, dict): return {k: strip(x) for k, x in v.items() if not (isinstance(x, str) and run in x)}
    if isinstance(v, list): return [strip(x) for x in v]
    return v
print(json.dumps(strip(json.load(open(run + "/config.json"))), sort_keys=True))
PY
}

same_config() {  # name, shardlm flags..., "--", ms-swift flags...
  local name="$1"; shift
  local ours=() theirs=()
  while [ "$1" != "--" ]; do ours+=("$1"); shift; done; shift
  theirs=("$@")
  "$SHARDLM" sft "${BASE[@]}" "${ours[@]}" --out "$WORK/${name}_shardlm" > "$WORK/${name}_shardlm.log" 2>&1 \
    || { cat "$WORK/${name}_shardlm.log"; fail "$name: shardlm spelling"; }
  "$SHARDLM" sft "${BASE[@]}" "${theirs[@]}" --output_dir "$WORK/${name}_swift" > "$WORK/${name}_swift.log" 2>&1 \
    || { cat "$WORK/${name}_swift.log"; fail "$name: ms-swift spelling"; }
  [ "$(config_of "$WORK/${name}_shardlm")" = "$(config_of "$WORK/${name}_swift")" ] \
    || { diff <(config_of "$WORK/${name}_shardlm" | tr ',' '\n') <(config_of "$WORK/${name}_swift" | tr ',' '\n'); fail "$name: the configs differ"; }
}

# LoRA, DeepSpeed ZeRO-2, checkpointing, flash attention, bf16, accumulation.
same_config lora \
  --model qwen3-tiny --strategy zero2 --lora-rank 4 --lora-alpha 8 --activation-checkpointing \
  --max-len 128 --steps 1 --micro-batch 2 --grad-accum 2 --lr 2e-4 --precision bf16 -- \
  --model_type qwen3-tiny --deepspeed zero2 --train_type lora --lora_rank 4 --lora_alpha 8 \
  --gradient_checkpointing true --use_flash_attn true --max_length 128 --max_steps 1 \
  --per_device_train_batch_size 2 --gradient_accumulation_steps 2 --learning_rate 2e-4 --torch_dtype bfloat16
# Full fine-tuning, FSDP full_shard, epochs, mixed_precision, today's --tuner_type.
same_config full \
  --model qwen3-tiny --strategy zero3 --lora-rank 0 --max-len 128 --epochs 1 --micro-batch 4 \
  --lr 1e-4 --precision bf16 -- \
  --model_type qwen3-tiny --fsdp 'full_shard auto_wrap' --tuner_type full --sequence_length 128 \
  --num_train_epochs 1 --per_device_train_batch_size 4 --learning_rate 1e-4 --mixed_precision bf16
# shard_grad_op and DeepSpeed zero3, and --train_type lora's default rank (ms-swift's 8).
same_config grad_op --model qwen3-tiny --strategy zero2 --max-len 128 --steps 1 -- \
  --model qwen3-tiny --fsdp shard_grad_op --max_length 128 --max_steps 1
same_config zero3 --model qwen3-tiny --strategy zero3 --lora-rank 8 --max-len 128 --steps 1 -- \
  --model qwen3-tiny --deepspeed zero3 --train_type lora --max_length 128 --max_steps 1
grep -q '"strategy": *"zero3"' "$WORK/zero3_swift/config.json" || fail "--deepspeed zero3 did not run zero3"

# The seed's own line: no qwen3-7b exists; the nearest preset is named.
expect_error "--model_type 'qwen3-7b' is no shardlm preset; the nearest is qwen3-8b" \
  "$SHARDLM" sft --model_type qwen3-7b --dataset mydata --fsdp 'full_shard' --mixed_precision bf16 --output_dir "$WORK/x"
expect_error "ms-swift's --lora_dropout is not implemented by shardlm sft" \
  "$SHARDLM" sft "${BASE[@]}" --model qwen3-tiny --lora_dropout 0.05 --out "$WORK/x"
expect_error "ms-swift's --warmup_ratio is not implemented by shardlm sft" \
  "$SHARDLM" sft "${BASE[@]}" --model qwen3-tiny --warmup_ratio=0.1 --out "$WORK/x"
expect_error "ms-swift's --deepspeed zero3_offload: shardlm sft maps" \
  "$SHARDLM" sft "${BASE[@]}" --model qwen3-tiny --deepspeed zero3_offload --out "$WORK/x"
expect_error "ms-swift's --use_flash_attn takes true or false, got 'maybe'" \
  "$SHARDLM" sft "${BASE[@]}" --model qwen3-tiny --use_flash_attn maybe --out "$WORK/x"
expect_error "both set --lr" \
  "$SHARDLM" sft "${BASE[@]}" --model qwen3-tiny --lr 1e-3 --learning_rate 1e-4 --out "$WORK/x"
expect_error "both set --precision" \
  "$SHARDLM" sft "${BASE[@]}" --model qwen3-tiny --torch_dtype bfloat16 --mixed_precision fp16 --out "$WORK/x"
[ ! -e "$WORK/x" ] || fail "a refused command created its run directory"
echo "1 passed, 0 failed"
