#!/usr/bin/env bash
# `shardlm sft` end to end on real chat data (GSM8K problems): prepare into RUN/data and
# train in one command, padded and packed rows, --epochs, ddp and zero3 bitwise equal at
# N=2 with packing, a LoRA run exported as an adapter, resume (and a refused resume on
# other data), --strategy auto, Qwen's ChatML by default with Qwen's BPE, and one-line errors for bad flags.
# Most runs use GPT-2's BPE (plain template): a 50k vocabulary keeps the tiny model's LM
# head 3x cheaper than Qwen's 152k.
source "$(dirname "$0")/lib/common.sh" "$@"
head -n 64 "$SHARED_DATA/sft/gsm8k_train.jsonl" > "$WORK/gsm.jsonl"
head -n 8 "$SHARED_DATA/sft/gsm8k_test.jsonl" > "$WORK/gsm_val.jsonl"
SFT=(--model qwen3-tiny --tokenizer "gpt2:$SHARED_DATA/gpt2" --dataset "$WORK/gsm.jsonl" --max-len 128
     --threads 1 --lr 3e-3 --warmup 1 --eval-batches 1)

# Padded rows, one epoch: steps = ceil(rows / global batch) = ceil(64 / 16).
"$SHARDLM" sft "${SFT[@]}" --val-dataset "$WORK/gsm_val.jsonl" --micro-batch 8 --global-batch 16 \
  --epochs 1 --out "$WORK/padded" > "$WORK/padded.log" 2>&1 || { cat "$WORK/padded.log"; fail "sft padded"; }
grep -q "^prepared $WORK/padded/data: 64 train examples.*+ 8 val examples, template plain" "$WORK/padded.log" \
  || { cat "$WORK/padded.log"; fail "no prepare line"; }
grep -q "64 train / 8 val examples.*padded rows of 128 tokens (64 per epoch)" "$WORK/padded.log" \
  || { cat "$WORK/padded.log"; fail "unexpected data line"; }
[ "$(metric "$WORK/padded" step)" = 4 ] || fail "--epochs 1 over 64 rows at 16 per step should run 4 steps"
python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]
sys.exit(0 if r[-1]["loss"] < r[0]["loss"] and "val_loss" in r[-1] else 1)' "$WORK/padded/metrics.jsonl" \
  || fail "the padded run's loss did not fall, or no val loss"

# Packed rows: fewer rows than examples; ddp and zero3 give the same bits at N=2.
# Rows of 512 tokens hold two or three GSM8K examples (~150-250 tokens in this template).
PACKED=("${SFT[@]}" --max-len 512 --val-fraction 0.1 --packing --micro-batch 1 --global-batch 2 --steps 4)
for strategy in ddp zero3; do
  run_mpi 2 "$SHARDLM" sft "${PACKED[@]}" --strategy "$strategy" --save-every 2 --out "$WORK/packed_$strategy" \
    > "$WORK/packed_$strategy.log" 2>&1 || { cat "$WORK/packed_$strategy.log"; fail "sft packed $strategy"; }
done
grep -q "58 train / 6 val examples.*packed rows of 512 tokens" "$WORK/packed_ddp.log" \
  || { cat "$WORK/packed_ddp.log"; fail "unexpected packed data line"; }
rows="$(sed -n 's/.*packed rows of 512 tokens (\([0-9]*\) per epoch).*/\1/p' "$WORK/packed_ddp.log")"
[ -n "$rows" ] && [ "$rows" -lt 29 ] || fail "packing should need fewer than half as many rows as 58 examples, got '$rows'"
[ "$(digest_of "$WORK/packed_ddp")" = "$(digest_of "$WORK/packed_zero3")" ] \
  || fail "packed sft: zero3 x2 differs from ddp x2"

# Resume from step 2 gives the same bits as the straight run; other data is refused.
cp -r "$WORK/packed_ddp" "$WORK/resumed"
rm -rf "$WORK/resumed/checkpoints/step_00000004"
run_mpi 2 "$SHARDLM" sft "${PACKED[@]}" --resume --out "$WORK/resumed" > "$WORK/resumed.log" 2>&1 \
  || { cat "$WORK/resumed.log"; fail "sft --resume"; }
