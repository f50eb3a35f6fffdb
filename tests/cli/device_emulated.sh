#!/usr/bin/env bash
# The device path end to end without a GPU: `train --device emulated` keeps the
# model, the strategy's buffers and the collectives on memory the host cannot read
# (backend/emulated), with host copies only where the device path makes them
# (checkpoints, init, the offloaded optimizer). It must give bitwise the CPU run's
# weights for ddp and zero3 at N=1 and N=2, in fp32 and bf16, with and without
# --offload optimizer; its checkpoints resume on the CPU and back; memory is counted
# on the device (and, offloaded, the optimizer state on the host, as `plan` says).
# Context and tensor parallelism run their device paths too (bitwise the CPU's weights;
# tensor parallelism also with LoRA, QLoRA and beside context parallelism), expert
# parallelism over the context ranks with the offloaded optimizer as well.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
run() {  # out, then flags
  local out="$1"; shift
  "$SHARDLM" train "${TINY[@]}" --data "$WORK/data" --out "$WORK/$out" --steps 6 \
    --sample-tokens 0 "$@" > "$WORK/$out.log" 2>&1 || { cat "$WORK/$out.log"; fail "$out"; }
}
run_n2() {  # out, then flags
  local out="$1"; shift
  run_mpi 2 "$SHARDLM" train "${TINY[@]}" --micro-batch 2 --data "$WORK/data" --out "$WORK/$out" \
    --steps 6 --sample-tokens 0 "$@" > "$WORK/$out.log" 2>&1 || { cat "$WORK/$out.log"; fail "$out"; }
}
same() { [ "$(digest_of "$WORK/$1")" = "$(digest_of "$WORK/$2")" ] || fail "$1 and $2 differ"; }

for precision in fp32 bf16; do
  run "cpu_$precision" --precision "$precision"
  run "emulated_$precision" --precision "$precision" --device emulated
  same "cpu_$precision" "emulated_$precision"
  run "offload_$precision" --precision "$precision" --device emulated --offload optimizer
  same "cpu_$precision" "offload_$precision"
  echo "N=1 $precision: cpu = emulated = emulated + offload ($(digest_of "$WORK/cpu_$precision"))"
done

run_n2 cpu_ddp_n2 --strategy ddp
for s in ddp zero3; do
  run_n2 "emulated_${s}_n2" --strategy "$s" --device emulated
  same cpu_ddp_n2 "emulated_${s}_n2"
done
echo "N=2: cpu ddp = emulated ddp = emulated zero3"

# --offload optimizer: the device keeps the parameters in the compute type and two
# transient gradient buffers; the reduced gradients accumulate on the host, where AdamW
# runs. Every strategy offloaded gives the weights of the CPU run without offload: at
# one micro-batch per step those of every strategy; with accumulation those of zero2
# (offloaded, every strategy reduces every micro-batch, as zero2 does).
for s in ddp zero1 zero2 zero3; do
  run_n2 "offload_${s}_n2" --strategy "$s" --device emulated --offload optimizer
  same cpu_ddp_n2 "offload_${s}_n2"
done
run_n2 offload_hybrid_n2 --strategy hybrid --shard-group-size 1 --device emulated --offload optimizer
same cpu_ddp_n2 offload_hybrid_n2
echo "N=2 fp32: cpu ddp = emulated ddp/zero1/zero2/zero3/hybrid + offload"
run_n2 cpu_ddp_bf16_n2 --strategy ddp --precision bf16
for s in ddp zero2 zero3; do
  run_n2 "offload_${s}_bf16_n2" --strategy "$s" --precision bf16 --device emulated --offload optimizer
  same cpu_ddp_bf16_n2 "offload_${s}_bf16_n2"
done
echo "N=2 bf16: cpu ddp = emulated ddp/zero2/zero3 + offload ($(digest_of "$WORK/cpu_ddp_bf16_n2"))"
run_n2 cpu_zero2_accumulation_n2 --strategy zero2 --precision bf16 --global-batch 8
for s in ddp zero1 zero3; do
  run_n2 "offload_${s}_accumulation_n2" --strategy "$s" --precision bf16 --global-batch 8 \
    --device emulated --offload optimizer
  same cpu_zero2_accumulation_n2 "offload_${s}_accumulation_n2"
