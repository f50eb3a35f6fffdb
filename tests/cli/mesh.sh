#!/usr/bin/env bash
# --mesh: the layout of the ranks, of which --strategy hybrid --shard-group-size G is
# the shorthand. The same run spelled either way gives the same weights; the start
# line, config.json and inspect show the mesh; plan takes it too; a mesh that
# contradicts the strategy or the world size, an unknown spelling and a dimension not
# there yet are one-line errors that leave nothing behind; bench takes --mesh only
# inside a variant.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
COMMON=("${TINY[@]}" --micro-batch 3 --global-batch 12 --steps 4 --data "$WORK/data" --eval-batches 0)
run_mpi 4 "$SHARDLM" train "${COMMON[@]}" --strategy hybrid --shard-group-size 2 --out "$WORK/flags" \
  > "$WORK/flags.log" 2>&1 || { cat "$WORK/flags.log"; fail "hybrid by --shard-group-size"; }
run_mpi 4 "$SHARDLM" train "${COMMON[@]}" --strategy hybrid --mesh replicate=2,shard=2 --out "$WORK/mesh" \
  > "$WORK/mesh.log" 2>&1 || { cat "$WORK/mesh.log"; fail "hybrid by --mesh"; }
[ "$(digest_of "$WORK/flags")" = "$(digest_of "$WORK/mesh")" ] || fail "--mesh and --shard-group-size differ"
for run in flags mesh; do
  grep -q "strategy hybrid (mesh replicate=2,shard=2) on 4 rank(s)" "$WORK/$run.log" \
    || { cat "$WORK/$run.log"; fail "$run: the start line does not show the mesh"; }
  python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); sys.exit(0 if c["mesh"] == {"replicate": 2, "shard": 2} and c["shard_group_size"] == 2 else 1)' \
    "$WORK/$run/config.json" || fail "$run: config.json's mesh"
  grep -qxF "written by: strategy hybrid at world size 4 (mesh replicate=2,shard=2)" <<< "$("$SHARDLM" inspect "$WORK/$run")" \
    || fail "$run: inspect does not show the mesh"
done
run_mpi 2 "$SHARDLM" train "${COMMON[@]}" --micro-batch 6 --strategy zero3 --mesh shard=2 --out "$WORK/zero3" \
  > "$WORK/zero3.log" 2>&1 || { cat "$WORK/zero3.log"; fail "zero3 --mesh shard=2"; }
grep -q "strategy zero3 (mesh replicate=1,shard=2) on 2 rank(s)" "$WORK/zero3.log" || fail "zero3's start line"
echo "hybrid: --mesh replicate=2,shard=2 = --shard-group-size 2 ($(digest_of "$WORK/mesh")); shown by the start line, config.json, inspect"

# plan: the same plan whichever way the mesh is spelled.
"$SHARDLM" plan --model gpt2-tiny -n 8 --strategy hybrid --shard-group-size 4 > "$WORK/plan_flags.txt"
"$SHARDLM" plan --model gpt2-tiny -n 8 --strategy hybrid --mesh replicate=2,shard=4 > "$WORK/plan_mesh.txt"
cmp -s "$WORK/plan_flags.txt" "$WORK/plan_mesh.txt" || { diff "$WORK/plan_flags.txt" "$WORK/plan_mesh.txt"; fail "plan differs by spelling"; }
# An expert group over the context ranks (E = 4 > the 2 data-parallel ranks of N = 4,
# P = 2) spelled by flags and by --mesh's expert_group: the same plan.
"$SHARDLM" plan --model qwen3-moe-tiny -n 4 --strategy zero3 --seq-len 32 --micro-batch 2 \
  --context-parallel 2 --expert-parallel 4 > "$WORK/plan_span_flags.txt" || fail "plan E=4 P=2 by flags"
"$SHARDLM" plan --model qwen3-moe-tiny -n 4 --strategy zero3 --seq-len 32 --micro-batch 2 \
  --mesh shard=1,expert=2,context=2,expert_group=expert+context > "$WORK/plan_span_mesh.txt" \
  || fail "plan by --mesh ...,expert_group=expert+context"
cmp -s "$WORK/plan_span_flags.txt" "$WORK/plan_span_mesh.txt" \
  || { diff "$WORK/plan_span_flags.txt" "$WORK/plan_span_mesh.txt"; fail "plan E=4 P=2 differs by spelling"; }
grep -qF "| zero3 x ep4 x cp2 (asked) |" "$WORK/plan_span_flags.txt" \
  || { cat "$WORK/plan_span_flags.txt"; fail "plan does not plan E=4 over the context ranks"; }

refused() {  # refused "<error>" flags...: train refuses them and writes nothing
  local needle="$1"; shift
  expect_error "$needle" "$SHARDLM" train "${COMMON[@]}" --out "$WORK/refused" "$@"
  [ ! -e "$WORK/refused" ] || fail "a refused --mesh ($*) left $WORK/refused"
}
refused "--mesh replicate=2,shard=2 replicates over 2 groups of 2 sharded ranks, which is --strategy hybrid (this run uses ddp, whose mesh is shard=N)" --mesh replicate=2,shard=2
refused "--mesh replicate=2,shard=2 has shard groups of 2 ranks, --shard-group-size says 4" --strategy hybrid --mesh replicate=2,shard=2 --shard-group-size 4
refused "--mesh shard=2,expert=2,context=2,expert_group=expert+context: an expert group of 4 fits the 4 data-parallel ranks (spell it expert=4 without expert_group; it spans the context ranks only beyond them)" \
  --mesh shard=2,expert=2,context=2,expert_group=expert+context
refused "--mesh 'context=2,expert_group=expert+context,tensor=2': 'tensor=2' comes after expert_group (it goes last)" \
  --mesh context=2,expert_group=expert+context,tensor=2
refused "--mesh fixes the layout that --strategy auto chooses: give one of them" --strategy auto --mesh shard=1
refused "--mesh shard=1,pipeline=2: pipeline parallelism is not there yet" --mesh shard=1,pipeline=2
refused "--mesh 'shard=2,replicate=1': 'replicate' comes out of order" --mesh shard=2,replicate=1
refused "--mesh 'rows=2': unknown dimension 'rows'" --mesh rows=2
refused "--mesh replicate=1,shard=2 lays out 2 rank(s) (2), the job has 1" --strategy zero3 --mesh shard=2
expect_error "--mesh replicate=2,shard=4 lays out 8 rank(s) (2 x 4), the job has 6" \
  "$SHARDLM" plan --model gpt2-tiny -n 6 --strategy hybrid --mesh replicate=2,shard=4
expect_error "bench: --mesh belongs in a --variant" \
  "$SHARDLM" bench --model gpt2-tiny --n-layer 2 --n-embd 32 --n-head 2 --seq-len 32 --data "$WORK/data" -n 2 --strategies ddp --mesh shard=2 --out "$WORK/bench"
[ ! -e "$WORK/bench" ] || fail "a refused bench left $WORK/bench"
echo "contradictions, world sizes, spellings and dimensions not there yet: one-line errors, nothing written"
echo "1 passed, 0 failed"
