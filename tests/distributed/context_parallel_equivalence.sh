#!/usr/bin/env bash
# Context parallelism (--context-parallel P, Ulysses, ring and hybrid): P ranks that split every
# sequence train the model one rank holding whole rows trains, on the same global batch,
# under ddp, zero1, zero2, zero3 and hybrid, Ulysses with the KV heads split (P = 2 over llama-tiny's 2) and
# replicated (P = 4), ring attention (zigzag split) at P = 2 and 4 and on qwen3-tiny's 3
# heads that Ulysses cannot split, gpt2-tiny under the ring, padded text rows and packed SFT rows (documents'
# positions and key_begin global; qwen2-tiny, and gpt2-tiny under Ulysses and hybrid), LoRA
# under both and under hybrid, QLoRA under the ring, qwen3-moe-tiny (the load-balancing loss over the group's
# rows; LoRA on its routed experts), bf16 and fp16 once (within 1e-2, bf16's tolerance against fp32
# here), and a ring P = 2 checkpoint resumed at P = 1 and 4 and a hybrid P = 4 one at P = 2
# (2 and 4 ranks) to what an uninterrupted run gives. Per-step loss and gradient norm agree to 1e-5 relative and the final weights
# to 1e-5 of the model's largest weight (inspect --relative-to model): not bitwise,
# because each rank's weight gradients sum over its own tokens and the partial sums are
# added by the reduction in another order than one GEMM over all tokens (fp32 rounding,
# ~4e-7 of a unit's largest gradient, test_context_parallel). AdamW's m / sqrt(v) turns
# such a difference in a gradient element near zero into up to a whole lr-sized step,
# so the largest difference relative to each tensor's own largest weight is ~3e-5 after
# 4 steps (llama-tiny, lr 3e-3), which is why the bound is the model's. Bad input is refused in one
# line before a run directory exists.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
BASE=(--seq-len 32 --threads 1 --lr 3e-3 --warmup 2 --grad-clip 0.5 --global-batch 4
      --steps 4 --eval-batches 0 --data "$WORK/data")

# close RUN_A RUN_B WHAT [RELATIVE_TO]: per-step loss and grad norm within 1e-5 relative,
# weights within 1e-5 (of the model's largest weight, or RELATIVE_TO as inspect takes it).
close() {
  same_curves "$1" "$2" 1e-5 "$3"
  "$SHARDLM" inspect "$1" --quiet --compare "$2" --tolerance 1e-5 --relative-to "${4:-model}" > "$WORK/compare.log" 2>&1 \
    || { cat "$WORK/compare.log"; fail "$3: weights differ beyond 1e-5"; }
  tail -n 1 "$WORK/compare.log"
}

for model in llama-tiny qwen2-tiny; do
  ref="$WORK/${model}_ref"
  "$SHARDLM" train --model "$model" "${BASE[@]}" --micro-batch 4 --out "$ref" > "$ref.log" 2>&1 \
    || { cat "$ref.log"; fail "$model reference"; }
  for run in "2 ddp 2 4" "2 zero3 2 4" "4 zero3 2 2" "4 ddp 4 4"; do
    read -r n strategy P micro <<< "$run"
    [ "$model" = qwen2-tiny ] && [ "$n" = 4 ] && continue  # llama-tiny covers the 4-rank meshes
    out="$WORK/${model}_${strategy}_n${n}_p${P}"
    run_mpi "$n" "$SHARDLM" train --model "$model" "${BASE[@]}" --micro-batch "$micro" \
      --strategy "$strategy" --context-parallel "$P" --out "$out" > "$out.log" 2>&1 \
      || { cat "$out.log"; fail "$model $strategy n=$n P=$P"; }
    grep -q "context=$P" "$out.log" || { cat "$out.log"; fail "$model: no context=$P in the mesh line"; }
    close "$out" "$ref" "$model $strategy n=$n --context-parallel $P vs one rank"
  done
done

# The other strategies over shard x context at N = 4, P = 2: zero1, zero2, and hybrid
# (replicate=2, shard=1, context=2), llama-tiny against the same one-rank reference.
for strategy in "zero1" "zero2" "hybrid --shard-group-size 1"; do
  name="${strategy%% *}"
  # shellcheck disable=SC2086
  run_mpi 4 "$SHARDLM" train --model llama-tiny "${BASE[@]}" --micro-batch 2 --strategy $strategy \
    --context-parallel 2 --out "$WORK/llama_${name}_p2" > "$WORK/llama_${name}_p2.log" 2>&1 \
    || { cat "$WORK/llama_${name}_p2.log"; fail "llama-tiny $name n=4 P=2"; }
  close "$WORK/llama_${name}_p2" "$WORK/llama-tiny_ref" "llama-tiny $name n=4 --context-parallel 2 vs one rank"