done
echo "N=2 bf16, 2 micro-batches: cpu zero2 = emulated ddp/zero1/zero3 + offload"
run_n2 cpu_zero3_reduce_bf16_n2 --strategy zero3 --precision bf16 --reduce-dtype bf16
run_n2 offload_ddp_reduce_bf16_n2 --strategy ddp --precision bf16 --reduce-dtype bf16 \
  --device emulated --offload optimizer
same cpu_zero3_reduce_bf16_n2 offload_ddp_reduce_bf16_n2
run_n2 cpu_fp16_n2 --strategy ddp --precision fp16
run_n2 offload_zero2_fp16_n2 --strategy zero2 --precision fp16 --device emulated --offload optimizer
same cpu_fp16_n2 offload_zero2_fp16_n2
echo "N=2: --reduce-dtype bf16 and fp16 offloaded = the CPU runs"

# Checkpoints cross devices: 3 steps on the emulated device, 3 more on the CPU (and the
# other way round) land where 6 steps in one go did.
run half_emulated --precision fp32 --device emulated --steps 3
cp -r "$WORK/half_emulated" "$WORK/resumed_on_cpu"
run resumed_on_cpu --precision fp32 --resume
same cpu_fp32 resumed_on_cpu
run half_cpu --precision fp32 --steps 3
cp -r "$WORK/half_cpu" "$WORK/resumed_on_emulated"
run resumed_on_emulated --precision fp32 --device emulated --offload optimizer --resume
same cpu_fp32 resumed_on_emulated
echo "checkpoints move between the CPU and the device, both ways, bitwise"

# Memory by device: the model, params and grads on the device; offloaded, no
# optimizer state there and the host holds what plan says, category by category.
dev_opt="$(metric "$WORK/offload_fp32" device_mem.peak.optimizer)"
[ "$dev_opt" = 0 ] || fail "offloaded run holds $dev_opt optimizer bytes on the device"
[ "$(metric "$WORK/emulated_fp32" device_mem.peak.activations)" -gt 0 ] \
  || fail "the emulated run's activations are not on the device"
[ "$(metric "$WORK/emulated_fp32" mem.peak.activations)" = 0 ] \
  || fail "the emulated run put activations in host memory"
# memory_as_planned RUN_DIR PLAN_FLAGS...: the run's peak bytes per category, on the
# device and on the host, are what `plan` with those flags predicts.
memory_as_planned() {
  local run_dir="$1"; shift
  "$SHARDLM" plan "$@" --data "$WORK/data" --json > "$WORK/$run_dir.plan.json"
  python3 - "$WORK/$run_dir.plan.json" "$WORK/$run_dir/metrics.jsonl" "$run_dir" <<'PY' || fail "$run_dir: memory is not as planned"
import json, sys
plan = json.load(open(sys.argv[1]))
record = [json.loads(l) for l in open(sys.argv[2])][-1]
ok = True
for category in ("params", "grads", "optimizer", "activations", "comm", "frozen"):
    if plan[category] != record["device_mem"]["peak"][category]:
        print(f"device {category}: plan {plan[category]}, measured {record['device_mem']['peak'][category]}")
        ok = False
for category in ("params", "grads", "optimizer", "frozen", "comm"):
    if plan["host"][category] != record["mem"]["peak"][category]:
        print(f"host {category}: plan {plan['host'][category]}, measured {record['mem']['peak'][category]}")
        ok = False
print(f"{sys.argv[3]}: device and host memory by category = plan (host {plan['host']['total']} bytes)")
sys.exit(0 if ok else 1)
PY
}
SHAPE=(--model gpt2-tiny --n-layer 2 --n-embd 32 --n-head 2 --seq-len 32 --micro-batch 4)
for run_dir in offload_fp32 offload_bf16 emulated_bf16; do
  flags=(--device emulated --precision "${run_dir#*_}")
  [[ "$run_dir" == offload_* ]] && flags+=(--offload optimizer)
  memory_as_planned "$run_dir" "${SHAPE[@]}" "${flags[@]}"
