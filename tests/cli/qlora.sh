#!/usr/bin/env bash
# QLoRA (--quantize-base nf4) through the command line:
# - a QLoRA run computes exactly what LoRA computes on its dequantized base: the base
#   exported with --base-only (NF4 dequantized to fp32) and trained with LoRA from the
#   same seed gives the same losses step by step, in fp32 and bf16 (the dequantized
#   values code x absmax are fp32 numbers; bf16 rounds them the same way in both runs,
#   so the tolerance is 0, not an approximation);
# - the tracker's frozen bytes: ~0.5625 bytes per quantized value (4-bit codes + one
#   fp32 absmax per 64), against LoRA's 4;
# - --merge-lora writes the dequantized base with the adapters merged, and shardlm run
#   on it computes the QLoRA run's loss (to fp32 rounding of W + s B A);
# - resume continues a QLoRA run; resuming with another --quantize-base is refused by
#   name (both ways); nf4 without LoRA and unknown values are one-line errors.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
COMMON=(--seq-len 32 --micro-batch 4 --threads 1 --eval-batches 0 --data "$WORK/data" --lr 1e-2)
losses() { python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1])))' "$1/metrics.jsonl"; }
for precision in fp32 bf16; do
  q="$WORK/qlora_$precision"
  "$SHARDLM" train --model llama-tiny "${COMMON[@]}" --precision "$precision" --lora-rank 4 \
    --quantize-base nf4 --steps 4 --save-every 2 --out "$q" > "$q.log" || { cat "$q.log"; fail "QLoRA $precision"; }
  "$SHARDLM" export --checkpoint "$q" --out "$WORK/deq_$precision" --base-only > /dev/null
  [ ! -e "$WORK/deq_$precision/adapter_config.json" ] || fail "--base-only wrote an adapter"
  "$SHARDLM" train "${COMMON[@]}" --precision "$precision" --lora-rank 4 --init-from "$WORK/deq_$precision" \
    --steps 4 --out "$WORK/lora_$precision" > /dev/null || fail "LoRA on the dequantized base ($precision)"
  a="$(losses "$q")"; b="$(losses "$WORK/lora_$precision")"
  [ "$a" = "$b" ] || fail "$precision: QLoRA losses [$a] differ from LoRA's on the dequantized base [$b]"
  echo "$precision: QLoRA losses equal LoRA's on the dequantized base ($a)"
done
# Frozen bytes per value: QLoRA against LoRA on the same shape (llama-tiny: 3 layers of
# 73728 linear weights); everything else frozen is the same in both.
q="$WORK/qlora_fp32"
frozen_q="$(metric "$q" mem.peak.frozen)"
frozen_l="$(metric "$WORK/lora_fp32" mem.peak.frozen)"
python3 -c 'import sys
q, l, n = int(sys.argv[1]), int(sys.argv[2]), 3 * 73728
per = 4 - (l - q) / n
print(f"frozen: LoRA {l} bytes, QLoRA {q} bytes: {per:.4f} bytes per quantized value")
sys.exit(0 if 0.5625 <= per < 0.58 else 1)' "$frozen_q" "$frozen_l" || fail "NF4 base is not ~0.5625 bytes per value"
grep -q "frozen" "$q.log" || fail "the summary shows no frozen memory"
# Resume: the same flags continue; another --quantize-base is refused, both ways.
"$SHARDLM" train --model llama-tiny "${COMMON[@]}" --lora-rank 4 --quantize-base nf4 --steps 6 \
  --out "$q" --resume > /dev/null || fail "resuming a QLoRA run"
expect_error "quantize_base=\"nf4\", but this run asks for none" "$SHARDLM" train --model llama-tiny \
  "${COMMON[@]}" --lora-rank 4 --steps 8 --out "$q" --resume
expect_error "but this run asks for \"nf4\"" "$SHARDLM" train "${COMMON[@]}" --lora-rank 4 \
  --quantize-base nf4 --model "$WORK/deq_fp32" --steps 8 --out "$WORK/lora_fp32" --resume
