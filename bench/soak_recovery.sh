#!/usr/bin/env bash
# Randomized recovery soak (not part of the test suite: minutes, and timing-dependent).
#  1. K trials: `shardlm launch -n 2 --max-restarts 3` of a ZeRO-3 job; a random rank is
#     SIGKILLed at a random moment (before the first checkpoint, inside a save, between
#     steps ...). Recovered: the job exits 0 and its final weights digest equals an
#     uninterrupted run's.
#  2. K trials: the newest checkpoint of a stopped run is damaged at random (a bit
#     flipped, bytes overwritten, a file truncated, extended or deleted, in any file of
#     it); the run resumes. Recovered: it passes over the damaged checkpoint with a
#     warning naming it, resumes from the one before, and ends with the uninterrupted
#     run's digest. A silent load is a resume from the damaged checkpoint.
# usage: bench/soak_recovery.sh [build/shardlm] [K] [seed]
set -uo pipefail
SHARDLM="$(realpath "${1:-build/shardlm}")"
K="${2:-20}"
RANDOM="${3:-1}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d /tmp/shardlm-soak.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
head -c 60000 "$ROOT/../shared/data/tinyshakespeare.txt" > "$WORK/small.txt"
"$SHARDLM" prepare --tokenizer byte --input "$WORK/small.txt" --out "$WORK/data" > /dev/null
# Constant learning rate after warmup, so a run's weights do not depend on --steps.
JOB=(train --model gpt2-tiny --n-layer 2 --n-embd 32 --n-head 2 --seq-len 32 --micro-batch 4
     --global-batch 8 --threads 1 --lr 3e-3 --min-lr 3e-3 --warmup 2 --grad-clip 0.5
     --strategy zero3 --save-every 3 --data "$WORK/data")
STEPS=24
digest_of() { "$SHARDLM" inspect "$1" 2> /dev/null | awk '/^digest:/ {print $2}'; }
random_between() { echo $(( $1 + RANDOM % ($2 - $1 + 1) )); }

start=$(date +%s.%N)
"$SHARDLM" launch -n 2 -- "${JOB[@]}" --steps "$STEPS" --out "$WORK/reference" > /dev/null 2>&1 \
  || { echo "reference run failed"; exit 1; }
duration_ms=$(python3 -c "import sys; print(int(1000 * (float(sys.argv[2]) - float(sys.argv[1]))))" "$start" "$(date +%s.%N)")
reference="$(digest_of "$WORK/reference")"
echo "uninterrupted run: digest $reference, $duration_ms ms"
echo "command: bench/soak_recovery.sh $SHARDLM $K ${3:-1}"

echo
echo "## 1. SIGKILL of a random rank at a random moment (launch -n 2 --max-restarts 3)"
echo "| trial | killed rank process | after ms | restarted from | exit | digest |"
echo "|---|---|---|---|---|---|"
kills=0; recovered=0; attempts=0
while [ "$kills" -lt "$K" ] && [ "$attempts" -lt $((3 * K)) ]; do
  attempts=$((attempts + 1))
  out="$WORK/kill_$attempts"
  "$SHARDLM" launch -n 2 --max-restarts 3 -- "${JOB[@]}" --steps "$STEPS" --out "$out" > "$out.log" 2>&1 &
  launcher=$!
  delay=$(random_between 300 $((duration_ms - 200)))
  sleep "$(python3 -c "print($delay / 1000)")"
  mpirun_pid="$(pgrep -P "$launcher" mpirun || true)"
  ranks=($( [ -n "$mpirun_pid" ] && pgrep -P "$mpirun_pid" || true))
  if [ "${#ranks[@]}" -lt 2 ]; then wait "$launcher"; continue; fi  # not running yet / already done
  victim=$(random_between 0 1)
  kill -KILL "${ranks[$victim]}" 2> /dev/null || { wait "$launcher"; continue; }
  kills=$((kills + 1))
  rc=0; wait "$launcher" || rc=$?
  from="$(sed -n 's/.*restarting from \(.*\) (restart 1 of 3).*/\1/p' "$out.log" | head -1)"
  from="${from##*/}"
  got="$(digest_of "$out")"
  ok="differs"
  if [ "$rc" -eq 0 ] && [ "$got" = "$reference" ]; then ok="equal"; recovered=$((recovered + 1)); fi
  echo "| $kills | pid ${ranks[$victim]} | $delay | ${from:-not restarted} | $rc | $ok |"
done
kill_recovered=$recovered
echo "recovered: $kill_recovered/$kills"

echo
echo "## 2. Random damage of the newest checkpoint, then --resume"
"$SHARDLM" launch -n 2 -- "${JOB[@]}" --steps 21 --out "$WORK/base" > /dev/null 2>&1 || { echo "base run failed"; exit 1; }
newest=step_00000021
echo "| trial | damage | resumed from | warned | exit | digest |"
echo "|---|---|---|---|---|---|"
recovered=0; silent=0
for trial in $(seq 1 "$K"); do
  out="$WORK/damage_$trial"
  cp -r "$WORK/base" "$out"
  files=("$out/checkpoints/$newest"/*)
  file="${files[$(random_between 0 $((${#files[@]} - 1)))]}"
  kind=$(random_between 0 5)
  damage="$(python3 - "$file" "$kind" "$RANDOM$RANDOM" <<'PY'
import os, random, sys
path, kind, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
data = bytearray(open(path, "rb").read())
name = os.path.basename(path)
if kind == 0 and data:
    at = rng.randrange(len(data)); bit = rng.randrange(8); data[at] ^= 1 << bit
    what = f"bit {bit} of byte {at} flipped in {name}"
elif kind == 1 and data:
    at = rng.randrange(len(data)); n = rng.randint(1, 64)
    data[at:at + n] = bytes(rng.randrange(256) for _ in range(len(data[at:at + n])))
    what = f"{n} bytes at {at} overwritten in {name}"
elif kind == 2 and data:
    n = rng.randrange(len(data)); data = data[:n]
    what = f"{name} truncated to {n} bytes"
elif kind == 3:
    data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    what = f"garbage appended to {name}"
elif kind == 4:
    os.remove(path); print(f"{name} deleted"); sys.exit(0)
else:
    at = rng.randrange(max(1, len(data))); data[at:at] = b"0"
    what = f"a byte inserted at {at} in {name}"
open(path, "wb").write(data)
print(what)
PY
)"
  rc=0
  "$SHARDLM" launch -n 2 -- "${JOB[@]}" --steps "$STEPS" --out "$out" --resume > "$out.log" 2>&1 || rc=$?
  from="$(sed -n 's/.*resumed from \([^ ]*\) .*/\1/p' "$out.log" | head -1)"
  from="${from##*/}"
  warned=no
  grep -q "warning: .*$newest" "$out.log" && warned=yes
  [ "$from" = "$newest" ] && silent=$((silent + 1))
  got="$(digest_of "$out")"
  ok="differs"
  if [ "$rc" -eq 0 ] && [ "$got" = "$reference" ] && [ "$from" = step_00000018 ] && [ "$warned" = yes ]; then
    ok="equal"; recovered=$((recovered + 1))
  fi
  echo "| $trial | $damage | ${from:-none} | $warned | $rc | $ok |"
done
echo "recovered: $recovered/$K, silent loads of the damaged checkpoint: $silent"
echo
echo "summary: kills recovered $kill_recovered/$kills; damages recovered $recovered/$K; silent loads $silent"
