#!/usr/bin/env bash
# --precision and --activation-checkpointing end to end:
#  1. 200 steps on TinyShakespeare (byte tokenizer): bf16 and fp16 end within 2% of
#     fp32's final loss (validation loss, and the mean of the last 20 train losses),
#     and they really ran in another precision (their losses are not fp32's bits);
#     so does bf16 with gradients reduced in bf16 (--reduce-dtype bf16).
#  2. fp16 with an initial loss scale of 1e12: the first steps overflow, are skipped
#     and counted, the scale halves on each, then training proceeds; the scale grows
#     after --loss-scale-growth-interval good steps.
#  3. fp16 resume is exact: the loss scaler's state travels in the checkpoint.
#  4. --activation-checkpointing changes no bit of the trained weights (fp32, bf16).
source "$(dirname "$0")/lib/common.sh" "$@"
head -c 300000 "$SHARED_DATA/tinyshakespeare.txt" > "$WORK/shakespeare.txt"
"$SHARDLM" prepare --tokenizer byte --input "$WORK/shakespeare.txt" --out "$WORK/data" > /dev/null
SMALL=(--model gpt2-tiny --n-layer 2 --n-embd 64 --n-head 4 --seq-len 64 --micro-batch 8
       --threads 1 --lr 3e-3 --warmup 10 --eval-batches 16 --data "$WORK/data")

# Python (stdlib only) over metrics.jsonl files.
py() { python3 -c "import json,sys
def recs(run): return [json.loads(l) for l in open(run + '/metrics.jsonl')]
$1" "${@:2}"; }

# 1. Final loss within 2% of fp32's.
for p in fp32 bf16 fp16; do
  # (The final sample runs the head's logits in the compute type too.)
  "$SHARDLM" train "${SMALL[@]}" --steps 200 --precision "$p" --out "$WORK/$p" --sample-tokens 24 \
    > "$WORK/$p.log" 2>&1 || { cat "$WORK/$p.log"; fail "$p run failed"; }
  grep -q -- "--- sample ---" "$WORK/$p.log" || fail "$p: no sample"
done
"$SHARDLM" train "${SMALL[@]}" --steps 200 --precision bf16 --reduce-dtype bf16 \
  --out "$WORK/bf16_reduce_bf16" > "$WORK/bf16_reduce_bf16.log" 2>&1 \
  || { cat "$WORK/bf16_reduce_bf16.log"; fail "bf16 with --reduce-dtype bf16 failed"; }
for p in bf16 fp16 bf16_reduce_bf16; do
  py '
ref, run = recs(sys.argv[1]), recs(sys.argv[2])
label = sys.argv[2].split("/")[-1]
assert len(run) == 200, len(run)
def tail_mean(r): return sum(x["loss"] for x in r[-20:]) / 20
for name, a, b in [("val loss", ref[-1]["val_loss"], run[-1]["val_loss"]),
                   ("mean of the last 20 train losses", tail_mean(ref), tail_mean(run))]:
    rel = abs(b - a) / a
    print(f"{label}: {name} {b:.4f} vs fp32 {a:.4f} ({100 * rel:.3f}%)")
    assert rel < 0.02, f"{name} differs from fp32 by {100 * rel:.2f}% (limit 2%)"
assert a < 3.0, f"the model did not learn (val loss {a})"
assert any(x["loss"] != y["loss"] for x, y in zip(ref, run)), "losses are bitwise fp32'"'"'s"
' "$WORK/fp32" "$WORK/$p" || fail "$p final loss not within 2% of fp32"
done
py 'assert "loss_scale" not in recs(sys.argv[1])[-1] and "loss_scale" in recs(sys.argv[2])[-1]' \
  "$WORK/bf16" "$WORK/fp16" || fail "loss_scale metric: only fp16 runs report it"

# 2. Forced overflow: skipped, counted, backed off; then growth.
"$SHARDLM" train "${SMALL[@]}" --steps 40 --precision fp16 --loss-scale 1e12 \
  --loss-scale-growth-interval 10 --out "$WORK/overflow" > "$WORK/overflow.log" 2>&1 \
  || { cat "$WORK/overflow.log"; fail "overflow run failed"; }
py '
r = recs(sys.argv[1])
skipped = [x for x in r if x.get("skipped")]
assert r[0].get("skipped") and r[0]["loss_scale"] == 1e12, "step 1 must overflow at scale 1e12"
assert 5 <= len(skipped) <= 30, f"{len(skipped)} skipped steps"
for a, b in zip(r, r[1:]):
    if a.get("skipped"):  # every overflow halves the scale for the next step
        assert b["loss_scale"] == a["loss_scale"] / 2, (a["step"], a["loss_scale"], b["loss_scale"])
    assert b["skipped_steps"] == a["skipped_steps"] + (1 if b.get("skipped") else 0)
    assert (a.get("grad_norm") is None) == bool(a.get("skipped"))
first_good = next(i for i, x in enumerate(r) if not x.get("skipped"))
# After 10 good steps in a row the scale doubles (and may overflow again: then it
# backs off once more, as checked above).
assert not any(x.get("skipped") for x in r[first_good:first_good + 10])
assert r[first_good + 10]["loss_scale"] == 2 * r[first_good]["loss_scale"]
assert r[-1]["loss"] < r[first_good]["loss"] - 0.2, "training did not proceed after the skips"
settled, final = r[first_good]["loss_scale"], r[-1]["loss_scale"]
print(f"overflow: {len(skipped)} steps skipped, scale 1e12 -> {settled:.0f}, then {final:.0f}")
' "$WORK/overflow" || fail "loss scaler did not skip and back off as expected"

# 3. fp16 resume is exact (the scaler state at step 10 is far from the initial 1e12).
FP16=("${SMALL[@]}" --steps 20 --precision fp16 --loss-scale 1e12 --loss-scale-growth-interval 4)
"$SHARDLM" train "${FP16[@]}" --out "$WORK/straight" > /dev/null
"$SHARDLM" train "${FP16[@]}" --save-every 10 --out "$WORK/split" > /dev/null
rm -rf "$WORK/split/checkpoints/step_00000020"
echo step_00000010 > "$WORK/split/checkpoints/latest"
"$SHARDLM" train "${FP16[@]}" --save-every 10 --out "$WORK/split" --resume > "$WORK/resume.log"
grep -q "resumed from" "$WORK/resume.log" || fail "did not resume"
a="$(digest_of "$WORK/straight")"
b="$(digest_of "$WORK/split")"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "fp16 resume: digests differ: straight $a vs resumed $b"

# 4. Activation checkpointing: same weights, bit for bit.
for p in fp32 bf16; do
  "$SHARDLM" train "${SMALL[@]}" --steps 10 --precision "$p" --out "$WORK/plain_$p" > /dev/null
  "$SHARDLM" train "${SMALL[@]}" --steps 10 --precision "$p" --activation-checkpointing \
    --out "$WORK/ckpt_$p" > /dev/null
  a="$(digest_of "$WORK/plain_$p")"
  b="$(digest_of "$WORK/ckpt_$p")"
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "$p: activation checkpointing changed the weights"
done
py 'assert recs(sys.argv[1])[-1]["mem"]["peak"]["activations"] < recs(sys.argv[2])[-1]["mem"]["peak"]["activations"]' \
  "$WORK/ckpt_fp32" "$WORK/plain_fp32" || fail "checkpointing did not lower activation memory"

expect_error "--precision 'fp8' is not a precision" \
  "$SHARDLM" train "${SMALL[@]}" --steps 1 --precision fp8 --out "$WORK/bad"
echo "1 passed, 0 failed"
