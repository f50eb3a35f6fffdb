#!/usr/bin/env bash
# `shardlm plan` predicts what a run allocates: for each configuration below, the
# plan's bytes per category (params, grads, optimizer, activations, comm) must equal
# the tracker's peak of the real run on rank 0, byte for byte, and its traffic must
# be within 3% of the measured bus bytes of a steady step. Covers every strategy,
# merged and unmerged units, bf16 (zero3 gathering in bf16; ddp/zero2 keeping a bf16
# copy of their parameters), --reduce-dtype bf16,
# activation checkpointing, gradient accumulation and hybrid sharding; LoRA and QLoRA
# (the frozen base's bytes, an NF4 base's dequantization buffer) on a Llama shape; on
# the emulated device, with and without --offload optimizer, the device's categories
# and the host's (HostOwnedState); context parallelism (Ulysses, ring, hybrid) on gpt2
# and on a mixture of experts (with LoRA on its experts).
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
SHAPE=(--model gpt2-tiny --n-layer 3 --n-embd 64 --n-head 4 --seq-len 32 --micro-batch 2)
check() {
  local name="$1" n="$2"; shift 2
  local out="$WORK/$name"
  "$SHARDLM" plan "${SHAPE[@]}" -n "$n" --data "$WORK/data" "$@" --json > "$out.plan.json" \
    || fail "$name: plan failed"
  # One rank runs as a plain process (under mpirun it would also hold MPI's scratch).
  local launcher=(run_mpi "$n")
  [ "$n" -gt 1 ] || launcher=()
  "${launcher[@]}" "$SHARDLM" train "${SHAPE[@]}" --threads 1 --steps 3 --eval-batches 0 \
    --data "$WORK/data" --out "$out" "$@" > "$out.log" 2>&1 < /dev/null \
    || { cat "$out.log"; fail "$name: train failed"; }
  python3 - "$name" "$out.plan.json" "$out/metrics.jsonl" <<'PY' || fail "$name: see above"
import json, sys
name, plan, records = sys.argv[1], json.load(open(sys.argv[2])), [json.loads(l) for l in open(sys.argv[3])]
# A device run: plan's categories are the device's, its "host" the host tracker's.
on_device = "host" in plan
peak = records[-1]["device_mem" if on_device else "mem"]["peak"]
ok = True
for category in ("params", "grads", "optimizer", "activations", "comm", "frozen"):
    if plan[category] != peak[category]:
        print(f"{name}: {category}: plan {plan[category]} bytes, measured {peak[category]}")
        ok = False
if on_device:
    for category in ("params", "grads", "optimizer", "frozen", "comm"):
        measured = records[-1]["mem"]["peak"][category]
        if plan["host"][category] != measured:
            print(f"{name}: host {category}: plan {plan['host'][category]} bytes, measured {measured}")
            ok = False
wire = records[1]["comm_bytes"]
if plan["wire_bytes_per_step"] == 0:
    ok = ok and wire == 0
elif abs(wire / plan["wire_bytes_per_step"] - 1) > 0.03:
    print(f"{name}: wire: plan {plan['wire_bytes_per_step']:.0f} bytes/step, measured {wire}")
    ok = False
ratio = wire / plan["wire_bytes_per_step"] if plan["wire_bytes_per_step"] else 1.0
host = f", host {plan['host']['total'] / 2**20:.2f} MiB as planned" if on_device else ""
print(f"{name}: params/grads/optimizer/activations/comm/frozen as planned ({plan['total'] / 2**20:.2f} MiB "
      f"with other{host}), wire {ratio:.4f}x plan")
sys.exit(0 if ok else 1)
PY
}
check single 1
check ddp_n2 2 --strategy ddp
check zero1_n2 2 --strategy zero1
check ddp_bf16_accumulation_n2 2 --strategy ddp --precision bf16 --global-batch 8
check zero2_bf16_checkpointing_n2 2 --strategy zero2 --precision bf16 --activation-checkpointing
check zero3_unmerged_n2 2 --strategy zero3 --min-unit-params 0 --prefetch 2
check zero3_bf16_reduce_bf16_n2 2 --strategy zero3 --precision bf16 --reduce-dtype bf16
check zero3_fp16_n3 3 --strategy zero3 --precision fp16 --micro-batch 1 --global-batch 3
check zero2_accumulation_n2 2 --strategy zero2 --global-batch 8
check zero3_keep_gathered_n2 2 --strategy zero3 --reshard-after-forward false --global-batch 8
check hybrid_n4 4 --strategy hybrid --shard-group-size 2
# --offload optimizer on the emulated device: the device's categories and the host's.
check offload_ddp_bf16_accumulation_n2 2 --strategy ddp --precision bf16 --global-batch 8 \
  --device emulated --offload optimizer
check offload_zero3_bf16_n2 2 --strategy zero3 --precision bf16 --device emulated --offload optimizer
check offload_zero1_fp32_n2 2 --strategy zero1 --device emulated --offload optimizer
check mirror_zero2_bf16_n2 2 --strategy zero2 --precision bf16 --device emulated
# Context parallelism: each rank's activations for its T/P tokens plus the attention's
# exchange buffers and saved state, the all-to-alls and ring send_recvs on the wire.
check cp_ulysses_zero3_n2 2 --strategy zero3 --context-parallel 2
check cp_ring_ddp_bf16_n2 2 --strategy ddp --precision bf16 --context-parallel 2 --context-parallel-kind ring
check cp_hybrid_zero3_checkpointing_n4 4 --strategy zero3 --context-parallel 4 --context-parallel-kind hybrid \
  --ulysses-degree 2 --activation-checkpointing
# A mixture of experts under context parallelism (the load-balancing sums' all-reduce over
# the group), and with LoRA on its routed experts.
SHAPE=(--model qwen3-moe-tiny --seq-len 32 --micro-batch 2)
check moe_cp_ring_zero3_n2 2 --strategy zero3 --context-parallel 2 --context-parallel-kind ring
check moe_cp_ulysses_expert_lora_ddp_n2 2 --strategy ddp --context-parallel 2 --lora-rank 4 \
  --lora-targets q_proj,experts.gate_up_proj,experts.down_proj
SHAPE=(--model llama-tiny --seq-len 32 --micro-batch 2 --lora-rank 4)
check lora_zero3_bf16_n2 2 --strategy zero3 --precision bf16
check qlora_single 1 --quantize-base nf4
check qlora_ddp_bf16_n2 2 --strategy ddp --precision bf16 --quantize-base nf4
check qlora_zero2_fp16_n2 2 --strategy zero2 --precision fp16 --quantize-base nf4
check qlora_zero3_bf16_n2 2 --strategy zero3 --precision bf16 --quantize-base nf4 --min-unit-params 0
check qlora_zero3_checkpointing_n2 2 --strategy zero3 --activation-checkpointing --quantize-base nf4
check lora_offload_zero2_bf16_n2 2 --strategy zero2 --precision bf16 --device emulated --offload optimizer
echo "1 passed, 0 failed"
