#!/usr/bin/env bash
# train --strategy auto: the run takes plan's recommendation (the same choice as
# `plan --strategy auto` for the same budget), says why on its first line, records the
# chosen options in config.json and trains exactly as the explicitly chosen strategy
# (same weights digest) at N=1 and N=2; a budget nothing fits is a one-line error
# naming the smallest change; a resumed auto run ends on the straight run's digest; a
# LoRA run with step times picks ddp; a budget only tensor parallelism fits makes it
# choose --tensor-parallel 2, and the run holds what plan said; a mixture of experts
# runs the expert-parallel layout auto chose; --grad-accum is planned and kept.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
# No calibrated profile: the choice is plan's rule without step times (fewest bytes
# on the wire among those that fit), independent of this machine's speed.
export SHARDLM_PROFILE="$WORK/no-profile.json"
SHAPE=(--model gpt2-tiny --n-layer 2 --n-embd 32 --n-head 2 --seq-len 32 --micro-batch 4)
RUN=("${TINY[@]}" --data "$WORK/data" --steps 4 --global-batch 8)

# The flags config.json says the run used, as train flags.
flags_of() {
  python3 - "$1/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
f = ["--strategy", c["strategy"]]
if c["strategy"] == "hybrid": f += ["--shard-group-size", str(c["shard_group_size"])]
if c["strategy"] in ("zero3", "hybrid"): f += ["--reshard-after-forward", str(c["reshard_after_forward"]).lower()]
if c["activation_checkpointing"]: f += ["--activation-checkpointing"]
assert c["strategy_auto"].startswith("strategy auto -> "), c
print(" ".join(f))
PY
}

# run_auto N NAME [flags...]: an auto run whose stdout's first line is the reason, then
# the explicitly chosen run, which must end on the same digest.
run_auto() {
  local n="$1" name="$2"; shift 2
  local launcher=()
  [ "$n" -eq 1 ] || launcher=(run_mpi "$n")
  "${launcher[@]}" "$SHARDLM" train "${RUN[@]}" --out "$WORK/$name" --strategy auto "$@" \
    > "$WORK/$name.log" 2> "$WORK/$name.err" || { cat "$WORK/$name.err"; fail "auto run $name failed"; }
  head -n 1 "$WORK/$name.log" | grep -q "^strategy auto -> " \
    || fail "$name: first line is not the reason: $(head -n 1 "$WORK/$name.log")"
  local chosen
  chosen="$(flags_of "$WORK/$name")" || fail "$name: config.json lacks the chosen options"
  # shellcheck disable=SC2086
  "${launcher[@]}" "$SHARDLM" train "${RUN[@]}" --out "$WORK/$name-explicit" $chosen > /dev/null \
    2> "$WORK/$name-explicit.err" || { cat "$WORK/$name-explicit.err"; fail "explicit run $name failed"; }
  local a b
  a="$(digest_of "$WORK/$name")"; b="$(digest_of "$WORK/$name-explicit")"
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "$name: auto ($a) and '$chosen' ($b) differ"
  echo "$chosen"
}

# Plenty of memory: ddp, which moves the fewest bytes (N=1: nothing moves at all).
chosen="$(run_auto 1 n1)"
[ "$chosen" = "--strategy ddp" ] || fail "N=1 chose '$chosen', expected ddp"
grep -q "^strategy auto -> ddp: fits with .* to spare and moves the fewest bytes" "$WORK/n1.log" \
  || fail "N=1 reason: $(head -n 1 "$WORK/n1.log")"
chosen="$(run_auto 2 n2)"
[ "$chosen" = "--strategy ddp" ] || fail "N=2 chose '$chosen', expected ddp"

# A budget just below ddp's: train picks what `plan --strategy auto` picks for it.
ddp_total="$("$SHARDLM" plan "${SHAPE[@]}" -n 2 --global-batch 8 --data "$WORK/data" --strategy ddp --json \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"])')"
budget="$(python3 -c "print('%.9f' % (($ddp_total - 1) / 2**30))")"
plan_flags="$("$SHARDLM" plan "${SHAPE[@]}" -n 2 --global-batch 8 --data "$WORK/data" --strategy auto \
  --memory-per-rank "$budget" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["flags"])')"
chosen="$(run_auto 2 tight --memory-per-rank "$budget")"
[ "$chosen" != "--strategy ddp" ] || fail "ddp chosen although it needs $ddp_total bytes > $budget GiB"
normalize() { echo "$1" | sed 's/ --reshard-after-forward true//'; }
[ "$(normalize "$chosen")" = "$(normalize "$plan_flags")" ] \
  || fail "train chose '$chosen', plan recommends '$plan_flags' for $budget GiB"

# Resume under auto: 4 steps saved at 2 and 4; the step-4 checkpoint dropped, the
# resumed run must end on the straight run's digest.
run_mpi 2 "$SHARDLM" train "${RUN[@]}" --out "$WORK/split" --strategy auto --save-every 2 \
  --memory-per-rank "$budget" > /dev/null 2>&1 || fail "first run of the resume case failed"
