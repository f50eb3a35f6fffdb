#!/usr/bin/env bash
# Memory per rank by category (from the tracker, as bytes) and bytes on the wire per
# step per rank, for each strategy at N = 2 and 4, against the sharding arithmetic:
#   ddp 16 Psi; zero1 8 Psi + 8 Psi/N; zero2 4 Psi + 12 Psi/N; zero3 16 Psi/N;
#   traffic 2 Psi (N-1)/N x 4 bytes (zero3: 3 Psi), within 2%.
# With --precision bf16, zero3 gathers parameters in bf16: its gather buffers are
# half of fp32's, byte for byte, and gathers move half the bytes; with --reduce-dtype
# bf16 gradients reduce-scatter at half the bytes (DDP's all-gather stays fp32).
# zero2/zero3 also hold transient full-unit buffers, asserted byte for byte: two
# gradient buffers of the largest block (the unit being differentiated and the one
# being reduced), zero3's prefetch+1 gathered blocks, and for the tied embedding
# (read again by the LM head) one gathered and one gradient buffer of its own.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
# 8 blocks of 64 wide so the embedding unit is small next to the blocks.
MODEL=(--model gpt2-tiny --n-layer 8 --n-embd 64 --n-head 4 --seq-len 32 --threads 1 --lr 1e-3
       --min-unit-params 0)  # one flat unit per model unit, as the arithmetic assumes
configurations() {
  echo ddp; echo zero1; echo zero2; echo "zero3 --prefetch 1"; echo "zero3 --prefetch 2"
  if [ "$1" = 2 ]; then
    echo "zero3 --prefetch 1 --precision bf16"; echo "zero3 --prefetch 2 --precision bf16"
    echo "zero3 --prefetch 1 --precision bf16 --reduce-dtype bf16"
    echo "ddp --reduce-dtype bf16"; echo "zero2 --reduce-dtype bf16"
  fi
}
for n in 2 4; do
  while read -r strategy; do
    out="$WORK/n${n}_${strategy// /_}"
    # shellcheck disable=SC2086
    run_mpi "$n" "$SHARDLM" train "${MODEL[@]}" --micro-batch 1 --global-batch "$n" --steps 3 \
      --eval-batches 0 --data "$WORK/data" --out "$out" --strategy $strategy > "$out.log" 2>&1 < /dev/null \
      || { cat "$out.log"; fail "N=$n $strategy"; }
    python3 - "$out" "$n" $strategy <<'PY' || fail "N=$n $strategy: see above"
import json, sys
out, n, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
flags = dict(zip(sys.argv[4::2], sys.argv[5::2]))
prefetch = int(flags.get("--prefetch", 1))
precision = flags.get("--precision", "fp32")
reduce_dtype = flags.get("--reduce-dtype", "fp32")
C = 64
# Bytes per element: of gathered parameters (zero3 gathers in the compute type), and
# of gradients on the wire.
pb = 2 if precision == "bf16" else 4
rb = 2 if reduce_dtype == "bf16" else 4
# A bf16 model rounds a unit's vectors into a scratch of 13 C floats (params).
vectors = 13 * C * 4 if precision == "bf16" else 0
step = open(f"{out}/checkpoints/latest").read().strip()
units = json.load(open(f"{out}/checkpoints/{step}/manifest.json"))["units"]
records = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
P = [u["padded_numel"] for u in units]
psi = sum(P)
real = sum(eval("*".join(map(str, p["shape"]))) for u in units for p in u["params"])
shard = psi // n
# The unit holding the embedding is read again by the final unit (tied LM head).
shared = next(i for i, u in enumerate(units) if any(p["name"] == "transformer.wte.weight" for p in u["params"]))
P0 = P[shared]
Pmax = max(p for i, p in enumerate(P) if i != shared)
expected = {
    "ddp":   {"params": 4 * psi, "grads": 4 * psi, "optimizer": 8 * psi},
    "zero1": {"params": 4 * psi, "grads": 4 * psi, "optimizer": 8 * shard},
    "zero2": {"params": 4 * psi, "grads": 4 * (shard + P0 + 2 * Pmax), "optimizer": 8 * shard},
    "zero3": {"params": 4 * shard + pb * (P0 + (prefetch + 1) * Pmax) + vectors,
              "grads": 4 * (shard + P0 + 2 * Pmax), "optimizer": 8 * shard},
}[kind]
ideal = {"ddp": 16 * psi, "zero1": 8 * psi + 8 * shard, "zero2": 4 * psi + 12 * shard,
         "zero3": 16 * shard}[kind]
peak = records[-1]["mem"]["peak"]
ok = True
for category, want in expected.items():
    if peak[category] != want:
        print(f"{kind} N={n}: peak {category} {peak[category]} bytes, expected {want}")
        ok = False
measured = sum(peak[c] for c in ("params", "grads", "optimizer"))
transient = sum(expected.values()) - ideal - vectors
ratio = measured / ideal
if (measured - transient) / ideal > 1.05:
    print(f"{kind} N={n}: {measured - transient} persistent bytes > 1.05 x ideal {ideal}")
    ok = False
wire = records[1]["comm_bytes"]  # a step without start-up or evaluation traffic
# Per element: zero3 gathers twice and reduce-scatters once; the others reduce-scatter
# and all-gather once (DDP's gradients, zero1/zero2's updated parameters) in fp32.
wire_ideal = ((2 * pb + rb) if kind == "zero3" else (rb + 4)) * real * (n - 1) / n
if abs(wire / wire_ideal - 1) > 0.02:
    print(f"{kind} N={n}: {wire} bytes on the wire per step, ideal {wire_ideal:.0f}")
    ok = False
if precision == "bf16" and kind == "zero3":
    gathered = peak["params"] - 4 * shard - vectors
    print(f"zero3 bf16 gathered params: {gathered} bytes = {gathered / (4 * (P0 + (prefetch + 1) * Pmax)):.3f}"
          " x fp32's")
print(f"{kind:5} N={n} prefetch={prefetch} {precision} reduce {reduce_dtype}: params+grads+optimizer {measured/2**20:.2f} MiB "
      f"= {ratio:.3f}x ideal (transient buffers {transient/2**20:.2f} MiB), "
      f"wire {wire/2**20:.3f} MiB/step ({wire/wire_ideal:.4f}x ideal)")
sys.exit(0 if ok else 1)
PY
  done < <(configurations "$n")
done
echo "1 passed, 0 failed"
