#!/usr/bin/env bash
# Mixture-of-experts models (qwen3-moe-tiny, mixtral-tiny, qwen2-moe-tiny: the load-balancing loss on)
# under every strategy: without gradient accumulation ddp, zero1, zero2 and zero3 give
# bitwise-identical weights at N = 2 (each expert its own unit: zero3 gathers and frees
# one expert at a time), in fp32 and bf16, with activation checkpointing too;
# metrics.jsonl reports aux_loss beside the loss; plan = the measured peak bytes per
# category; a zero3 x2 checkpoint loads bitwise into one process; LoRA (all-linear: the
# attention) and LoRA on the experts bitwise across strategies; LoRA on a dense MLP
# projection is refused.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
# plan_is_measured PLAN_JSON METRICS: plan's bytes per category are the run's last peak.
plan_is_measured() {
  python3 - "$1" "$2" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
peak = [json.loads(l) for l in open(sys.argv[2]) if '"step"' in l][-1]["mem"]["peak"]
for k in ("params", "grads", "optimizer", "activations", "comm", "frozen"):
    assert plan[k] == peak[k], (k, plan[k], peak[k])
PY
}
FAMILY=(--seq-len 32 --threads 1 --lr 3e-3 --warmup 2 --grad-clip 0.5 --global-batch 8
        --steps 4 --eval-batches 0 --data "$WORK/data")
for model in qwen3-moe-tiny mixtral-tiny qwen2-moe-tiny; do
  for precision in fp32 bf16; do
    reference=""
    for strategy in "ddp" "zero1" "zero2" "zero3 --prefetch 1" "zero3 --activation-checkpointing"; do
      out="$WORK/${model}_${precision}_${strategy%% *}"
      case "$strategy" in *checkpointing*) out="${out}_ckpt" ;; esac
      # shellcheck disable=SC2086
      run_mpi 2 "$SHARDLM" train --model "$model" "${FAMILY[@]}" --micro-batch 4 \
        --precision "$precision" --out "$out" --strategy $strategy > "$out.log" 2>&1 \
        || { cat "$out.log"; fail "$model $precision $strategy failed"; }
      d="$(digest_of "$out")"
      [ -n "$reference" ] || { reference="$d"; first="$strategy"; }
      [ "$d" = "$reference" ] || fail "$model $precision: $strategy digest $d differs from $first $reference"
    done
    echo "$model $precision: ddp, zero1, zero2, zero3, zero3 + activation checkpointing bitwise identical at N=2 ($reference)"
  done
  python3 - "$WORK/${model}_fp32_ddp/metrics.jsonl" <<'PY' || fail "$model: aux_loss missing from metrics.jsonl"
import json, sys
records = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
assert records and all(r.get("aux_loss", 0) > 0 for r in records), records[:1]
# With k of E experts per token, the balanced value is k; a collapse to one expert is E.
print("aux_loss per step:", [round(r["aux_loss"], 4) for r in records])
PY
  # plan = measured, byte-exact, per category (zero3 x2, fp32 and with checkpointing).
  for run in zero3 zero3_ckpt; do
    extra=()
    [ "$run" = zero3_ckpt ] && extra=(--activation-checkpointing)
    "$SHARDLM" plan --model "$model" -n 2 --strategy zero3 --data "$WORK/data" --seq-len 32 \
      --micro-batch 4 --global-batch 8 "${extra[@]}" --json > "$WORK/${model}_$run.plan.json" \
      || fail "$model: plan failed"
    plan_is_measured "$WORK/${model}_$run.plan.json" "$WORK/${model}_fp32_$run/metrics.jsonl" \
      || fail "$model $run: plan differs from the measured peak memory"
  done
  echo "$model: plan = measured peak bytes per category (zero3 x2, with and without checkpointing)"
  want="$("$SHARDLM" inspect "$WORK/${model}_fp32_zero3" --quiet)"
  cp -r "$WORK/${model}_fp32_zero3" "$WORK/${model}_resume1"
  SHARDLM_FAULT="save_after_load=$WORK/${model}_loaded1" "$SHARDLM" train --model "$model" \
    "${FAMILY[@]}" --micro-batch 8 --steps 5 --resume --out "$WORK/${model}_resume1" \
    > "$WORK/${model}_resume1.log" 2>&1 || { cat "$WORK/${model}_resume1.log"; fail "$model resume N=1"; }
  [ "$("$SHARDLM" inspect "$WORK/${model}_loaded1" --quiet)" = "$want" ] \
    || fail "$model: zero3 x2 -> single process changed the loaded state"
  echo "$model: zero3 x2 checkpoint loaded bitwise by a single process, 1 more step ran"