done

# Context parallelism on the device path (Ulysses' all-to-alls and the ring's block
# kernels, send_recv and log-sum-exp merge on device memory): bitwise the CPU run's
# weights, llama-tiny zero3 at P = 2 (fp32 Ulysses, bf16 ring) and gpt2-tiny ring.
cp_run() {  # out, then flags
  local out="$1"; shift
  run_mpi 2 "$SHARDLM" train --data "$WORK/data" --out "$WORK/$out" --steps 3 --micro-batch 2 \
    --seq-len 32 --global-batch 2 --strategy zero3 --context-parallel 2 --threads 1 \
    --eval-batches 0 --sample-tokens 0 "$@" > "$WORK/$out.log" 2>&1 || { cat "$WORK/$out.log"; fail "$out"; }
}
for cp in "ulysses llama-tiny fp32" "ring llama-tiny bf16" "ring gpt2-tiny fp32"; do
  read -r kind model precision <<< "$cp"
  for device in cpu emulated; do
    cp_run "cp_${kind}_${model}_${precision}_$device" --context-parallel-kind "$kind" --model "$model" \
      --precision "$precision" --device "$device"
  done
  same "cp_${kind}_${model}_${precision}_cpu" "cp_${kind}_${model}_${precision}_emulated"
  echo "context parallel $kind P=2 $model $precision: cpu = emulated"
done
# ... and with the optimizer offloaded to the host.
cp_run cp_ring_offload --context-parallel-kind ring --model llama-tiny --precision bf16 --device emulated \
  --offload optimizer
same cp_ring_llama-tiny_bf16_cpu cp_ring_offload
echo "context parallel ring P=2 llama-tiny bf16: cpu = emulated + --offload optimizer"

# Tensor parallelism on the device path (the vocabulary-parallel lookup and loss as
# backend kernels on device memory, the layers' all-reduces and sequence parallelism's
# reduce-scatters and all-gathers through the device communicator): bitwise the CPU
# run's weights at T = 2 on 2 ranks, and (gpt2, ddp: zero3 cannot sample in a run yet)
# the same sample generated at the end (the emulated device reruns the context per token
# through the gathered vocabulary-parallel logits; the CPU uses its KV cache).
tp_run() {  # ranks, out, then flags
  local n="$1" out="$2"; shift 2
  run_mpi "$n" --tag-output "$SHARDLM" train --data "$WORK/data" --out "$WORK/$out" --steps 3 \
    --micro-batch 2 --seq-len 32 --global-batch 2 --tensor-parallel 2 --threads 1 \
    --eval-batches 0 "$@" > "$WORK/$out.log" 2>&1 || { cat "$WORK/$out.log"; fail "$out"; }
}
sample_of() {  # rank 0's sample block in a tp_run log
  # mpirun tags each piece it forwards, and a piece can end inside a line: the tag then
  # stands in the middle of that line (seen in a 1.5 KB table under load), so every tag
  # of rank 0's lines is removed, not only the leading one.
  grep -a '^\[1,0\]<stdout>:' "$WORK/$1.log" | sed 's/\[1,0\]<stdout>://g' \
    | sed -n '/^--- sample ---$/,/^-----*$/p'
}
for tp in "llama-tiny zero3 fp32 --sample-tokens 0" \
          "llama-tiny zero3 bf16 --sequence-parallel --sample-tokens 0" \
          "gpt2-tiny ddp fp32 --sample-tokens 12"; do
  read -r model strategy precision extra <<< "$tp"
  name="tp_${model}_${strategy}_${precision}"
  [[ "$extra" == *--sequence-parallel* ]] && name+="_sp"
  for device in cpu emulated; do
    # shellcheck disable=SC2086
    tp_run 2 "${name}_$device" --model "$model" --strategy "$strategy" --precision "$precision" \
      --device "$device" $extra
  done
  same "${name}_cpu" "${name}_emulated"
  if [[ "$extra" == "--sample-tokens 12" ]]; then
    [ -n "$(sample_of "${name}_cpu")" ] || fail "${name}_cpu printed no sample"
    [ "$(sample_of "${name}_cpu")" = "$(sample_of "${name}_emulated")" ] \
      || fail "$name: the emulated device's sample differs from the CPU's"
  fi
  echo "tensor parallel T=2 $model $strategy $precision $extra: cpu = emulated"
