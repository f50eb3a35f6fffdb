#!/usr/bin/env bash
# LoRA through the command line: a base model exported by shardlm, LoRA training on it
# (--init-from + --lora-rank), export as a PEFT adapter and as a merged model; where a
# python with transformers and peft is available ($SHARDLM_REF_PYTHON), PEFT on the base
# and transformers on the merged model compute shardlm's eval loss. Resume works; wrong
# inputs are one-line errors.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
REF_PYTHON="${SHARDLM_REF_PYTHON:-/usr/bin/python3}"
TOOLS="$(dirname "$0")/../../tools"
COMMON=(--seq-len 32 --micro-batch 4 --threads 1 --eval-batches 0 --data "$WORK/data")
"$SHARDLM" train --model llama-tiny "${COMMON[@]}" --steps 4 --out "$WORK/base_run" > /dev/null
"$SHARDLM" export --checkpoint "$WORK/base_run" --out "$WORK/base" > /dev/null
LORA=(--init-from "$WORK/base" --lora-rank 4 --lora-alpha 8 --lr 1e-2)
"$SHARDLM" train "${COMMON[@]}" "${LORA[@]}" --steps 4 --save-every 2 --out "$WORK/lora" > "$WORK/lora.log"
grep -q "frozen" "$WORK/lora.log" || fail "the summary shows no frozen memory"
# The run's report draws the frozen base's memory (the category that matters for LoRA).
"$SHARDLM" report "$WORK/lora" > /dev/null || fail "report of a LoRA run"
grep -q "<title>rank 0 frozen: " "$WORK/lora/report.html" || fail "the LoRA run's report draws no frozen memory"
"$SHARDLM" train "${COMMON[@]}" --lora-rank 4 --lora-alpha 8 --lr 1e-2 --model "$WORK/base" --steps 6 --out "$WORK/lora" --resume > /dev/null \
  || fail "resuming a LoRA run"
"$SHARDLM" export --checkpoint "$WORK/lora" --out "$WORK/adapter" > /dev/null
[ -f "$WORK/adapter/adapter_config.json" ] && [ -f "$WORK/adapter/adapter_model.safetensors" ] \
  || fail "the default export of a LoRA run is not a PEFT adapter directory"
[ ! -e "$WORK/adapter/config.json" ] || fail "an adapter export wrote a model config.json"
"$SHARDLM" export --checkpoint "$WORK/lora" --out "$WORK/merged" --merge-lora > /dev/null
[ -f "$WORK/merged/model.safetensors" ] || fail "--merge-lora wrote no model"
ours="$("$SHARDLM" eval --checkpoint "$WORK/lora" --data "$WORK/data" --seq-len 32 --windows 8 | awk '/^loss:/ {print $2}')"
# The merged model, run by shardlm itself, gives the adapter model's loss (up to the
# rounding of W + s B A in fp32).
"$SHARDLM" train "${COMMON[@]}" --steps 0 --init-from "$WORK/merged" --out "$WORK/from_merged" > /dev/null
merged="$("$SHARDLM" eval --checkpoint "$WORK/from_merged" --data "$WORK/data" --seq-len 32 --windows 8 | awk '/^loss:/ {print $2}')"
python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 1e-5*abs(b) else 1)" \
  "$ours" "$merged" || fail "merged model loss $merged differs from the LoRA run's $ours"
if peft_agrees "$ours" "$WORK/base" "$WORK/adapter" "$WORK/data" "$TOOLS" "$REF_PYTHON"; then
  merged_hf="$(cd "$TOOLS" && "$REF_PYTHON" check_hf_export.py "$WORK/merged" "$WORK/data/val.bin" 32 8 | awk '/^loss:/ {print $2}')"
  echo "transformers on the merged model: $merged_hf"
fi
expect_error "needs a LoRA run" "$SHARDLM" export --checkpoint "$WORK/base_run" --out "$WORK/x" --merge-lora
expect_error "lora-targets: 'qkv' is not a linear layer" "$SHARDLM" train "${COMMON[@]}" "${LORA[@]}" \
  --lora-targets qkv --steps 1 --out "$WORK/x2"
expect_error "not gpt2" "$SHARDLM" train --model gpt2-tiny "${COMMON[@]}" --lora-rank 4 --steps 1 --out "$WORK/x3"
echo "1 passed, 0 failed"