[ "$(digest_of "$WORK/resumed")" = "$(digest_of "$WORK/packed_ddp")" ] || fail "resumed sft run differs"
cp "$WORK/gsm.jsonl" "$WORK/gsm.orig"
sed -i '$d' "$WORK/gsm.jsonl"  # the dataset file changed since RUN/data was made
expect_error "was prepared with dataset file" "$SHARDLM" sft "${PACKED[@]}" --resume --out "$WORK/resumed"
mv "$WORK/gsm.orig" "$WORK/gsm.jsonl"

# LoRA: adapters only, exported as a PEFT adapter directory.
"$SHARDLM" sft "${SFT[@]}" --val-fraction 0.1 --packing --micro-batch 4 --steps 2 --lora-rank 4 \
  --strategy auto --memory-per-rank 4 --out "$WORK/lora" > "$WORK/lora.log" 2>&1 || { cat "$WORK/lora.log"; fail "sft lora"; }
grep -q frozen "$WORK/lora.log" || fail "LoRA sft shows no frozen memory"
grep -q "^strategy auto -> ddp: fits" "$WORK/lora.log" || { cat "$WORK/lora.log"; fail "sft --strategy auto did not choose"; }
"$SHARDLM" export --checkpoint "$WORK/lora" --out "$WORK/adapter" > /dev/null
[ -f "$WORK/adapter/adapter_config.json" ] || fail "LoRA sft exported no adapter"

# Qwen's tokenizer renders ChatML by default.
"$SHARDLM" sft --model qwen3-tiny --tokenizer "tiktoken:qwen:$SHARED_DATA/qwen/qwen.tiktoken" \
  --dataset "$WORK/gsm_val.jsonl" --max-len 96 --micro-batch 2 --steps 1 --threads 1 --eval-batches 0 \
  --out "$WORK/chatml" > "$WORK/chatml.log" 2>&1 || { cat "$WORK/chatml.log"; fail "sft chatml"; }
grep -q "template chatml" "$WORK/chatml.log" || { cat "$WORK/chatml.log"; fail "Qwen's tokenizer did not pick ChatML"; }

expect_error "the row length is --max-len" "$SHARDLM" sft "${SFT[@]}" --seq-len 64 --out "$WORK/x1"
expect_error "brings no tokenizer.json" "$SHARDLM" sft --model qwen3-tiny --dataset "$WORK/gsm.jsonl" --out "$WORK/x2"
expect_error "was prepared with --max-len '128'" "$SHARDLM" sft "${SFT[@]}" --max-len 100 --micro-batch 8 --resume --out "$WORK/padded"
expect_error "unknown chat template 'zephyr'" "$SHARDLM" sft "${SFT[@]}" --template zephyr --steps 1 --out "$WORK/x3"
printf '%s\n' '{"messages": [{"role": "user", "content": "x"}]}' > "$WORK/noanswer.jsonl"
expect_error "no assistant turn" "$SHARDLM" sft "${SFT[@]}" --dataset "$WORK/noanswer.jsonl" --steps 1 --out "$WORK/x4"
expect_error "lora-targets: 'wq' is not a linear layer" "$SHARDLM" sft "${SFT[@]}" --lora-rank 4 --lora-targets wq --steps 1 --out "$WORK/x5"
# Inputs refused before anything under --out is written.
expect_error "model 'Qwen/Qwen2.5-0.5B-Instruct': not a local model directory or a preset (shardlm does not download models" \
  "$SHARDLM" sft --model Qwen/Qwen2.5-0.5B-Instruct --dataset "$WORK/gsm.jsonl" --out "$WORK/x7"
expect_error "--max-len 100000 is longer than the model's context" "$SHARDLM" sft "${SFT[@]}" --max-len 100000 --out "$WORK/x8"
expect_error "has 50257 tokens, more than the model's vocabulary (1000 from --vocab-size)" \
  "$SHARDLM" sft "${SFT[@]}" --vocab-size 1000 --out "$WORK/x9"
for x in x7 x8 x9; do [ ! -e "$WORK/$x" ] || fail "a refused sft wrote $WORK/$x"; done
make_byte_data
expect_error "--packing applies to chat datasets" "$SHARDLM" train "${TINY[@]}" --packing --steps 1 --data "$WORK/data" --out "$WORK/x6"
echo "1 passed, 0 failed"