done
# plan traces the tensor-parallel model on the meta device, the vocabulary-parallel
# kernels included: its bytes per category are the emulated run's.
memory_as_planned tp_llama-tiny_zero3_bf16_sp_emulated \
  --model llama-tiny --seq-len 32 --micro-batch 2 --global-batch 2 -n 2 --strategy zero3 \
  --precision bf16 --tensor-parallel 2 --sequence-parallel --device emulated
# ... with LoRA on every projection (the adapters split with their layers: lora_B's rows
# under a column-parallel layer, lora_A's columns under a row-parallel one) and QLoRA (the
# NF4 base in pieces of whole 64-value blocks, hence llama64's shape), both zero3 bf16 at
# T = 2, and context 2 x tensor 2 on 4 ranks (Ulysses' all-to-alls over each tensor rank's
# heads, the tensor group's collectives beside them): bitwise the CPU run's weights.
make_llama64_config "$WORK/llama64"
LORA_EVERY_PROJECTION="--lora-rank 4 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
for tp in "2 tp_lora llama-tiny bf16 $LORA_EVERY_PROJECTION" \
          "2 tp_qlora $WORK/llama64 bf16 --quantize-base nf4 $LORA_EVERY_PROJECTION" \
          "4 tp_cp llama-tiny fp32 --context-parallel 2"; do
  read -r ranks name model precision extra <<< "$tp"
  for device in cpu emulated; do
    # shellcheck disable=SC2086
    tp_run "$ranks" "${name}_$device" --model "$model" --strategy zero3 --precision "$precision" \
      --device "$device" --sample-tokens 0 $extra
  done
  same "${name}_cpu" "${name}_emulated"
  echo "tensor parallel T=2 $name ($precision, $ranks ranks): cpu = emulated"
done
# Mixtures of experts on the device path (the router GEMM, row gathers, expert GEMMs,
# combine and the router's backward as kernels on device memory; the routing decided on
# the host from a copy of the router logits; expert parallelism's all-to-alls through the
# device communicator): bitwise the CPU run's weights, qwen3-moe-tiny at one rank (fp32),
# zero3 x --expert-parallel 2 (bf16), and that with the optimizer offloaded. At E = 2 the
# device exchanges a layer's rows one held expert at a time (4 all_to_all_v each way where
# the CPU run has one, counted below), so the CPU = emulated digests are also the two
# chunkings of the exchange giving bitwise the same weights.
moe_run() {  # ranks, out, then flags
  local n="$1" out="$2"; shift 2
  run_mpi "$n" "$SHARDLM" train --model qwen3-moe-tiny --data "$WORK/data" --out "$WORK/$out" \
    --steps 3 --micro-batch 2 --seq-len 32 --global-batch $((2 * n)) --threads 1 --eval-batches 0 \
    --sample-tokens 0 "$@" > "$WORK/$out.log" 2>&1 || { cat "$WORK/$out.log"; fail "$out"; }
}
for device in cpu emulated; do
  moe_run 1 "moe_fp32_$device" --precision fp32 --device "$device"
  moe_run 2 "moe_e2_bf16_$device" --precision bf16 --strategy zero3 --expert-parallel 2 --device "$device"
