#!/usr/bin/env bash
# A checkpoint saved under any (strategy, world size) loads under any other: the
# loaded weights and AdamW moments are bitwise the saved ones, and training goes on.
# Sources and targets: (zero3, N=4), (hybrid on the mesh replicate=2 x shard=2, N=4),
# (zero2, N=3), (ddp, N=2), (single process); the manifest records the writer's mesh.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
make_byte_data
LAYOUTS=("zero3 4" "hybrid 4 --mesh replicate=2,shard=2" "zero2 3" "ddp 2" "ddp 1")
COMMON=("${TINY[@]}" --global-batch 12 --data "$WORK/data" --eval-batches 0)
train_as() {  # train_as "strategy n [flags]" args...
  local strategy n flags; read -r strategy n flags <<< "$1"; shift
  # shellcheck disable=SC2086
  if [ "$n" -eq 1 ]; then
    "$SHARDLM" train "${COMMON[@]}" --micro-batch 4 --strategy "$strategy" $flags "$@"
  else
    run_mpi "$n" "$SHARDLM" train "${COMMON[@]}" --micro-batch $((12 / n)) --strategy "$strategy" $flags "$@"
  fi
}
name_of() { local n="${1// --mesh /_}"; n="${n//,/_}"; n="${n//=/}"; echo "${n// /x}"; }
for src in "${LAYOUTS[@]}"; do
  s="$(name_of "$src")"
  train_as "$src" --steps 4 --out "$WORK/src_$s" > "$WORK/log_src_$s" 2>&1 \
    || { cat "$WORK/log_src_$s"; fail "source $src"; }
  want="$("$SHARDLM" inspect "$WORK/src_$s" --quiet)"
  read -r _ n _ <<< "$src"
  case "$src" in
    hybrid*) mesh="replicate=2,shard=2" ;;
    *) mesh="replicate=1,shard=$n" ;;
  esac
  written="$("$SHARDLM" inspect "$WORK/src_$s" | grep '^written by')"
  [ "$written" = "written by: strategy ${src%% *} at world size $n (mesh $mesh)" ] \
    || fail "$src: inspect shows '$written'"
  for dst in "${LAYOUTS[@]}"; do
    [ "$dst" != "$src" ] || continue
    d="$(name_of "$dst")"
    cp -r "$WORK/src_$s" "$WORK/run_${s}_to_$d"
    SHARDLM_FAULT="save_after_load=$WORK/loaded_${s}_to_$d" train_as "$dst" --steps 9 --resume \
      --out "$WORK/run_${s}_to_$d" > "$WORK/log_${s}_to_$d" 2>&1 \
      || { cat "$WORK/log_${s}_to_$d"; fail "$src -> $dst"; }
    got="$("$SHARDLM" inspect "$WORK/loaded_${s}_to_$d" --quiet)"
    [ "$got" = "$want" ] || fail "$src -> $dst: loaded state differs ($got vs $want)"
    [ -d "$WORK/run_${s}_to_$d/checkpoints/step_00000009" ] || fail "$src -> $dst: no further steps"
  done
  echo "from $src: loaded bitwise under every other layout, 5 further steps ran"
done
echo "1 passed, 0 failed"