done
reference=""
for strategy in ddp zero3; do
  out="$WORK/lora_$strategy"
  # (--lora-targets all-linear, the default: the attention of a mixture of experts)
  run_mpi 2 "$SHARDLM" train --model qwen3-moe-tiny "${FAMILY[@]}" --micro-batch 4 --lora-rank 4 \
    --out "$out" --strategy "$strategy" > "$out.log" 2>&1 \
    || { cat "$out.log"; fail "LoRA $strategy failed"; }
  d="$(digest_of "$out")"
  [ -n "$reference" ] || reference="$d"
  [ "$d" = "$reference" ] || fail "LoRA: $strategy digest $d differs from ddp's $reference"
done
python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["model"]["lora"]["targets"] != ["q_proj","k_proj","v_proj","o_proj"])' \
  "$WORK/lora_ddp/config.json" || fail "LoRA all-linear of an MoE model should adapt q, k, v, o"
echo "qwen3-moe-tiny LoRA (all-linear: attention): ddp, zero3 bitwise identical at N=2 ($reference)"
# LoRA on the routed experts (their adapters are units of their own, beside each
# expert): with the attention, and on the experts alone (no layer adapter units).
# QLoRA (bf16): the base's linear weights (attention, every expert's, the shared expert's) NF4,
# with adapters on qwen2_moe's dense MLPs and shared experts (gate_proj, down_proj) too.
for run in "mixtral-tiny q_proj,experts.gate_up_proj,experts.down_proj" \
           "mixtral-tiny experts.gate_up_proj,experts.down_proj" \
           "qwen2-moe-tiny q_proj,gate_proj,down_proj,experts.down_proj --quantize-base nf4 --precision bf16"; do
  read -r model targets extra <<< "$run"
  reference=""
  for strategy in ddp zero3; do
    out="$WORK/expert_lora_${model}_${targets%%,*}${extra:+_nf4}_$strategy"
    # shellcheck disable=SC2086
    run_mpi 2 "$SHARDLM" train --model "$model" "${FAMILY[@]}" --micro-batch 4 --lora-rank 4 \
      --lora-targets "$targets" $extra --out "$out" --strategy "$strategy" > "$out.log" 2>&1 \
      || { cat "$out.log"; fail "expert LoRA ($run) $strategy failed"; }
    d="$(digest_of "$out")"
    [ -n "$reference" ] || reference="$d"
    [ "$d" = "$reference" ] || fail "expert LoRA ($run): $strategy digest $d differs from ddp's $reference"
  done
  # shellcheck disable=SC2086
  "$SHARDLM" plan --model "$model" -n 2 --strategy zero3 --data "$WORK/data" --seq-len 32 \
    --micro-batch 4 --global-batch 8 --lora-rank 4 --lora-targets "$targets" $extra --json \
    > "$WORK/expert_lora.plan.json" || fail "expert LoRA ($run): plan failed"
  plan_is_measured "$WORK/expert_lora.plan.json" "$out/metrics.jsonl" \
    || fail "expert LoRA ($run): plan differs from the measured peak memory"
  echo "$model LoRA on $targets $extra: ddp, zero3 bitwise identical at N=2 ($reference), plan = measured (zero3)"
done
# Bad input: one line naming the field, nothing written.
if "$SHARDLM" train --model qwen3-moe-tiny "${FAMILY[@]}" --micro-batch 8 --lora-rank 4 \
     --lora-targets gate_proj --out "$WORK/bad" > "$WORK/bad.log" 2>&1; then
  fail "LoRA on qwen3_moe's gate_proj (inside its fused experts) should be refused"
fi
grep -q "'gate_proj' in a qwen3_moe model: its MLP projections are only inside the fused experts" "$WORK/bad.log" \
  || { cat "$WORK/bad.log"; fail "unexpected error for --lora-targets gate_proj"; }
[ ! -e "$WORK/bad" ] || fail "a refused run wrote $WORK/bad"
echo "moe bad input: refused by name, nothing written"