done

# Ring attention (--context-parallel-kind ring): the same equivalence; qwen3-tiny's 3
# query heads do not split for Ulysses, and need not for the ring. qwen3-tiny's weights
# are held to the L2 norm of the difference (measured 1.9e-6 of the weights'): its
# per-step gradients agree as closely as the others' (within 6.6e-7 of each unit's
# largest, test_context_parallel), but AdamW's m / sqrt(v) turns that into up to 5e-5 of
# the model's largest weight after 4 steps (layer 2's q_proj, whose gradient elements
# next to zero are many behind q_norm); Ulysses at P = 3 on 48-token rows, where both
# kinds run, is 2.4e-6 there and the ring 7.4e-6.
# gpt2-tiny (learned positions: each rank's wpe rows are its zigzag chunks' global ones)
# is held to the L2 norm too (measured 8.6e-7): the k third of c_attn's bias has a
# gradient of zero in exact arithmetic (q.b_k adds the same to every score of a query),
# so its values are rounding noise that AdamW turns into lr-sized steps (1.7e-5 of the
# model's largest weight after 4 steps, h.2's c_attn.bias).
# llama-tiny zero3 n=4 P=4 is held to the L2 norm as well (measured 7.1e-7): the model
# bound has no margin there for rounding alone. Two correct ring block kernels, the
# per-row one and the tiled one (attention_tiles.hpp), are 7.2e-6 and 1.04e-5 of the
# model's largest weight from one rank after 4 steps, and 7.8e-6 from each other (all in
# layer 0's up_proj / gate_proj, per tensor ~1e-4), while their per-step losses agree to
# 2.5e-7 and every gradient to 6.9e-7 of its unit's largest (test_context_parallel).
for run in "llama-tiny 2 ddp 2 4" "llama-tiny 4 zero3 4 4" "llama-tiny 4 zero3 2 2" "qwen3-tiny 2 zero3 2 4" \
           "gpt2-tiny 2 zero3 2 4"; do
  read -r model n strategy P micro <<< "$run"
  relative_to=model
  [ "$model" = qwen3-tiny ] || [ "$model" = gpt2-tiny ] || [ "$P" = 4 ] && relative_to=norm
  ref="$WORK/${model}_ref"
  [ -d "$ref" ] || "$SHARDLM" train --model "$model" "${BASE[@]}" --micro-batch 4 --out "$ref" > "$ref.log" 2>&1 \
    || { cat "$ref.log"; fail "$model reference"; }
  out="$WORK/${model}_ring_${strategy}_n${n}_p${P}"
  run_mpi "$n" "$SHARDLM" train --model "$model" "${BASE[@]}" --micro-batch "$micro" --strategy "$strategy" \
    --context-parallel "$P" --context-parallel-kind ring --out "$out" > "$out.log" 2>&1 \
    || { cat "$out.log"; fail "$model ring $strategy n=$n P=$P"; }
  close "$out" "$ref" "$model ring $strategy n=$n --context-parallel $P vs one rank" "$relative_to"
done

# Hybrid (USP): Ulysses inside groups of 2 consecutive context ranks, ring across the 2
# groups (the zigzag over the groups), under zero3 on 4 ranks.
out="$WORK/llama-tiny_hybrid_zero3_n4_p4"
run_mpi 4 "$SHARDLM" train --model llama-tiny "${BASE[@]}" --micro-batch 4 --strategy zero3 \
  --context-parallel 4 --context-parallel-kind hybrid --ulysses-degree 2 --out "$out" > "$out.log" 2>&1 \
  || { cat "$out.log"; fail "llama-tiny hybrid zero3 n=4 P=4 U=2"; }
close "$out" "$WORK/llama-tiny_ref" "llama-tiny hybrid zero3 n=4 --context-parallel 4 --ulysses-degree 2 vs one rank"