# Merged export: dequantized base + s B A; shardlm on it computes the run's loss.
"$SHARDLM" export --checkpoint "$q" --out "$WORK/merged" --merge-lora > /dev/null
"$SHARDLM" export --checkpoint "$q" --out "$WORK/adapter" > /dev/null
[ -f "$WORK/adapter/adapter_config.json" ] || fail "the default export of a QLoRA run is not a PEFT adapter"
ours="$("$SHARDLM" eval --checkpoint "$q" --data "$WORK/data" --seq-len 32 --windows 8 | awk '/^loss:/ {print $2}')"
"$SHARDLM" train "${COMMON[@]}" --steps 0 --init-from "$WORK/merged" --out "$WORK/from_merged" > /dev/null
merged="$("$SHARDLM" eval --checkpoint "$WORK/from_merged" --data "$WORK/data" --seq-len 32 --windows 8 | awk '/^loss:/ {print $2}')"
python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 1e-5*abs(b) else 1)" \
  "$ours" "$merged" || fail "merged model loss $merged differs from the QLoRA run's $ours"
echo "merged export: loss $merged, the QLoRA run's $ours"
# QLoRA from a Hugging Face directory (whose config.json knows nothing of quantization):
# `train --init-from DIR` and `sft --model DIR` both start, and a directory that does
# not describe the run's model is refused before sft prepares anything.
# (The NF4 words themselves: test_qlora_hf_import, against bitsandbytes' algorithm.)
"$SHARDLM" train --model qwen3-tiny "${COMMON[@]}" --vocab-size 50257 --steps 0 --out "$WORK/base" > /dev/null
"$SHARDLM" export --checkpoint "$WORK/base" --out "$WORK/hf_base" > /dev/null
"$SHARDLM" train "${COMMON[@]}" --init-from "$WORK/hf_base" --lora-rank 4 --quantize-base nf4 \
  --precision bf16 --steps 2 --out "$WORK/q_hf" > "$WORK/q_hf.log" 2>&1 || { cat "$WORK/q_hf.log"; fail "train --init-from DIR --quantize-base nf4"; }
head -n 16 "$SHARED_DATA/sft/gsm8k_train.jsonl" > "$WORK/gsm.jsonl"
SFT=(--tokenizer "gpt2:$SHARED_DATA/gpt2" --dataset "$WORK/gsm.jsonl" --max-len 128 --threads 1
     --micro-batch 2 --eval-batches 0 --lora-rank 8 --quantize-base nf4)
"$SHARDLM" sft --model "$WORK/hf_base" "${SFT[@]}" --steps 2 --out "$WORK/sft_q" > "$WORK/sft_q.log" 2>&1 \
  || { cat "$WORK/sft_q.log"; fail "sft --model DIR --quantize-base nf4"; }
[ "$(metric "$WORK/sft_q" step)" = 2 ] || fail "sft --model DIR --quantize-base nf4 did not train 2 steps"
echo "QLoRA from a Hugging Face directory: train --init-from and sft --model run"
expect_error "describes another model than the one being trained (n_layer" "$SHARDLM" sft --model "$WORK/hf_base" "${SFT[@]}" \
  --n-layer 2 --steps 2 --out "$WORK/sft_bad"
[ ! -e "$WORK/sft_bad/data" ] || fail "sft prepared data for a model it then refused"
# Bad input.
expect_error "quantize-base nf4 needs LoRA" "$SHARDLM" train --model llama-tiny "${COMMON[@]}" \
  --quantize-base nf4 --steps 1 --out "$WORK/x1"
expect_error "quantize-base must be none or nf4, got 'int4'" "$SHARDLM" train --model llama-tiny \
  "${COMMON[@]}" --lora-rank 4 --quantize-base int4 --steps 1 --out "$WORK/x2"
expect_error "quantize-base nf4 needs LoRA" "$SHARDLM" plan --model qwen2.5-0.5b --quantize-base nf4
[ ! -e "$WORK/x1" ] && [ ! -e "$WORK/x2" ] || fail "a refused run left a directory"
echo "1 passed, 0 failed"