done
same moe_fp32_cpu moe_fp32_emulated
same moe_e2_bf16_cpu moe_e2_bf16_emulated
# all_to_all_v per step of the CPU run and the emulated run (2 sparse layers x 6
# exchanges, in one chunk on the CPU and 4 on the device).
a2av_calls() {
  python3 -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if '\"comm\"' in l][-1]['comm']['all_to_all_v']['calls'])" \
    "$WORK/$1/metrics.jsonl"
}
[ "$(a2av_calls moe_e2_bf16_cpu) $(a2av_calls moe_e2_bf16_emulated)" = "12 48" ] \
  || fail "all_to_all_v per step: cpu $(a2av_calls moe_e2_bf16_cpu), emulated $(a2av_calls moe_e2_bf16_emulated); expected 12 (one chunk) and 48 (one per held expert)"
moe_run 2 moe_e2_offload --precision bf16 --strategy zero3 --expert-parallel 2 --device emulated \
  --offload optimizer
same moe_e2_bf16_cpu moe_e2_offload
# plan traces that step on the meta device (the same kernels, balanced routing): its bytes
# per category, on the device and on the host, are the run's.
memory_as_planned moe_e2_offload --model qwen3-moe-tiny --seq-len 32 --micro-batch 2 \
  --global-batch 4 -n 2 --strategy zero3 --precision bf16 --expert-parallel 2 --device emulated \
  --offload optimizer
echo "qwen3-moe-tiny: cpu = emulated (fp32 N=1; bf16 zero3 x E=2, and + --offload optimizer, memory as planned)"
# ... and beside context parallelism (each context rank routes its own tokens; the
# load-balancing sums are all-reduced over the context group from host memory).
for device in cpu emulated; do
  cp_run "moe_cp_$device" --model qwen3-moe-tiny --precision fp32 --device "$device"
done
same moe_cp_cpu moe_cp_emulated
echo "qwen3-moe-tiny zero3 P=2 (Ulysses) fp32: cpu = emulated"
# ... and E = 2 over the two context ranks (expert_group=expert+context: each rank holds
# half the experts, routes its own tokens to both), the emulated run with the offloaded
# optimizer (HostOwnedState skips the experts the other rank holds).
cp_run moe_cp_span_cpu --model qwen3-moe-tiny --precision fp32 --device cpu --expert-parallel 2
cp_run moe_cp_span_offload --model qwen3-moe-tiny --precision fp32 --device emulated \
  --expert-parallel 2 --offload optimizer
grep -q "expert_group=expert+context" "$WORK/moe_cp_span_cpu.log" || fail "moe_cp_span_cpu: no expert group over the context ranks"
same moe_cp_span_cpu moe_cp_span_offload
echo "qwen3-moe-tiny zero3 P=2 x E=2 over the context ranks fp32: cpu = emulated + --offload optimizer"

# Bad input: one line each, nothing written.
expect_error "--offload optimizer moves the optimizer state" \
  "$SHARDLM" train "${TINY[@]}" --data "$WORK/data" --out "$WORK/bad1" --device cpu --offload optimizer
expect_error "--device: 'tpu' is not a device" \
  "$SHARDLM" train "${TINY[@]}" --data "$WORK/data" --out "$WORK/bad2" --device tpu
expect_error "--offload must be none or optimizer" \
  "$SHARDLM" train "${TINY[@]}" --data "$WORK/data" --out "$WORK/bad3" --device emulated --offload params
"$SHARDLM" train --help > "$WORK/help.txt"
grep -q -- '--device' "$WORK/help.txt" && grep -q 'cuda' "$WORK/help.txt" \
  || fail "train --help does not describe --device cuda"
# Without a GPU: a clear error naming the device (never a crash or a CPU fallback).
if ! nvidia-smi -L > /dev/null 2>&1; then
  expect_error "--device cuda" \
    "$SHARDLM" train "${TINY[@]}" --data "$WORK/data" --out "$WORK/bad4" --device cuda
  [ ! -e "$WORK/bad4/checkpoints" ] || fail "a failed --device cuda run wrote checkpoints"
fi
echo "device_emulated: all checks passed"
