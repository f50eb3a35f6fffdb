#!/usr/bin/env bash
# `plan` beside its recommendation (cli/plan_advice.hpp): when nothing fits, the seed
# documents' decision tree's moves (LoRA and QLoRA for fine-tuning, --offload optimizer on
# a device), each line being what `plan` itself recommends for the run with those flags;
# and when a second node over a slow link makes the job slower than the first node
# alone, a warning line naming both step times, each the one `plan` predicts for that
# job by itself. Built-in profiles only: no calibration, no wall-clock.
source "$(dirname "$0")/lib/common.sh" "$@"
QWEN=(--model qwen3-8b --precision bf16 --micro-batch 1 --seq-len 4096)

# `plan`'s recommendation as one line "FLAGS: WHY" (or "nothing fits ..." alone).
recommended() {
  "$SHARDLM" plan "$@" > "$WORK/direct.txt" || fail "plan $*"
  python3 - "$WORK/direct.txt" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
i = next(i for i, l in enumerate(lines) if l.startswith("recommended"))
flags = lines[i].split(": ", 1)[1]
if i + 1 < len(lines) and lines[i + 1].startswith("  why: "):
    print(flags + ": " + lines[i + 1][len("  why: "):])
else:
    print(flags)
PY
}

# 8 x L4 (24 GiB): qwen3-8b fits in no strategy; every move is planned.
L4=("${QWEN[@]}" -n 8 --profile l4-24g)
"$SHARDLM" plan "${L4[@]}" > "$WORK/l4.txt" || fail "plan on L4"
grep -q "^recommended for 24.0 GiB per rank: nothing fits" "$WORK/l4.txt" || fail "expected nothing to fit: $(cat "$WORK/l4.txt")"
grep -q "^what the seed documents' decision tree would try, each planned with its flags:$" "$WORK/l4.txt" \
  || fail "no decision-tree lines: $(tail -5 "$WORK/l4.txt")"
while IFS='|' read -r move flags; do
  line="$(grep "^  $move, $flags" "$WORK/l4.txt")" || fail "no line for $move: $(tail -5 "$WORK/l4.txt")"
  # shellcheck disable=SC2086
  want="$(recommended "${L4[@]}" $flags)"
  [ "  $move, $flags $want" = "$line" ] || [ "  $move, $flags: $want" = "$line" ] \
    || fail "$move: the advice says '$line', plan $flags says '$want'"
  echo "$line" | grep -q "fits with" || fail "$move was expected to fit on 8 x L4: $line"
done <<'MOVES'
LoRA (fine-tuning)|--lora-rank 8
QLoRA (fine-tuning)|--lora-rank 8 --quantize-base nf4
optimizer in host memory|--offload optimizer
MOVES

# A budget nothing meets: each move says so (as plan with its flags does), none fits.
TINY_BUDGET=("${L4[@]}" --memory-per-rank 1)
"$SHARDLM" plan "${TINY_BUDGET[@]}" > "$WORK/hopeless.txt" || fail "plan with 1 GiB"
for flags in "--lora-rank 8" "--lora-rank 8 --quantize-base nf4" "--offload optimizer"; do
  line="$(grep -- ", $flags: " "$WORK/hopeless.txt")" || fail "no line for $flags: $(tail -5 "$WORK/hopeless.txt")"
  # shellcheck disable=SC2086
  want="$(recommended "${TINY_BUDGET[@]}" $flags)"
  [ "${line#*"$flags: "}" = "$want" ] || fail "$flags: '$line' against plan's '$want'"
  echo "$line" | grep -q ": nothing fits in 1.0 GiB per rank" || fail "$flags fits in 1 GiB? $line"