rm -rf "$WORK/split/checkpoints/step_00000004"
echo step_00000002 > "$WORK/split/checkpoints/latest"
run_mpi 2 "$SHARDLM" train "${RUN[@]}" --out "$WORK/split" --strategy auto --save-every 2 --resume \
  --memory-per-rank "$budget" > "$WORK/resume.log" 2>&1 || { cat "$WORK/resume.log"; fail "resume failed"; }
grep -q "resumed from" "$WORK/resume.log" || fail "did not resume"
[ "$(digest_of "$WORK/split")" = "$(digest_of "$WORK/tight")" ] || fail "resumed auto run differs"

# LoRA with step times (this machine's kind of figures: a 2-core CPU's rates as
# `calibrate` measured them, shared-memory collectives): the adapters' gradients and
# AdamW state are a few KiB, so sharding buys nothing: ddp, zero1 and zero2 are
# predicted within 1% and ddp, the simplest, is chosen; the auto run trains exactly as
# --strategy ddp.
cat > "$WORK/cpu-profile.json" <<'JSON'
{"name": "cpu-like", "memory_per_rank_gib": 8, "ranks_per_node": 2,
 "compute": [{"ranks_per_node": 2, "threads_per_rank": 1, "rates": {"fp32": {
   "gemm_gflop_per_s": 11, "attention_gflop_per_s": 4.6, "elementwise_gb_per_s": 2.7,
   "loss_gb_per_s": 2.6, "state_gb_per_s": 4}}}],
 "intra_node": {"name": "shm", "all_gather": {"latency_us": 20, "bus_gb_per_s": 0.25},
   "reduce_scatter": {"latency_us": 20, "bus_gb_per_s": 0.25},
   "all_reduce": {"latency_us": 20, "bus_gb_per_s": 0.25}, "compute_share_during_comm": 0.5},
 "inter_node": {"name": "tcp", "all_gather": {"latency_us": 50, "bus_gb_per_s": 0.1},
   "reduce_scatter": {"latency_us": 50, "bus_gb_per_s": 0.1},
   "all_reduce": {"latency_us": 50, "bus_gb_per_s": 0.1}, "compute_share_during_comm": 0.5}}
JSON
LORA_RUN=(--model llama-tiny --seq-len 32 --micro-batch 4 --threads 1 --lora-rank 4 --lora-targets all-linear
          --data "$WORK/data" --steps 2 --global-batch 8)
SHARDLM_PROFILE="$WORK/cpu-profile.json" run_mpi 2 "$SHARDLM" train "${LORA_RUN[@]}" --strategy auto \
  --out "$WORK/lora-auto" > "$WORK/lora-auto.log" 2>&1 || { cat "$WORK/lora-auto.log"; fail "LoRA auto run failed"; }
grep -q "^strategy auto -> ddp: fits with .* to spare, predicted .* per step" "$WORK/lora-auto.log" \
  || fail "LoRA auto run did not choose ddp by step time: $(head -n 1 "$WORK/lora-auto.log")"
run_mpi 2 "$SHARDLM" train "${LORA_RUN[@]}" --strategy ddp --out "$WORK/lora-ddp" > /dev/null 2>&1 \
  || fail "LoRA ddp run failed"
[ "$(digest_of "$WORK/lora-auto")" = "$(digest_of "$WORK/lora-ddp")" ] || fail "LoRA auto and ddp runs differ"

# Tensor parallelism: llama-tiny at 1024 tokens in bf16 on 2 ranks, a budget 1 byte
# below the least of the unsplit layouts (ddp, zero1/2/3, with and without
# checkpointing): auto takes a T = 2 layout and runs it on a mesh of 2 tensor ranks.
TP_SHAPE=(--model llama-tiny --seq-len 1024 --micro-batch 1 --precision bf16)
unsplit_least="$("$SHARDLM" plan "${TP_SHAPE[@]}" -n 2 --data "$WORK/data" --strategy zero3 \
  --activation-checkpointing --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"])')"
for s in ddp zero1 zero2 zero3; do
  for ckpt in "" --activation-checkpointing; do
    t="$("$SHARDLM" plan "${TP_SHAPE[@]}" -n 2 --data "$WORK/data" --strategy "$s" $ckpt --json \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"])')"
    [ "$t" -lt "$unsplit_least" ] && unsplit_least="$t"
  done
done
tp_budget="$(python3 -c "print('%.9f' % (($unsplit_least - 1) / 2**30))")"
# (stdout and stderr to separate files, as in run_auto: the reason is stdout's first
# line, and under mpirun any stderr line, a rank's or mpirun's own, could come first.)
run_mpi 2 "$SHARDLM" train "${TP_SHAPE[@]}" --data "$WORK/data" --threads 1 --steps 2 --eval-batches 0 \
  --strategy auto --memory-per-rank "$tp_budget" --out "$WORK/tp-auto" > "$WORK/tp-auto.log" 2> "$WORK/tp-auto.err" \
  || { cat "$WORK/tp-auto.log" "$WORK/tp-auto.err"; fail "auto run with a tensor-parallel budget"; }