# A mixture of experts (qwen3-moe-tiny, ring, zero3): the load-balancing loss's sums are
# added over the context group, so the step's loss (cross-entropy + coefficient x aux,
# counted once per group) and the router's gradient are the whole rows'.
"$SHARDLM" train --model qwen3-moe-tiny "${BASE[@]}" --micro-batch 4 --out "$WORK/moe_ref" > "$WORK/moe_ref.log" 2>&1 \
  || { cat "$WORK/moe_ref.log"; fail "qwen3-moe-tiny reference"; }
run_mpi 2 "$SHARDLM" train --model qwen3-moe-tiny "${BASE[@]}" --micro-batch 4 --strategy zero3 \
  --context-parallel 2 --context-parallel-kind ring --out "$WORK/moe_cp" > "$WORK/moe_cp.log" 2>&1 \
  || { cat "$WORK/moe_cp.log"; fail "qwen3-moe-tiny ring P=2"; }
close "$WORK/moe_cp" "$WORK/moe_ref" "qwen3-moe-tiny ring zero3 n=2 --context-parallel 2 vs one rank"
# LoRA of the routed experts (each expert's fused gate_up and down adapters, units of their
# own) and q_proj, Ulysses zero3 P = 2: the adapters' gradients reduced over shard x context.
EXPERT_LORA=(--lora-rank 4 --lora-targets q_proj,experts.gate_up_proj,experts.down_proj)
"$SHARDLM" train --model qwen3-moe-tiny "${BASE[@]}" "${EXPERT_LORA[@]}" --micro-batch 4 --out "$WORK/moe_lora_ref" \
  > "$WORK/moe_lora_ref.log" 2>&1 || { cat "$WORK/moe_lora_ref.log"; fail "qwen3-moe-tiny expert LoRA reference"; }
run_mpi 2 "$SHARDLM" train --model qwen3-moe-tiny "${BASE[@]}" "${EXPERT_LORA[@]}" --micro-batch 4 --strategy zero3 \
  --context-parallel 2 --out "$WORK/moe_lora_cp" > "$WORK/moe_lora_cp.log" 2>&1 \
  || { cat "$WORK/moe_lora_cp.log"; fail "qwen3-moe-tiny expert LoRA P=2"; }
close "$WORK/moe_lora_cp" "$WORK/moe_lora_ref" "qwen3-moe-tiny expert LoRA zero3 n=2 --context-parallel 2 vs one rank"

# LoRA: only the adapters train, their gradients reduced over shard x context.
LORA=(--lora-rank 4 --lora-targets q_proj,v_proj,down_proj)
"$SHARDLM" train --model qwen2-tiny "${BASE[@]}" "${LORA[@]}" --micro-batch 4 --out "$WORK/lora_ref" \
  > "$WORK/lora_ref.log" 2>&1 || { cat "$WORK/lora_ref.log"; fail "LoRA reference"; }
run_mpi 2 "$SHARDLM" train --model qwen2-tiny "${BASE[@]}" "${LORA[@]}" --micro-batch 4 --strategy zero3 \
  --context-parallel 2 --out "$WORK/lora_cp" > "$WORK/lora_cp.log" 2>&1 || { cat "$WORK/lora_cp.log"; fail "LoRA P=2"; }
close "$WORK/lora_cp" "$WORK/lora_ref" "qwen2-tiny LoRA zero3 --context-parallel 2 vs one rank"
run_mpi 2 "$SHARDLM" train --model qwen2-tiny "${BASE[@]}" "${LORA[@]}" --micro-batch 4 --strategy ddp \
  --context-parallel 2 --context-parallel-kind ring --out "$WORK/lora_ring" > "$WORK/lora_ring.log" 2>&1 \
  || { cat "$WORK/lora_ring.log"; fail "LoRA ring P=2"; }
close "$WORK/lora_ring" "$WORK/lora_ref" "qwen2-tiny LoRA ddp --context-parallel 2 ring vs one rank"
run_mpi 4 "$SHARDLM" train --model qwen2-tiny "${BASE[@]}" "${LORA[@]}" --micro-batch 4 --strategy zero3 \
  --context-parallel 4 --context-parallel-kind hybrid --ulysses-degree 2 --out "$WORK/lora_hybrid" \
  > "$WORK/lora_hybrid.log" 2>&1 || { cat "$WORK/lora_hybrid.log"; fail "LoRA hybrid P=4 U=2"; }
