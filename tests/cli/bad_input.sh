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
expect_error "--micro-batch must be >= 1, got -2" "$SHARDLM" train --model gpt2-tiny --micro-batch -2 --data "$D" --out "$WORK/r" --steps 1
expect_error "--n-layer must be >= 1, got 0" "$SHARDLM" train --model gpt2-tiny --n-layer 0 --data "$D" --out "$WORK/r" --steps 1
expect_error "global batch 6 is not divisible" "$SHARDLM" train "${TINY[@]}" --global-batch 6 --data "$D" --out "$WORK/r" --steps 1
expect_error "vocab-size 100 is smaller than the data's vocabulary (256" "$SHARDLM" train "${TINY[@]}" --vocab-size 100 --data "$D" --out "$WORK/r" --steps 1
# A Hugging Face model's vocabulary is its own (never widened to the data's): smaller than
# the data's is refused by name.
mkdir -p "$WORK/hf_small_vocab"
cat > "$WORK/hf_small_vocab/config.json" <<'JSON'
{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true, "hidden_act": "silu"}
JSON
expect_error "has a vocabulary of 128, smaller than the data's (256" "$SHARDLM" train --model "$WORK/hf_small_vocab/config.json" --data "$D" --out "$WORK/r" --steps 1 --seq-len 16

# Prepare: missing input, empty input, unreadable tokenizer files.
expect_error "nope.txt" "$SHARDLM" prepare --tokenizer byte --input "$WORK/nope.txt" --out "$WORK/d2"
: > "$WORK/empty.txt"
expect_error "empty" "$SHARDLM" prepare --tokenizer byte --input "$WORK/empty.txt" --out "$WORK/d2"
# Binary input is tokenized, with a warning naming the first invalid byte's offset.
printf 'plain text \xff\xfe and \xc3 more\n' > "$WORK/binary.txt"
"$SHARDLM" prepare --tokenizer "gpt2:$SHARED_DATA/gpt2" --input "$WORK/binary.txt" --out "$WORK/binary" --val-fraction 0 \
  > /dev/null 2> "$WORK/binary.err" || { cat "$WORK/binary.err"; fail "prepare of non-UTF-8 input failed"; }
grep -q "warning: .*binary.txt is not valid UTF-8 text (first invalid byte at offset 11, 3 invalid in all)" "$WORK/binary.err" \
  || fail "no UTF-8 warning for binary input: $(cat "$WORK/binary.err")"
"$SHARDLM" prepare --tokenizer byte --input "$WORK/small.txt" --out "$WORK/text_ok" > /dev/null 2> "$WORK/text_ok.err"
! grep -q "UTF-8" "$WORK/text_ok.err" || fail "a UTF-8 warning for valid text"
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

# Every flag out of range or not finite is refused with its name and range, before the
# run directory exists (nothing is written).
bad_flag() {
  local needle="$1"; shift
  expect_error "$needle" "$SHARDLM" train "${TINY[@]}" --data "$D" --out "$WORK/never" --steps 1 "$@"
  [ ! -e "$WORK/never" ] || fail "a refused run left '$WORK/never' behind ($*)"
}
bad_flag "--lr must be a finite number > 0, got inf" --lr 1e39
bad_flag "--lr must be a finite number > 0, got 0" --lr 0
bad_flag "--min-lr must be a finite number in \[0, --lr\], got nan" --min-lr nan
bad_flag "--beta2 must be a finite number in \[0, 1), got nan" --beta2 nan
bad_flag "--beta1 must be a finite number in \[0, 1), got 1.5" --beta1 1.5
bad_flag "--weight-decay must be a finite number >= 0, got -1" --weight-decay -1
bad_flag "--grad-clip must be a finite number >= 0 (0: off), got -1" --grad-clip -1
bad_flag "--save-every must be >= 0, got -1" --save-every -1
bad_flag "--keep must be >= 0, got -1" --keep -1
bad_flag "--eval-every must be >= 0, got -3" --eval-every -3
bad_flag "--sample-tokens must be >= 0, got -1" --sample-tokens -1
bad_flag "--threads must be >= 1, got 0" --threads 0
bad_flag "--comm-timeout must be a finite number > 0 (seconds), got nan" --comm-timeout nan
bad_flag "--loss-scale must be a finite number > 0, got inf" --loss-scale inf
bad_flag "--bucket-mb must be a finite number > 0 (MiB), got 0" --bucket-mb 0
bad_flag "--context-len must be >= 1, got 0" --context-len 0
bad_flag "--shard-group-size applies to --strategy hybrid only (this run uses zero3)" --strategy zero3 --shard-group-size 2
bad_flag "--init-from and --resume exclude each other" --init-from "$WORK/hf" --resume
bad_flag "--resume (must resume) and --resume-if-exists (resume when there is a checkpoint) exclude each other" --resume --resume-if-exists
bad_flag "seq-len 64 is longer than the model's context (32 positions; --context-len sets it)" --context-len 32 --seq-len 64
# --resume means "must resume": a typo in --out is an error, and leaves nothing behind.
bad_flag "--resume: run directory '$WORK/never' holds no committed checkpoint to continue from" --resume
expect_error "--resume: run directory '$WORK/a/b/c' holds no committed checkpoint" \
  "$SHARDLM" train "${TINY[@]}" --data "$D" --out "$WORK/a/b/c" --steps 1 --resume
[ ! -e "$WORK/a" ] || fail "a refused --resume left the directories it created"

