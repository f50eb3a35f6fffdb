#!/usr/bin/env bash
# Llama, Qwen2, Qwen3 and the mixtures of experts Qwen3-MoE, Mixtral and Qwen2-MoE through the command line: train a few steps, export a Hugging
# Face directory (fp32; bf16 sharded), start a run from it (--init-from takes the model
# from its config.json) with bitwise the same weights; transformers loads the export
# and computes shardlm's eval loss (where a python with transformers is available:
# $SHARDLM_REF_PYTHON). Wrong inputs are one-line errors naming what is wrong.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
REF_PYTHON="${SHARDLM_REF_PYTHON:-/usr/bin/python3}"
COMMON=(--seq-len 32 --micro-batch 4 --threads 1 --eval-batches 0 --data "$WORK/data")
for model in llama-tiny qwen2-tiny qwen3-tiny qwen3-moe-tiny mixtral-tiny qwen2-moe-tiny; do
  model_type="${model%-tiny}"
  model_type="${model_type//-/_}"
  "$SHARDLM" train --model "$model" "${COMMON[@]}" --steps 3 --out "$WORK/$model" > /dev/null
  want="$(digest_of "$WORK/$model")"
  "$SHARDLM" export --checkpoint "$WORK/$model" --out "$WORK/hf_$model" > /dev/null
  [ -f "$WORK/hf_$model/config.json" ] && [ -f "$WORK/hf_$model/generation_config.json" ] \
    || fail "$model: export wrote no config.json / generation_config.json"
  grep -q "\"model_type\": \"$model_type\"" "$WORK/hf_$model/config.json" \
    || fail "$model: config.json has the wrong model_type"
  # --init-from alone: the model comes from config.json; the weights come back bitwise.
  "$SHARDLM" train "${COMMON[@]}" --steps 0 --init-from "$WORK/hf_$model" --out "$WORK/re_$model" > /dev/null
  [ "$(digest_of "$WORK/re_$model")" = "$want" ] || fail "$model: export -> init-from changed the weights"
  # bf16 export, sharded into several files with an index.
  "$SHARDLM" export --checkpoint "$WORK/$model" --out "$WORK/bf16_$model" --dtype bf16 \
    --max-shard-size 0.0001 > /dev/null
  [ -f "$WORK/bf16_$model/model.safetensors.index.json" ] || fail "$model: no sharded index"
  "$SHARDLM" train "${COMMON[@]}" --steps 2 --init-from "$WORK/bf16_$model" --out "$WORK/bf_$model" > /dev/null \
    || fail "$model: could not train from the bf16 sharded export"
  # transformers loads the export and gets shardlm's loss.
  ours="$("$SHARDLM" eval --checkpoint "$WORK/$model" --data "$WORK/data" --seq-len 32 --windows 8 | awk '/^loss:/ {print $2}')"
  rc=0
  theirs="$("$REF_PYTHON" "$(dirname "$0")/../../tools/check_hf_export.py" "$WORK/hf_$model" "$WORK/data/val.bin" 32 8 2>&1)" || rc=$?
  if [ "$rc" -eq 77 ] || [ ! -x "$REF_PYTHON" ]; then
    echo "$model: transformers check skipped (${theirs:-no $REF_PYTHON})"
  else
    [ "$rc" -eq 0 ] || { echo "$theirs"; fail "$model: transformers could not load the export"; }
    theirs="$(echo "$theirs" | awk '/^loss:/ {print $2}')"
    python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 1e-5*abs(b) else 1)" \
      "$ours" "$theirs" || fail "$model: loss differs: shardlm $ours, transformers $theirs"
    echo "$model: transformers loss $theirs, shardlm loss $ours"
  fi
done
# Wrong inputs: a model that is not the directory's, an unknown model_type, a field
# shardlm does not compute; nothing is written.
expect_error "family" "$SHARDLM" train --model gpt2-tiny "${COMMON[@]}" --steps 0 \
  --init-from "$WORK/hf_qwen3-tiny" --out "$WORK/x1"
cp -r "$WORK/hf_qwen2-tiny" "$WORK/bad"
sed -i 's/"model_type": "qwen2"/"model_type": "deepseek_v3"/' "$WORK/bad/config.json"
expect_error "model_type 'deepseek_v3' is not supported" "$SHARDLM" train "${COMMON[@]}" --steps 0 \
  --init-from "$WORK/bad" --out "$WORK/x2"
sed -i 's/"model_type": "deepseek_v3"/"model_type": "qwen2"/; s/"use_sliding_window": false/"use_sliding_window": true/' "$WORK/bad/config.json"
expect_error "use_sliding_window" "$SHARDLM" train "${COMMON[@]}" --steps 0 --init-from "$WORK/bad" --out "$WORK/x3"
for d in x1 x2 x3; do [ ! -e "$WORK/$d" ] || fail "a refused run left $d behind"; done
expect_error "already exists" "$SHARDLM" export --checkpoint "$WORK/llama-tiny" --out "$WORK/hf_llama-tiny"
echo "1 passed, 0 failed"
