#!/usr/bin/env bash
# `--config FILE` (issue 28): every flag as a key (dashes or underscores), the command
# line overrides the file, an unknown key / a repeated key / a section is an error
# naming the file's line, RUN/config.toml and config.json's "flags" record the run,
# and a rerun from RUN/config.toml reproduces the weights bit for bit; sft and plan too.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data

cat > "$WORK/run.toml" <<EOF
# a tiny run
data = "$WORK/data"
out = "$WORK/a"
model = "gpt2-tiny"
n-layer = 2
n_embd = 32
n-head = 2
seq-len = 32
micro_batch = 4
threads = 1
lr = 3e-3   # overridden on the command line below
warmup = 2
grad-clip = 0.5
steps = 4
activation-checkpointing
EOF
"$SHARDLM" train --config "$WORK/run.toml" --lr 2e-3 > "$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; fail "train --config"; }
python3 - "$WORK/a/config.json" <<'PY' || fail "config.json does not hold the resolved flags"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["steps"] == 4 and c["micro_batch"] == 4, c
assert abs(c["options"]["lr"] - 2e-3) < 1e-9, c["options"]["lr"]      # the command line wins
assert c["options"]["seq_len"] == 32 and c["activation_checkpointing"] is True, c
f = c["flags"]
assert c["command"] == "train" and f["lr"] == "2e-3" and f["steps"] == "4" and f["n-embd"] == "32", f
PY
grep -q '^lr = 2e-3$' "$WORK/a/config.toml" || fail "config.toml lr: $(cat "$WORK/a/config.toml")"
grep -q '^# eval-batches = 8$' "$WORK/a/config.toml" || fail "config.toml lacks the defaults as comments"

# A rerun from the recorded file (into another run directory) gives the same weights.
"$SHARDLM" train --config "$WORK/a/config.toml" --out "$WORK/b" > "$WORK/b.log" 2>&1 \
  || { cat "$WORK/b.log"; fail "rerun from RUN/config.toml"; }
[ "$(digest_of "$WORK/a")" = "$(digest_of "$WORK/b")" ] || fail "rerun from config.toml differs"
# ... and a changed value on the command line changes them.
"$SHARDLM" train --config "$WORK/a/config.toml" --out "$WORK/c" --lr 1e-3 > "$WORK/c.log" 2>&1 \
  || { cat "$WORK/c.log"; fail "rerun with --lr"; }
[ "$(digest_of "$WORK/a")" != "$(digest_of "$WORK/c")" ] || fail "--lr over --config changed nothing"

# Errors name the file's line and the key; nothing is written.
printf 'steps = 2\n\nfrobnicate = 1\n' > "$WORK/bad.toml"
expect_error "$WORK/bad.toml:3: unknown key 'frobnicate' for \`shardlm train\`" \
  "$SHARDLM" train --config "$WORK/bad.toml" --data "$WORK/data" --out "$WORK/bad"
[ ! -e "$WORK/bad" ] || fail "a bad config file left $WORK/bad"
printf 'lr = 1e-3\nsteps = 2\nlr = 2e-3\n' > "$WORK/twice.toml"
expect_error "twice.toml:3: key 'lr' sets --lr again (line 1 set it already)" \
  "$SHARDLM" train --config "$WORK/twice.toml" --data "$WORK/data" --out "$WORK/bad"
printf '[training]\nlr = 1e-3\n' > "$WORK/section.toml"
expect_error "section.toml:1: sections are not read" "$SHARDLM" train --config "$WORK/section.toml"
expect_error "--config $WORK/none.toml: no such file" "$SHARDLM" train --config "$WORK/none.toml"
printf 'config = "x.toml"\n' > "$WORK/nested.toml"
expect_error "nested.toml:1: 'config' cannot be set in a config file" "$SHARDLM" plan --config "$WORK/nested.toml"

# plan reads one too (keys of plan's flags).
printf 'model = "gpt2"\nranks = 4\nstrategy = "zero3"\nprecision = "bf16"\n' > "$WORK/plan.toml"
"$SHARDLM" plan --config "$WORK/plan.toml" --json > "$WORK/plan.json" || fail "plan --config"
"$SHARDLM" plan --model gpt2 -n 4 --strategy zero3 --precision bf16 --json > "$WORK/plan_cli.json"
cmp -s "$WORK/plan.json" "$WORK/plan_cli.json" || fail "plan --config differs from the same flags"

# sft: a list key, and its record reruns.
head -n 8 "$SHARED_DATA/sft/gsm8k_train.jsonl" > "$WORK/gsm.jsonl"
cat > "$WORK/sft.toml" <<EOF
model = "qwen3-tiny"
n-layer = 1
tokenizer = "gpt2:$SHARED_DATA/gpt2"
dataset = ["$WORK/gsm.jsonl"]
max_len = 128
threads = 1
micro-batch = 4
steps = 2
eval-batches = 0
EOF
"$SHARDLM" sft --config "$WORK/sft.toml" --out "$WORK/s1" > "$WORK/s1.log" 2>&1 || { cat "$WORK/s1.log"; fail "sft --config"; }
grep -q "^dataset = \[\"$WORK/gsm.jsonl\"\]$" "$WORK/s1/config.toml" || fail "sft config.toml dataset: $(cat "$WORK/s1/config.toml")"
"$SHARDLM" sft --config "$WORK/s1/config.toml" --out "$WORK/s2" > "$WORK/s2.log" 2>&1 || { cat "$WORK/s2.log"; fail "sft rerun"; }
[ "$(digest_of "$WORK/s1")" = "$(digest_of "$WORK/s2")" ] || fail "sft rerun from config.toml differs"
echo "config_file: ok"