# sample, eval, prepare, plan: the same rules, with bounds written as a user would.
expect_error "--tokens must be >= 1, got 0" "$SHARDLM" sample --checkpoint "$WORK/run" --tokens 0
expect_error "--temperature must be a finite number >= 0 (0: greedy), got -1" "$SHARDLM" sample --checkpoint "$WORK/run" --temperature -1
expect_error "--top-k must be >= 0 (0: all), got -2" "$SHARDLM" sample --checkpoint "$WORK/run" --top-k -2
expect_error "--threads must be >= 1, got 0" "$SHARDLM" eval --checkpoint "$WORK/run" --data "$D" --threads 0
expect_error "--windows must be >= 1, got 0" "$SHARDLM" eval --checkpoint "$WORK/run" --data "$D" --windows 0
"$SHARDLM" prepare --tokenizer "gpt2:$SHARED_DATA/gpt2" --input "$WORK/small.txt" --out "$WORK/gpt2data" > /dev/null
expect_error "--data '$WORK/gpt2data' was tokenized with 'gpt2:.*gpt2', but checkpoint '.*step_00000002' was trained with 'byte'" \
  "$SHARDLM" eval --checkpoint "$WORK/run" --data "$WORK/gpt2data" --seq-len 32 --windows 2
before_meta="$(sha256sum "$D/meta.json" "$D/train.bin")"
expect_error "--out '$D' already holds a prepared dataset ('$D/meta.json'); prepare never replaces one" \
  "$SHARDLM" prepare --tokenizer byte --input "$WORK/short.txt" --out "$D"
[ "$(sha256sum "$D/meta.json" "$D/train.bin")" = "$before_meta" ] || fail "prepare replaced a dataset"
"$SHARDLM" plan --model gpt2-tiny --vocab-size 1000 -n 2 > "$WORK/plan.txt" 2>&1 || { cat "$WORK/plan.txt"; fail "plan --vocab-size without data"; }
"$SHARDLM" plan --model gpt2 -n 2 --precision bf16 --memory-per-rank 0.01 > "$WORK/plan.txt" 2>&1 || fail "plan"
grep -q "nothing fits" "$WORK/plan.txt" && ! grep -q -- "--precision bf16" "$WORK/plan.txt" \
  || { cat "$WORK/plan.txt"; fail "plan advises a bf16 run to use --precision bf16"; }
"$SHARDLM" train "${TINY[@]}" --data "$D" --out "$WORK/zero" --steps 0 > "$WORK/zero.log" 2>&1 || fail "--steps 0"
grep -q "| first train loss *| *- |" "$WORK/zero.log" || { cat "$WORK/zero.log"; fail "--steps 0 summary"; }

# Unknown flag / subcommand: CLI11's parse error, non-zero.
if "$SHARDLM" train --no-such-flag > /dev/null 2>&1; then fail "unknown flag accepted"; fi
if "$SHARDLM" frobnicate > /dev/null 2>&1; then fail "unknown subcommand accepted"; fi
expect_error "does not exist" "$SHARDLM" inspect "$WORK/nothing"
# plan: the same checks as train, before anything is computed.
expect_error "unknown model preset 'gpt5'" "$SHARDLM" plan --model gpt5
expect_error "-n must be at least 1, got 0" "$SHARDLM" plan -n 0
# A shape whose byte counts would overflow is refused at once (it used to run 87 s and overflow).
expect_error "model shape too large: about .* parameters (100000 layers, 1048576 wide)" \
  timeout 10 "$SHARDLM" plan --n-embd 1048576 --n-head 8 --n-layer 100000
expect_error "--lora-rank must be >= 0 (0: no adapters), got -4" "$SHARDLM" plan --lora-rank -4
expect_error "--lora-rank must be >= 0 (0: no adapters), got -4" "$SHARDLM" train "${TINY[@]}" --data "$D" --out "$WORK/neg_rank" --steps 1 --lora-rank -4
[ ! -e "$WORK/neg_rank" ] || fail "a refused --lora-rank wrote its --out"
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
# A job killed while writing a metrics line leaves it cut: report leaves it out and says so,
# and a resume says the record is lost rather than dropping it silently.
"$SHARDLM" train "${TINY[@]}" --data "$D" --out "$WORK/cut" --steps 4 --save-every 2 > /dev/null 2>&1 || fail "run to cut"
python3 - "$WORK/cut/metrics.jsonl" <<'PY'
import sys
p = sys.argv[1]; lines = open(p).read().splitlines(keepends=True)
open(p, "w").write("".join(lines[:2]) + lines[2][: len(lines[2]) // 2])   # step 3's line, cut mid-way
PY
"$SHARDLM" report "$WORK/cut" > /dev/null 2> "$WORK/cut_report.err" || { cat "$WORK/cut_report.err"; fail "report refused a run whose last line is cut"; }
grep -q "warning: .*metrics.jsonl' line 3 is cut" "$WORK/cut_report.err" || fail "report did not say the line is cut: $(cat "$WORK/cut_report.err")"
"$SHARDLM" train "${TINY[@]}" --data "$D" --out "$WORK/cut" --steps 4 --save-every 2 --resume > "$WORK/cut_resume.log" 2>&1 \
  || { cat "$WORK/cut_resume.log"; fail "resume of a run whose metrics are cut"; }
grep -q "warning: metrics.jsonl: dropped 1 cut or unreadable line" "$WORK/cut_resume.log" || fail "resume dropped a cut line silently"
echo "1 passed, 0 failed"