close "$WORK/lora_hybrid" "$WORK/lora_ref" "qwen2-tiny LoRA zero3 --context-parallel 4 hybrid U=2 vs one rank"
# QLoRA: the frozen base stored NF4 (dequantized before its GEMMs on every context rank),
# the same adapters; ring P=2 against one QLoRA rank (measured: losses 5.4e-9 relative,
# weights 6.2e-7 of the model's largest).
QLORA=("${LORA[@]}" --quantize-base nf4)
"$SHARDLM" train --model qwen2-tiny "${BASE[@]}" "${QLORA[@]}" --micro-batch 4 --out "$WORK/qlora_ref" \
  > "$WORK/qlora_ref.log" 2>&1 || { cat "$WORK/qlora_ref.log"; fail "QLoRA reference"; }
run_mpi 2 "$SHARDLM" train --model qwen2-tiny "${BASE[@]}" "${QLORA[@]}" --micro-batch 4 --strategy zero3 \
  --context-parallel 2 --context-parallel-kind ring --out "$WORK/qlora_ring" > "$WORK/qlora_ring.log" 2>&1 \
  || { cat "$WORK/qlora_ring.log"; fail "QLoRA ring P=2"; }
close "$WORK/qlora_ring" "$WORK/qlora_ref" "qwen2-tiny QLoRA zero3 --context-parallel 2 ring vs one rank"

# bf16 and fp16 once each: ring zero3 P=2 against one rank of the same precision, within
# the 1e-2 relative that bf16 has against fp32 elsewhere in the project (test_moe_fixture's
# losses, tensor_parallel.sh): the GEMM inputs are rounded, and each rank's partial sums
# round where one GEMM did not (measured: bf16 1.9e-5, fp16 3.1e-4, its grad norm).
for precision in bf16 fp16; do
  "$SHARDLM" train --model llama-tiny "${BASE[@]}" --micro-batch 4 --precision "$precision" \
    --out "$WORK/${precision}_ref" > "$WORK/${precision}_ref.log" 2>&1 \
    || { cat "$WORK/${precision}_ref.log"; fail "$precision reference"; }
  run_mpi 2 "$SHARDLM" train --model llama-tiny "${BASE[@]}" --micro-batch 4 --precision "$precision" \
    --strategy zero3 --context-parallel 2 --context-parallel-kind ring --out "$WORK/${precision}_ring" \
    > "$WORK/${precision}_ring.log" 2>&1 || { cat "$WORK/${precision}_ring.log"; fail "$precision ring P=2"; }
  same_curves "$WORK/${precision}_ring" "$WORK/${precision}_ref" 1e-2 \
    "llama-tiny $precision ring zero3 --context-parallel 2 vs one $precision rank"
done

# --mesh context=2 is the same run as --context-parallel 2.
run_mpi 2 "$SHARDLM" train --model llama-tiny "${BASE[@]}" --micro-batch 4 --strategy zero3 \
  --mesh shard=1,context=2 --out "$WORK/mesh" > "$WORK/mesh.log" 2>&1 || { cat "$WORK/mesh.log"; fail "--mesh context=2"; }
[ "$(digest_of "$WORK/mesh")" = "$(digest_of "$WORK/llama-tiny_zero3_n2_p2")" ] \
  || fail "--mesh shard=1,context=2 and --context-parallel 2 differ"
echo "--mesh shard=1,context=2 = --context-parallel 2 (bitwise)"

# Resume and reshard: a context-parallel run (ddp, 6 steps, a checkpoint at step 4) is cut
# back to its step-4 checkpoint, which loads bitwise under other layouts (other P, kind and
# world size), and training continues to what an uninterrupted one-rank 6-step run gives
# (close(): every step's loss and grad norm, the final weights); the checkpoint format
# knows no context.
"$SHARDLM" train --model llama-tiny "${BASE[@]}" --micro-batch 4 --steps 6 --out "$WORK/ref6" > "$WORK/ref6.log" 2>&1 \
  || { cat "$WORK/ref6.log"; fail "6-step reference"; }
