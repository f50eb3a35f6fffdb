#!/usr/bin/env bash
# Memory per rank by category (from the tracker, as bytes) and bytes on the wire per
# step per rank, for each strategy at N = 2 and 4, against the sharding arithmetic:
#   ddp 16 Psi; zero1 8 Psi + 8 Psi/N; zero2 4 Psi + 12 Psi/N; zero3 16 Psi/N;
#   traffic 2 Psi (N-1)/N x 4 bytes (zero3: 3 Psi), within 2%.
# zero2/zero3 also hold transient full-unit buffers, asserted byte for byte: two
# gradient buffers of the largest block (the unit being differentiated and the one
# being reduced), zero3's prefetch+1 gathered blocks, and for the tied embedding
# (read again by the LM head) one gathered and one gradient buffer of its own.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
# 8 blocks of 64 wide so the embedding unit is small next to the blocks.
MODEL=(--model gpt2-tiny --n-layer 8 --n-embd 64 --n-head 4 --seq-len 32 --threads 1 --lr 1e-3
       --min-unit-params 0)  # one flat unit per model unit, as the arithmetic assumes
for n in 2 4; do
  for strategy in ddp zero1 zero2 "zero3 --prefetch 1" "zero3 --prefetch 2"; do
    out="$WORK/n${n}_${strategy// /_}"
    # shellcheck disable=SC2086
    run_mpi "$n" "$SHARDLM" train "${MODEL[@]}" --micro-batch 1 --global-batch "$n" --steps 3 \
      --eval-batches 0 --data "$WORK/data" --out "$out" --strategy $strategy > "$out.log" 2>&1 \
      || { cat "$out.log"; fail "N=$n $strategy"; }
    python3 - "$out" "$n" $strategy <<'PY' || fail "N=$n $strategy: see above"
import json, sys
out, n, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
prefetch = int(sys.argv[5]) if len(sys.argv) > 5 else 1
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
    "zero3": {"params": 4 * (shard + P0 + (prefetch + 1) * Pmax),
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
transient = sum(expected.values()) - ideal
ratio = measured / ideal
if (measured - transient) / ideal > 1.05:
    print(f"{kind} N={n}: {measured - transient} persistent bytes > 1.05 x ideal {ideal}")
    ok = False
wire = records[1]["comm_bytes"]  # a step without start-up or evaluation traffic
wire_ideal = (3 if kind == "zero3" else 2) * real * (n - 1) / n * 4
if abs(wire / wire_ideal - 1) > 0.02:
    print(f"{kind} N={n}: {wire} bytes on the wire per step, ideal {wire_ideal:.0f}")
    ok = False
print(f"{kind:5} N={n} prefetch={prefetch}: params+grads+optimizer {measured/2**20:.2f} MiB "
      f"= {ratio:.3f}x ideal (transient buffers {transient/2**20:.2f} MiB), "
      f"wire {wire/2**20:.3f} MiB/step ({wire/wire_ideal:.4f}x ideal)")
sys.exit(0 if ok else 1)
PY
  done
done
echo "1 passed, 0 failed"