head -n 1 "$WORK/tp-auto.log" | grep -q "^strategy auto -> [a-z0-9 ]* x tp2" \
  || fail "auto did not choose T=2: $(head -n 1 "$WORK/tp-auto.log")"
chosen="$(head -n 1 "$WORK/tp-auto.log" | sed 's/^strategy auto -> \([^:]*\):.*/\1/')"
python3 - "$WORK/tp-auto" "$chosen" <<'PY' || fail "the tensor-parallel auto run is not the layout it chose"
import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))
assert c["mesh"]["tensor"] == 2, c["mesh"]
print(f"auto with a budget only T=2 fits: {sys.argv[2]} (mesh {c['mesh']})")
PY

# A mixture of experts: qwen3-moe-tiny on 2 ranks without a profile: ddp x ep2 moves the
# fewest bytes (each expert's gradient stays on its one holder; only the dense units'
# are all-reduced), so auto runs it, on a mesh of 2 expert ranks, and ends on the
# explicit --expert-parallel 2 run's digest.
MOE_RUN=(--model qwen3-moe-tiny --seq-len 32 --micro-batch 2 --global-batch 8 --threads 1
         --data "$WORK/data" --steps 2 --eval-batches 0)
run_mpi 2 "$SHARDLM" train "${MOE_RUN[@]}" --strategy auto --out "$WORK/moe-auto" > "$WORK/moe-auto.log" \
  2> "$WORK/moe-auto.err" || { cat "$WORK/moe-auto.log" "$WORK/moe-auto.err"; fail "MoE auto run failed"; }
head -n 1 "$WORK/moe-auto.log" | grep -q "^strategy auto -> ddp x ep2: fits with .* and moves the fewest bytes" \
  || fail "MoE auto did not choose ddp x ep2: $(head -n 1 "$WORK/moe-auto.log")"
python3 -c 'import json,sys; m = json.load(open(sys.argv[1]))["mesh"]; assert m["expert"] == 2, m' \
  "$WORK/moe-auto/config.json" || fail "the MoE auto run is not on 2 expert ranks"
run_mpi 2 "$SHARDLM" train "${MOE_RUN[@]}" --strategy ddp --expert-parallel 2 --out "$WORK/moe-ep2" \
  > /dev/null 2>&1 || fail "MoE --expert-parallel 2 run failed"
[ "$(digest_of "$WORK/moe-auto")" = "$(digest_of "$WORK/moe-ep2")" ] || fail "MoE auto and ddp x ep2 runs differ"
echo "MoE: auto -> ddp x ep2 (mesh expert=2), the explicit run's digest"

# --grad-accum 2 with auto: plan runs 2 micro-batches per rank (the global batch of
# 4 x 2 ranks x 2 sequences), and the auto run names that global batch.
accum="$("$SHARDLM" plan "${SHAPE[@]}" -n 2 --grad-accum 2 --data "$WORK/data" --strategy auto --json \
  | python3 -c 'import json,sys; p = json.load(sys.stdin)["plan"]; print(p["accumulation"], int(p["tokens_per_step"]))')"
[ "$accum" = "2 512" ] || fail "plan --strategy auto --grad-accum 2 planned '$accum' (accumulation, tokens)"
run_mpi 2 "$SHARDLM" train "${TINY[@]}" --data "$WORK/data" --steps 2 --grad-accum 2 --strategy auto \
  --out "$WORK/accum-auto" > "$WORK/accum-auto.log" 2>&1 || { cat "$WORK/accum-auto.log"; fail "auto --grad-accum run failed"; }
python3 -c 'import json,sys; c = json.load(open(sys.argv[1]))["options"]; assert c["global_batch"] == 16, c["global_batch"]' \
  "$WORK/accum-auto/config.json" || fail "auto --grad-accum 2 did not run 16 sequences per step"
echo "auto --grad-accum 2: planned and run at 2 micro-batches per rank (16 sequences per step)"

# Nothing fits: one line naming the smallest change, non-zero exit, nothing written.
# (A budget 1 byte below the smallest candidate, zero1 with activation checkpointing.)
smallest="$("$SHARDLM" plan "${SHAPE[@]}" -n 1 --global-batch 8 --data "$WORK/data" --strategy zero1 \
  --activation-checkpointing --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"])')"
below="$(python3 -c "print('%.9f' % (($smallest - 1) / 2**30))")"
expect_error "--strategy auto: nothing fits in [0-9.]* MiB per rank (.*): the smallest change that fits is --" \
  "$SHARDLM" train "${RUN[@]}" --out "$WORK/none" --strategy auto --memory-per-rank "$below"
[ ! -e "$WORK/none" ] || fail "a run that cannot fit wrote its run directory"
expect_error "--memory-per-rank is the budget of --strategy auto" \
  "$SHARDLM" train "${RUN[@]}" --out "$WORK/x" --strategy ddp --memory-per-rank 1
expect_error "--memory-per-rank must be a finite number > 0" \
  "$SHARDLM" train "${RUN[@]}" --out "$WORK/x" --strategy auto --memory-per-rank -1
echo "1 passed, 0 failed"