# resumes_as_uninterrupted RUN WHAT LAYOUT...: each LAYOUT "N MICRO FLAGS..." (ranks, micro-batch,
# the context flags) resumes RUN's step-4 checkpoint in a copy of RUN and trains to step 6.
resumes_as_uninterrupted() {
  local run="$1" what="$2"; shift 2
  local want n micro flags dir
  want="$("$SHARDLM" inspect "$run/checkpoints/step_00000004" --quiet)"
  for layout in "$@"; do
    read -r n micro flags <<< "$layout"
    dir="${run}_resumed_n${n}_$(echo "$flags" | tr -dc 'a-z0-9')"
    cp -r "$run" "$dir"
    rm -rf "$dir/checkpoints/step_00000006"
    # shellcheck disable=SC2086
    SHARDLM_FAULT="save_after_load=$dir.loaded" run_mpi "$n" "$SHARDLM" train --model llama-tiny \
      "${BASE[@]}" --micro-batch "$micro" $flags --steps 6 --resume --out "$dir" > "$dir.log" 2>&1 \
      || { cat "$dir.log"; fail "$what resumed on $n ranks with $flags"; }
    [ "$("$SHARDLM" inspect "$dir.loaded" --quiet)" = "$want" ] \
      || fail "the $what checkpoint loaded on $n ranks with $flags is not the saved state"
    close "$dir" "$WORK/ref6" "$what checkpoint at step 4 resumed on $n ranks with $flags to step 6 vs one uninterrupted rank"
  done
}
run_mpi 2 "$SHARDLM" train --model llama-tiny "${BASE[@]}" --micro-batch 4 --strategy ddp --context-parallel 2 \
  --context-parallel-kind ring --steps 6 --save-every 4 --out "$WORK/ring6" > "$WORK/ring6.log" 2>&1 \
  || { cat "$WORK/ring6.log"; fail "ring P=2 6 steps"; }
resumes_as_uninterrupted "$WORK/ring6" "ring P=2" "1 4 --context-parallel 1" \
  "4 4 --context-parallel 4 --context-parallel-kind ring"
echo "the ring --context-parallel 2 checkpoint loads bitwise with P=1 and P=4 and continues as an uninterrupted run"
# Hybrid P = 4 (Ulysses groups of 2, a ring of 2) on 4 ranks, resumed at P = 2 (Ulysses,
# one rank per context rank) and at P = 2 on 4 ranks (ring, 2 data-parallel ranks).
run_mpi 4 "$SHARDLM" train --model llama-tiny "${BASE[@]}" --micro-batch 4 --strategy ddp --context-parallel 4 \
  --context-parallel-kind hybrid --ulysses-degree 2 --steps 6 --save-every 4 --out "$WORK/hybrid6" \
  > "$WORK/hybrid6.log" 2>&1 || { cat "$WORK/hybrid6.log"; fail "hybrid P=4 U=2 6 steps"; }
resumes_as_uninterrupted "$WORK/hybrid6" "hybrid P=4 U=2" "2 4 --context-parallel 2" \
  "4 2 --strategy zero3 --context-parallel 2 --context-parallel-kind ring"
echo "the hybrid --context-parallel 4 --ulysses-degree 2 checkpoint loads bitwise at P=2 (2 and 4 ranks) and continues as an uninterrupted run"

# Packed SFT rows (several conversations per row, positions and key_begin per document).
head -n 24 "$SHARED_DATA/sft/gsm8k_train.jsonl" > "$WORK/gsm.jsonl"
PACKED_SFT=(--tokenizer "gpt2:$SHARED_DATA/gpt2" --dataset "$WORK/gsm.jsonl" --max-len 256 --packing --threads 1
            --lr 3e-3 --warmup 1 --eval-batches 0 --micro-batch 2 --global-batch 2 --steps 3)
SFT=(--model qwen2-tiny "${PACKED_SFT[@]}")
"$SHARDLM" sft "${SFT[@]}" --out "$WORK/sft_ref" > "$WORK/sft_ref.log" 2>&1 || { cat "$WORK/sft_ref.log"; fail "sft reference"; }
run_mpi 2 "$SHARDLM" sft "${SFT[@]}" --strategy zero3 --context-parallel 2 --out "$WORK/sft_cp" \
  > "$WORK/sft_cp.log" 2>&1 || { cat "$WORK/sft_cp.log"; fail "sft --context-parallel 2"; }
# qwen2's k_proj bias has a gradient of zero in exact arithmetic (it adds q.b_k to every
# score of a query, which the softmax ignores), so its values are rounding noise that
# AdamW turns into lr-sized steps: ~3e-5 of the model's largest weight after 3 steps.
# The weights are held to the L2 norm of the difference relative to the weights'.
close "$WORK/sft_cp" "$WORK/sft_ref" "qwen2-tiny sft packed zero3 --context-parallel 2 vs one rank" norm
run_mpi 2 "$SHARDLM" sft "${SFT[@]}" --strategy zero3 --context-parallel 2 --context-parallel-kind ring \
  --out "$WORK/sft_ring" > "$WORK/sft_ring.log" 2>&1 || { cat "$WORK/sft_ring.log"; fail "sft ring P=2"; }
