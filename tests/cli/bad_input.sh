#!/usr/bin/env bash
# Bad input gets one clear error line, a non-zero exit, and nothing overwritten.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
D="$WORK/data"
expect_error "does not exist\|cannot\|missing" "$SHARDLM" train "${TINY[@]}" --data "$WORK/nope" --out "$WORK/r" --steps 1
expect_error "unknown model preset 'gpt5'" "$SHARDLM" train --model gpt5 --data "$D" --out "$WORK/r" --steps 1
expect_error "seq-len 512 is longer than the model's context (256" "$SHARDLM" train --model gpt2-tiny --data "$D" --out "$WORK/r" --steps 1 --seq-len 512
expect_error "n_embd (30) must be divisible by n_head (4)" "$SHARDLM" train --model gpt2-tiny --n-embd 30 --data "$D" --out "$WORK/r" --steps 1
expect_error "steps must be >= 0" "$SHARDLM" train "${TINY[@]}" --data "$D" --out "$WORK/r" --steps -1
expect_error "micro-batch must be positive" "$SHARDLM" train --model gpt2-tiny --micro-batch -2 --data "$D" --out "$WORK/r" --steps 1
expect_error "n_layer must be positive" "$SHARDLM" train --model gpt2-tiny --n-layer 0 --data "$D" --out "$WORK/r" --steps 1
expect_error "global batch 6 is not divisible" "$SHARDLM" train "${TINY[@]}" --global-batch 6 --data "$D" --out "$WORK/r" --steps 1
expect_error "vocab-size 100 is smaller than the data's vocabulary (256" "$SHARDLM" train "${TINY[@]}" --vocab-size 100 --data "$D" --out "$WORK/r" --steps 1

# Prepare: missing input, empty input, unreadable tokenizer files.
expect_error "nope.txt" "$SHARDLM" prepare --tokenizer byte --input "$WORK/nope.txt" --out "$WORK/d2"
: > "$WORK/empty.txt"
expect_error "empty" "$SHARDLM" prepare --tokenizer byte --input "$WORK/empty.txt" --out "$WORK/d2"
expect_error "vocab.json" "$SHARDLM" prepare --tokenizer "gpt2:$WORK/no_tokenizer" --input "$WORK/small.txt" --out "$WORK/d2"

# Token id >= vocab: a token file whose header claims vocab 256 but holds 300.
python3 - "$D/train.bin" <<'PY'
import struct, sys
path = sys.argv[1]
data = bytearray(open(path, 'rb').read())
struct.pack_into('<H', data, 64 + 10, 300)  # one token past the vocabulary
open(path, 'wb').write(data)
PY
expect_error "300" "$SHARDLM" train "${TINY[@]}" --data "$D" --out "$WORK/r" --steps 1
make_byte_data

# Data too short for the sequence length.
head -c 20 "$SHARED_DATA/tinyshakespeare.txt" > "$WORK/short.txt"
"$SHARDLM" prepare --tokenizer byte --input "$WORK/short.txt" --out "$WORK/short" --val-fraction 0 > /dev/null
expect_error "fewer than" "$SHARDLM" train "${TINY[@]}" --data "$WORK/short" --out "$WORK/r" --steps 1

# An output dir holding another run's checkpoint: refused without --resume, and a
# --resume with another model is refused naming the field; the checkpoint survives.
"$SHARDLM" train "${TINY[@]}" --data "$D" --out "$WORK/run" --steps 2 > /dev/null
before="$(digest_of "$WORK/run")"
expect_error "already holds a run" "$SHARDLM" train "${TINY[@]}" --data "$D" --out "$WORK/run" --steps 2
expect_error "n_layer=2, but this run asks for 3" "$SHARDLM" train "${TINY[@]}" --n-layer 3 --data "$D" --out "$WORK/run" --steps 4 --resume
expect_error "lr=" "$SHARDLM" train "${TINY[@]}" --lr 1e-2 --data "$D" --out "$WORK/run" --steps 4 --resume
[ "$(digest_of "$WORK/run")" = "$before" ] || fail "checkpoint changed by a refused run"

# Unknown flag / subcommand: CLI11's parse error, non-zero.
if "$SHARDLM" train --no-such-flag > /dev/null 2>&1; then fail "unknown flag accepted"; fi
if "$SHARDLM" frobnicate > /dev/null 2>&1; then fail "unknown subcommand accepted"; fi
expect_error "does not exist" "$SHARDLM" inspect "$WORK/nothing"
# plan: the same checks as train, before anything is computed.
expect_error "unknown model preset 'gpt5'" "$SHARDLM" plan --model gpt5
expect_error "-n must be at least 1, got 0" "$SHARDLM" plan -n 0
expect_error "memory-per-rank must be a positive number of GiB" "$SHARDLM" plan --memory-per-rank -2
expect_error "reduce-dtype must be fp32 or bf16, got 'fp16'" "$SHARDLM" plan --reduce-dtype fp16
expect_error "precision" "$SHARDLM" plan --precision fp8
expect_error "global batch 8 is not divisible by world size" "$SHARDLM" plan -n 3 --micro-batch 2 --global-batch 8
expect_error "shard-group-size" "$SHARDLM" plan -n 4 --strategy hybrid --shard-group-size 3
expect_error "reduce-dtype must be fp32 or bf16, got 'fp8'" "$SHARDLM" train "${TINY[@]}" --data "$D" --out "$WORK/r" --steps 1 --reduce-dtype fp8
expect_error "does not exist" "$SHARDLM" sample --checkpoint "$WORK/nothing"
# More threads than this machine's cores: the run goes on, and says why it may be slow.
cores=$(nproc)
"$SHARDLM" train "${TINY[@]}" --data "$D" --out "$WORK/oversubscribed" --steps 1 \
  --threads $((cores + 1)) > "$WORK/oversubscribed.log" 2>&1 || fail "oversubscribed run failed"
grep -q "warning: 1 rank(s) on this host x $((cores + 1)) threads = $((cores + 1)) threads on $cores cores" \
  "$WORK/oversubscribed.log" || fail "no oversubscription warning: $(cat "$WORK/oversubscribed.log")"
"$SHARDLM" train "${TINY[@]}" --data "$D" --out "$WORK/fits" --steps 1 --threads "$cores" \
  > "$WORK/fits.log" 2>&1 || fail "run with --threads $cores failed"
if grep -q "warning: .* threads on" "$WORK/fits.log"; then fail "oversubscription warning without oversubscription"; fi
echo "1 passed, 0 failed"
