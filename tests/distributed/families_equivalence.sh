#!/usr/bin/env bash
# Llama, Qwen2 and Qwen3 under every strategy: without gradient accumulation all
# strategies give bitwise-identical weights at a fixed world size (clipping active), in
# fp32 and bf16; and a checkpoint written by one (strategy, world size) loads bitwise
# under another. LoRA and QLoRA (NF4 base) likewise.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
FAMILY=(--seq-len 32 --threads 1 --lr 3e-3 --warmup 2 --grad-clip 0.5 --global-batch 8
        --steps 6 --eval-batches 0 --data "$WORK/data")
for model in llama-tiny qwen2-tiny qwen3-tiny; do
  for precision in fp32 bf16; do
    reference=""
    for strategy in "ddp" "zero1" "zero2" "zero3 --prefetch 1" "hybrid --shard-group-size 2"; do
      n=2
      [ "${strategy%% *}" = "hybrid" ] && n=4
      out="$WORK/${model}_${precision}_${strategy%% *}"
      # shellcheck disable=SC2086
      run_mpi "$n" "$SHARDLM" train --model "$model" "${FAMILY[@]}" --micro-batch $((8 / n)) \
        --precision "$precision" --out "$out" --strategy $strategy > "$out.log" 2>&1 \
        || { cat "$out.log"; fail "$model $precision $strategy failed"; }
      [ "${strategy%% *}" = "hybrid" ] && continue  # another world size: compared below
      d="$(digest_of "$out")"
      [ -n "$reference" ] || { reference="$d"; first="$strategy"; }
      [ "$d" = "$reference" ] || fail "$model $precision: $strategy digest $d differs from $first $reference"
    done
    python3 -c 'import json,sys; n=[json.loads(l)["grad_norm"] for l in open(sys.argv[1])]; sys.exit(0 if max(n) > 0.5 else 1)' \
      "$WORK/${model}_${precision}_ddp/metrics.jsonl" || fail "clipping never active ($model $precision)"
    echo "$model $precision: ddp, zero1, zero2, zero3 bitwise identical at N=2 ($reference)"
  done
  # Reshard: the zero3 x2 checkpoint loads bitwise into one process and into hybrid x4.
  want="$("$SHARDLM" inspect "$WORK/${model}_fp32_zero3" --quiet)"
  cp -r "$WORK/${model}_fp32_zero3" "$WORK/${model}_resume1"
  SHARDLM_FAULT="save_after_load=$WORK/${model}_loaded1" "$SHARDLM" train --model "$model" \
    "${FAMILY[@]}" --micro-batch 8 --steps 8 --resume --out "$WORK/${model}_resume1" \
    > "$WORK/${model}_resume1.log" 2>&1 || { cat "$WORK/${model}_resume1.log"; fail "$model resume N=1"; }
  [ "$("$SHARDLM" inspect "$WORK/${model}_loaded1" --quiet)" = "$want" ] \
    || fail "$model: zero3 x2 -> single process changed the loaded state"
  echo "$model: zero3 x2 checkpoint loaded bitwise by a single process, 2 more steps ran"
done
# LoRA: only the adapters train; every strategy still gives the same bits.
reference=""
for strategy in ddp zero1 zero2 zero3; do
  out="$WORK/lora_$strategy"
  run_mpi 2 "$SHARDLM" train --model qwen3-tiny "${FAMILY[@]}" --micro-batch 4 --lora-rank 4 \
    --lora-targets q_proj,v_proj,down_proj --out "$out" --strategy "$strategy" > "$out.log" 2>&1 \
    || { cat "$out.log"; fail "LoRA $strategy failed"; }
  d="$(digest_of "$out")"
  [ -n "$reference" ] || reference="$d"
  [ "$d" = "$reference" ] || fail "LoRA: $strategy digest $d differs from ddp's $reference"
done
echo "qwen3-tiny LoRA: ddp, zero1, zero2, zero3 bitwise identical at N=2 ($reference)"
# QLoRA: the NF4 base is replicated (ddp/zero1/zero2) or gathered as words (zero3), in
# fp32 and bf16; the zero3 x2 checkpoint (NF4 words included) reshards bitwise to N=1.
QLORA=(--lora-rank 4 --lora-targets q_proj,v_proj,down_proj --quantize-base nf4)
for precision in fp32 bf16; do
  reference=""
  for strategy in ddp zero1 zero2 zero3; do
    out="$WORK/qlora_${precision}_$strategy"
    run_mpi 2 "$SHARDLM" train --model qwen3-tiny "${FAMILY[@]}" --micro-batch 4 "${QLORA[@]}" \
      --precision "$precision" --out "$out" --strategy "$strategy" > "$out.log" 2>&1 \
      || { cat "$out.log"; fail "QLoRA $precision $strategy failed"; }
    d="$(digest_of "$out")"
    [ -n "$reference" ] || reference="$d"
    [ "$d" = "$reference" ] || fail "QLoRA $precision: $strategy digest $d differs from ddp's $reference"
  done
  echo "qwen3-tiny QLoRA $precision: ddp, zero1, zero2, zero3 bitwise identical at N=2 ($reference)"
done
want="$("$SHARDLM" inspect "$WORK/qlora_fp32_zero3" --quiet)"
cp -r "$WORK/qlora_fp32_zero3" "$WORK/qlora_resume1"
SHARDLM_FAULT="save_after_load=$WORK/qlora_loaded1" "$SHARDLM" train --model qwen3-tiny "${FAMILY[@]}" \
  --micro-batch 8 "${QLORA[@]}" --steps 8 --resume --out "$WORK/qlora_resume1" \
  > "$WORK/qlora_resume1.log" 2>&1 || { cat "$WORK/qlora_resume1.log"; fail "QLoRA resume N=1"; }
[ "$("$SHARDLM" inspect "$WORK/qlora_loaded1" --quiet)" = "$want" ] \
  || fail "QLoRA: zero3 x2 -> single process changed the loaded state"
echo "qwen3-tiny QLoRA: zero3 x2 checkpoint loaded bitwise by a single process, 2 more steps ran"
echo "1 passed, 0 failed"