close "$WORK/sft_ring" "$WORK/sft_ref" "qwen2-tiny sft packed zero3 --context-parallel 2 ring vs one rank" norm
# gpt2-tiny's packed rows: each document's wpe rows are its own positions, global in the
# row, under Ulysses (P = 2) and hybrid (P = 4, U = 2: the zigzag over the groups). Held to
# the L2 norm like gpt2's ring run above (the k third of c_attn's bias).
"$SHARDLM" sft --model gpt2-tiny "${PACKED_SFT[@]}" --out "$WORK/gpt2_sft_ref" > "$WORK/gpt2_sft_ref.log" 2>&1 \
  || { cat "$WORK/gpt2_sft_ref.log"; fail "gpt2 sft reference"; }
for run in "2 2" "4 4 --context-parallel-kind hybrid --ulysses-degree 2"; do
  read -r n P flags <<< "$run"
  out="$WORK/gpt2_sft_n${n}_p$P"
  # shellcheck disable=SC2086
  run_mpi "$n" "$SHARDLM" sft --model gpt2-tiny "${PACKED_SFT[@]}" --strategy zero3 --context-parallel "$P" $flags \
    --out "$out" > "$out.log" 2>&1 || { cat "$out.log"; fail "gpt2 sft --context-parallel $P $flags"; }
  close "$out" "$WORK/gpt2_sft_ref" "gpt2-tiny sft packed zero3 --context-parallel $P $flags vs one rank" norm
done

# Bad input: one line, nothing written.
refused() {
  local needle="$1" n="$2"; shift 2
  local out="$WORK/refused"
  rm -rf "$out"
  local rc=0
  run_mpi "$n" "$SHARDLM" train "${BASE[@]}" --out "$out" "$@" > "$WORK/refused.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || { cat "$WORK/refused.log"; fail "accepted: $*"; }
  grep -q "^\(rank [0-9]*: \)\?error: .*$needle" "$WORK/refused.log" || { cat "$WORK/refused.log"; fail "expected '$needle' for: $*"; }
  [ ! -e "$out" ] || fail "a refused run left $out behind: $*"
}
refused "--context-parallel 4 must divide the world size 2" 2 --model llama-tiny --micro-batch 4 --context-parallel 4
refused "the model's 3 query heads do not divide by 2" 2 --model qwen3-tiny --micro-batch 4 --context-parallel 2
refused "--seq-len 30 does not split over --context-parallel 4" 1 --model llama-tiny --micro-batch 4 --context-parallel 4 --seq-len 30
refused "--context-parallel 2 and --mesh shard=2 (context=1) disagree" 2 --model llama-tiny --micro-batch 4 --context-parallel 2 --mesh shard=2
refused "--expert-parallel 2 with --context-parallel 4: the experts spread over the 1 data-parallel ranks (the job's 4 / 4), which 2 does not divide, or over them and the context ranks, which needs a multiple of 4" 4 --model qwen3-moe-tiny --micro-batch 4 --context-parallel 4 --expert-parallel 2
refused "--context-parallel-kind must be ulysses" 2 --model llama-tiny --micro-batch 4 --context-parallel 2 --context-parallel-kind zigzag
refused "--seq-len 36 does not split over --context-parallel 4: ring attention's zigzag split needs a multiple of 8" 1 --model llama-tiny --micro-batch 4 --context-parallel 4 --context-parallel-kind ring --seq-len 36
refused "--context-parallel 4 --context-parallel-kind hybrid needs --ulysses-degree U with 1 < U < 4 dividing 4" 4 --model llama-tiny --micro-batch 4 --context-parallel 4 --context-parallel-kind hybrid --ulysses-degree 3
refused "--ulysses-degree 2 needs --context-parallel-kind hybrid (got ring)" 2 --model llama-tiny --micro-batch 4 --context-parallel 2 --context-parallel-kind ring --ulysses-degree 2
refused "--ulysses-degree 2 (hybrid) splits the attention heads over each Ulysses group: the model's 3 query heads do not divide by 2" 4 --model qwen3-tiny --micro-batch 4 --context-parallel 4 --context-parallel-kind hybrid --ulysses-degree 2
echo "bad --context-parallel input refused in one line before a run directory exists"
echo "1 passed, 0 failed"
