#!/usr/bin/env bash
# LoRA on a mixture of experts through the command line: a qwen3_moe base exported by
# shardlm, LoRA on its attention and its routed experts (experts.gate_up_proj,
# experts.down_proj: PEFT's target_parameters), export as a PEFT adapter with
# target_parameters and PEFT's fused expert tensors; where a python with transformers
# and peft is available ($SHARDLM_REF_PYTHON), PEFT on the base computes shardlm's
# eval loss; the merged export (--merge-lora) gives the same loss in shardlm and in
# transformers. qwen2_moe's gate_proj/up_proj/down_proj (its dense MLPs and shared
# experts) the same way; those names in qwen3_moe are a one-line error.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
REF_PYTHON="${SHARDLM_REF_PYTHON:-/usr/bin/python3}"
TOOLS="$(dirname "$0")/../../tools"
COMMON=(--seq-len 32 --micro-batch 4 --threads 1 --eval-batches 0 --data "$WORK/data")
"$SHARDLM" train --model qwen3-moe-tiny "${COMMON[@]}" --steps 2 --out "$WORK/base_run" > /dev/null
"$SHARDLM" export --checkpoint "$WORK/base_run" --out "$WORK/base" > /dev/null
LORA=(--init-from "$WORK/base" --lora-rank 4 --lora-alpha 8 --lr 1e-2)
"$SHARDLM" train "${COMMON[@]}" "${LORA[@]}" --lora-targets q_proj,v_proj,experts.gate_up_proj,experts.down_proj \
  --steps 3 --out "$WORK/lora" > "$WORK/lora.log" || { cat "$WORK/lora.log"; fail "LoRA on the experts"; }
"$SHARDLM" export --checkpoint "$WORK/lora" --out "$WORK/adapter" > /dev/null
python3 - "$WORK/adapter/adapter_config.json" <<'PY' || fail "adapter_config.json does not name the experts as target_parameters"
import json, sys
c = json.load(open(sys.argv[1]))
assert sorted(c["target_modules"]) == ["q_proj", "v_proj"], c["target_modules"]
assert c["target_parameters"] == ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], c["target_parameters"]
PY
ours="$("$SHARDLM" eval --checkpoint "$WORK/lora" --data "$WORK/data" --seq-len 32 --windows 8 | awk '/^loss:/ {print $2}')"
# The merged export (each expert's s B_e A_e added into its gate/up/down weights), run
# by shardlm without LoRA, gives the adapter run's loss; where the reference python is
# there, transformers on it gives PEFT's loss on the base with the adapter.
"$SHARDLM" export --checkpoint "$WORK/lora" --out "$WORK/merged" --merge-lora > /dev/null
"$SHARDLM" train "${COMMON[@]}" --steps 0 --init-from "$WORK/merged" --out "$WORK/from_merged" > /dev/null
merged="$("$SHARDLM" eval --checkpoint "$WORK/from_merged" --data "$WORK/data" --seq-len 32 --windows 8 | awk '/^loss:/ {print $2}')"
close_to() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 1e-5*abs(b) else 1)" "$1" "$2"; }
close_to "$merged" "$ours" || fail "merged model loss $merged differs from the LoRA run's $ours"
echo "shardlm on the merged model: loss $merged, the LoRA run's $ours"
if peft_agrees "$ours" "$WORK/base" "$WORK/adapter" "$WORK/data" "$TOOLS" "$REF_PYTHON"; then
  merged_hf="$(cd "$TOOLS" && "$REF_PYTHON" check_hf_export.py "$WORK/merged" "$WORK/data/val.bin" 32 8 | awk '/^loss:/ {print $2}')"
  close_to "$merged_hf" "$ours" || fail "transformers on the merged model: loss $merged_hf, shardlm's $ours"
  echo "transformers on the merged model: loss $merged_hf"
fi
# qwen2_moe: gate_proj/up_proj/down_proj are PEFT's nn.Linear modules of those names, the
# dense layers' MLP (layers 0, 2) and the sparse layers' shared expert; the adapter
# loads in PEFT with shardlm's loss, and the merged export gives it too.
"$SHARDLM" train --model qwen2-moe-tiny "${COMMON[@]}" --steps 0 --out "$WORK/q2_base_run" > /dev/null
"$SHARDLM" export --checkpoint "$WORK/q2_base_run" --out "$WORK/q2_base" > /dev/null
"$SHARDLM" train "${COMMON[@]}" --init-from "$WORK/q2_base" --lora-rank 4 --lora-alpha 8 --lr 1e-2 \
  --lora-targets gate_proj,up_proj,down_proj,experts.down_proj --steps 2 --out "$WORK/q2_lora" \
  > "$WORK/q2_lora.log" || { cat "$WORK/q2_lora.log"; fail "LoRA on qwen2_moe's MLPs and shared experts"; }
"$SHARDLM" export --checkpoint "$WORK/q2_lora" --out "$WORK/q2_adapter" > /dev/null
python3 - "$WORK/q2_adapter/adapter_config.json" <<'PY' || fail "adapter_config.json does not name qwen2_moe's MLP modules"
import json, sys
c = json.load(open(sys.argv[1]))
assert sorted(c["target_modules"]) == ["down_proj", "gate_proj", "up_proj"], c["target_modules"]
assert c["target_parameters"] == ["mlp.experts.down_proj"], c["target_parameters"]
PY
ours="$("$SHARDLM" eval --checkpoint "$WORK/q2_lora" --data "$WORK/data" --seq-len 32 --windows 8 | awk '/^loss:/ {print $2}')"
peft_agrees "$ours" "$WORK/q2_base" "$WORK/q2_adapter" "$WORK/data" "$TOOLS" "$REF_PYTHON" || true
"$SHARDLM" export --checkpoint "$WORK/q2_lora" --out "$WORK/q2_merged" --merge-lora > /dev/null
"$SHARDLM" train "${COMMON[@]}" --steps 0 --init-from "$WORK/q2_merged" --out "$WORK/q2_from_merged" > /dev/null
merged="$("$SHARDLM" eval --checkpoint "$WORK/q2_from_merged" --data "$WORK/data" --seq-len 32 --windows 8 | awk '/^loss:/ {print $2}')"
close_to "$merged" "$ours" || fail "qwen2_moe merged model loss $merged differs from the LoRA run's $ours"
# qwen3_moe has those projections only inside its fused experts.
expect_error "only inside the fused experts" "$SHARDLM" train "${COMMON[@]}" "${LORA[@]}" \
  --lora-targets q_proj,down_proj --steps 1 --out "$WORK/x1"
[ ! -e "$WORK/x1" ] || fail "a refused run wrote $WORK/x1"
echo "1 passed, 0 failed"