done
# Only the moves that apply: a LoRA run is offered QLoRA as --quantize-base alone; a CPU
# run is not offered --offload; a run that fits gets no such lines.
"$SHARDLM" plan "${TINY_BUDGET[@]}" --lora-rank 16 > "$WORK/lora.txt"
! grep -q "^  LoRA" "$WORK/lora.txt" || fail "a LoRA run offered LoRA"
grep -q "^  QLoRA (fine-tuning), --quantize-base nf4: " "$WORK/lora.txt" || fail "no QLoRA line for a LoRA run"
"$SHARDLM" plan --model qwen2.5-0.5b -n 2 --device cpu --memory-per-rank 0.5 > "$WORK/cpu.txt"
grep -q "nothing fits" "$WORK/cpu.txt" || fail "expected nothing to fit in 0.5 GiB"
! grep -q "offload" "$WORK/cpu.txt" || fail "a CPU run offered --offload"
"$SHARDLM" plan "${QWEN[@]}" -n 8 --profile h100-80g > "$WORK/fits.txt"
! grep -q "decision tree" "$WORK/fits.txt" || fail "advice for a run that fits"

# 2 nodes x 8 H100 over 1 Gbit/s: slower than the first node alone, both times named.
"$SHARDLM" plan "${QWEN[@]}" -n 16 --nodes 2 --link 1gbit --profile h100-80g > "$WORK/slow.txt"
warning="$(grep "^warning: the second node slows this job down: " "$WORK/slow.txt")" \
  || fail "no slow-link warning: $(tail -3 "$WORK/slow.txt")"
two="$(grep "^  why: " "$WORK/slow.txt" | sed -n 's/.*predicted \([0-9.]* m*s\) per step.*/\1/p')"
one="$(recommended "${QWEN[@]}" -n 8 --global-batch 16 --profile h100-80g | sed -n 's/.*predicted \([0-9.]* m*s\) per step.*/\1/p')"
one_flags="$(recommended "${QWEN[@]}" -n 8 --global-batch 16 --profile h100-80g | sed 's/: .*//')"
[ -n "$two" ] && [ -n "$one" ] || fail "no step times ('$two', '$one')"
expected="2 nodes x 8 ranks (hybrid 8) are predicted at $two per step, the first node alone (8 ranks, the same 16 sequences per step, $one_flags) at $one per step"
echo "$warning" | grep -qF "$expected" || fail "warning '$warning' does not say '$expected'"
echo "$warning" | grep -qF "run on one node (-n 8 --nodes 1 --global-batch 16) or over a faster link (--link)" \
  || fail "the warning does not say what to do: $warning"
[ "$(grep -c "^warning:" "$WORK/slow.txt")" -eq 1 ] || fail "the warning is not one line"
# Over NVLink-class links the second node helps: no warning; nor on one node.
"$SHARDLM" plan "${QWEN[@]}" -n 16 --nodes 2 --link nvlink --profile h100-80g > "$WORK/fast.txt"
! grep -q "second node" "$WORK/fast.txt" || fail "a warning where the second node helps: $(grep warning "$WORK/fast.txt")"
! grep -q "second node" "$WORK/fits.txt" || fail "a second-node warning on one node"
# The JSON recommendation carries both.
"$SHARDLM" plan "${QWEN[@]}" -n 16 --nodes 2 --link 1gbit --profile h100-80g --strategy auto --json > "$WORK/slow.json"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["second_node"].startswith("the second node slows"), j' "$WORK/slow.json" \
  || fail "no second_node in the JSON"
# --strategy auto fits qwen3-8b on 8 x L4 by splitting its layers (no alternatives then);
# in 1 GiB nothing fits, and the JSON carries the moves, none fitting.
"$SHARDLM" plan "${L4[@]}" --strategy auto --json > "$WORK/l4.json"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert "--tensor-parallel" in j["flags"] and "alternatives" not in j, j' "$WORK/l4.json" \
  || fail "auto on 8 x L4 did not split the layers: $(cat "$WORK/l4.json")"
"$SHARDLM" plan "${TINY_BUDGET[@]}" --strategy auto --json > "$WORK/hopeless.json"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); a=j["alternatives"]; assert [x["flags"] for x in a]==["--lora-rank 8","--lora-rank 8 --quantize-base nf4","--offload optimizer"] and not any(x["fits"] for x in a), a' "$WORK/hopeless.json" \
  || fail "no alternatives in the JSON: $(cat "$WORK/hopeless.json")"
echo "1 passed, 0 failed"
