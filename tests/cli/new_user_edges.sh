#!/usr/bin/env bash
# What a new user reads first (issue 28): --help names every family, --version, the
# PEFT-style trainable-parameter line and summary row (LoRA counted by hand), the
# summary's median-step tokens/s against metrics.jsonl, sft's resolved steps and ETA
# on the start line, sft --precision from the model's torch_dtype, bench --strategy
# refused, plan's --device default from the profile and sizes in GiB, a resume at
# another world size without --global-batch, and `make demo`'s quiet build.
source "$(dirname "$0")/lib/common.sh" "$@"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"

# --help and --version.
# (The first line is taken in the shell: `echo "$help" | head -1 | grep -q` under
# pipefail failed once with the family in that line, a member of the pipeline ending
# on SIGPIPE.)
help="$("$SHARDLM" --help)"
first_line="${help%%$'\n'*}"
for family in GPT-2 Llama Qwen2 Qwen3; do
  grep -q "$family" <<< "$first_line" || fail "--help does not name $family: $first_line"
done
"$SHARDLM" --version | grep -q "^shardlm " || fail "--version"

# Full training: every parameter trains; the summary's tokens/s is the median step's.
make_byte_data
"$SHARDLM" train --data "$WORK/data" --out "$WORK/full" "${TINY[@]}" --steps 5 > "$WORK/full.log" 2>&1 \
  || { cat "$WORK/full.log"; fail "train"; }
all="$(grep -o "^trainable params: [0-9,]* || all params: [0-9,]* || trainable%: 100.0000$" "$WORK/full.log" \
       | sed 's/.*all params: \([0-9,]*\).*/\1/' | tr -d ,)"
[ -n "$all" ] || { cat "$WORK/full.log"; fail "no PEFT-style trainable params line for a full run"; }
python3 - "$WORK/full.log" "$WORK/full/metrics.jsonl" <<'PY' || fail "summary tokens/s"
import json, re, statistics, sys
log = open(sys.argv[1]).read()
median = statistics.median(json.loads(l)["tokens_per_s"] for l in open(sys.argv[2]))
shown = float(re.search(r"\| tokens/s \(median step\) +\| +([0-9.]+) \|", log).group(1))
assert abs(shown - median) <= 0.5, (shown, median)
assert re.search(r"\| tokens/s incl\. eval\+save +\| +[0-9]+ \|", log), "no loop tokens/s row"
PY

# LoRA on q_proj,v_proj of a 2-layer Qwen3 (64 wide, 4 heads of 16, 2 KV heads): per
# layer r x (64 + 64) for q_proj and r x (64 + 32) for v_proj.
"$SHARDLM" train --data "$WORK/data" --out "$WORK/lora" --model qwen3-tiny --n-layer 2 --n-embd 64 --n-head 4 \
  --seq-len 32 --micro-batch 2 --threads 1 --steps 1 --lora-rank 4 --lora-targets q_proj,v_proj \
  > "$WORK/lora.log" 2>&1 || { cat "$WORK/lora.log"; fail "train lora"; }
"$SHARDLM" inspect "$WORK/lora" > "$WORK/lora.inspect"
heads="$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["model"]; print(m.get("head_dim"), m.get("n_kv_head", m.get("num_key_value_heads")))' "$WORK/lora/config.json")"
want="$(python3 - "$WORK/lora/config.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["model"]
d, layers = m["n_embd"], m["n_layer"]
head_dim = m.get("head_dim") or d // m["n_head"]
kv = m.get("n_kv_head") or m.get("num_key_value_heads") or m["n_head"]
r = 4
print(layers * (r * (d + m["n_head"] * head_dim) + r * (d + kv * head_dim)))
PY
)"
line="$(grep "^trainable params:" "$WORK/lora.log")" || fail "no trainable params line for LoRA"
got="$(echo "$line" | sed 's/trainable params: \([0-9,]*\) .*/\1/' | tr -d ,)"
[ "$got" = "$want" ] || fail "LoRA trainable params $got, counted by hand $want ($line; $heads)"
grep -q "| trainable params  *| *[0-9,]* ([0-9.]*% of [0-9.]*M) |" "$WORK/lora.log" || fail "no trainable params summary row"

# sft: the steps one epoch resolves to, an ETA after the first step, and bf16 from the
# model's torch_dtype (a model directory exported in bf16).
head -n 16 "$SHARED_DATA/sft/gsm8k_train.jsonl" > "$WORK/gsm.jsonl"
SFT=(--tokenizer "gpt2:$SHARED_DATA/gpt2" --dataset "$WORK/gsm.jsonl" --max-len 256 --threads 1 --micro-batch 4
     --eval-batches 0)
"$SHARDLM" sft --model qwen3-tiny --n-layer 1 "${SFT[@]}" --out "$WORK/sft" > "$WORK/sft.log" 2>&1 \
  || { cat "$WORK/sft.log"; fail "sft"; }
grep -q "^steps 4 (1 epoch(s) over 16 rows, 4 rows per step)$" "$WORK/sft.log" || { cat "$WORK/sft.log"; fail "sft start line: steps"; }
grep -q "step 1 took [0-9.]* s: about .* for the 3 steps left" "$WORK/sft.log" || fail "sft: no ETA after the first step"
grep -q "precision bf16" "$WORK/sft.log" && fail "sft of a preset chose bf16"
"$SHARDLM" export --checkpoint "$WORK/sft" --out "$WORK/hf_bf16" --dtype bf16 > /dev/null
grep -q '"torch_dtype": "bfloat16"' "$WORK/hf_bf16/config.json" || fail "export --dtype bf16 config"
"$SHARDLM" sft --model "$WORK/hf_bf16" "${SFT[@]}" --steps 1 --out "$WORK/sft_bf16" > "$WORK/sft_bf16.log" 2>&1 \
  || { cat "$WORK/sft_bf16.log"; fail "sft of a bf16 model"; }
grep -q "^precision bf16 (the model's torch_dtype, bfloat16; --precision fp32 to change)" "$WORK/sft_bf16.log" \
  || { cat "$WORK/sft_bf16.log"; fail "sft did not take bf16 from torch_dtype"; }
grep -q '"precision": "bf16"' "$WORK/sft_bf16/config.json" || fail "sft_bf16 config.json precision"
"$SHARDLM" sft --model "$WORK/hf_bf16" "${SFT[@]}" --steps 1 --precision fp32 --out "$WORK/sft_fp32" > "$WORK/sft_fp32.log" 2>&1 \
  || { cat "$WORK/sft_fp32.log"; fail "sft --precision fp32"; }
grep -q '"precision": "fp32"' "$WORK/sft_fp32/config.json" || fail "--precision fp32 not kept"
"$SHARDLM" sft --help | grep -A1 -- "--packing" | grep -q -- "--seq-len" && fail "sft --packing help names --seq-len"
"$SHARDLM" sft --help | grep -- "--steps" | grep -q "=100" && fail "sft --steps help shows a default of 100"

# bench refuses the strategy flags it would ignore.
expect_error "bench: --strategy is not for bench" "$SHARDLM" bench --data "$WORK/data" --strategy zero3

# plan: a GPU profile computes on cuda unless --device says otherwise; GiB above 1 GiB.
"$SHARDLM" plan --model qwen2.5-0.5b --profile h100-80g > "$WORK/plan_gpu.txt"
head -1 "$WORK/plan_gpu.txt" | grep -q "device cuda" || fail "plan with a GPU profile: $(head -1 "$WORK/plan_gpu.txt")"
grep -q "^| ddp (asked) | 1.8 GiB | 0.0 MiB | 1.8 GiB | 3.7 GiB |" "$WORK/plan_gpu.txt" || fail "plan sizes not in GiB"
# (First lines taken in the shell, as --help's above: under pipefail `plan | head -1`
# fails whenever plan writes after head has gone, as it does once its output passes
# 4 KiB, stdio's pipe buffer; qwen2.5-0.5b's is 2.9 KiB.)
plan_out="$("$SHARDLM" plan --model qwen2.5-0.5b --profile h100-80g --device cpu)"
grep -q "device cpu" <<< "${plan_out%%$'\n'*}" || fail "plan --device cpu with a GPU profile: ${plan_out%%$'\n'*}"
plan_out="$("$SHARDLM" plan --model gpt2-tiny)"
grep -q "device cpu" <<< "${plan_out%%$'\n'*}" || fail "plan without a profile: cpu: ${plan_out%%$'\n'*}"

# Resume on 4 ranks of a 2-rank run without --global-batch: the run's own global batch (8).
run_mpi 2 "$SHARDLM" train --data "$WORK/data" --out "$WORK/ws" "${TINY[@]}" --steps 2 > "$WORK/ws.log" 2>&1 \
  || { cat "$WORK/ws.log"; fail "2-rank run"; }
run_mpi 4 "$SHARDLM" train --data "$WORK/data" --out "$WORK/ws" "${TINY[@]}" --steps 3 --resume > "$WORK/ws4.log" 2>&1 \
  || { cat "$WORK/ws4.log"; fail "resume on 4 ranks without --global-batch"; }
grep -q "global batch 8 from the run's checkpoint (--global-batch not given); micro-batch 4 -> 2 so that 4 data-parallel ranks split it" "$WORK/ws4.log" \
  || { cat "$WORK/ws4.log"; fail "resume did not say it kept the run's global batch"; }
[ "$(metric "$WORK/ws" step)" = 3 ] || fail "resumed run did not reach step 3"
# Resume on 4 ranks at --tensor-parallel 2 of a 3-rank run: its global batch of 6 splits
# over the 2 data-parallel ranks (tensor ranks share their rows), not over the 4 ranks.
LLAMA=(--model llama-tiny --seq-len 32 --micro-batch 2 --threads 1 --eval-batches 0)
run_mpi 3 "$SHARDLM" train --data "$WORK/data" --out "$WORK/wt" "${LLAMA[@]}" --steps 1 > "$WORK/wt.log" 2>&1 \
  || { cat "$WORK/wt.log"; fail "3-rank llama run"; }
run_mpi 4 "$SHARDLM" train --data "$WORK/data" --out "$WORK/wt" "${LLAMA[@]}" --steps 2 --resume \
  --tensor-parallel 2 > "$WORK/wt4.log" 2>&1 || { cat "$WORK/wt4.log"; fail "resume at --tensor-parallel 2"; }
grep -q "global batch 6 from the run's checkpoint (--global-batch not given); micro-batch 2 -> 1 so that 2 data-parallel ranks split it" \
  "$WORK/wt4.log" || { cat "$WORK/wt4.log"; fail "resume did not split the run's global batch over the data-parallel ranks"; }
[ "$(metric "$WORK/wt" step)" = 2 ] || fail "resumed tensor-parallel run did not reach step 2"

# make demo's build: quiet when it works, the whole output when it fails.
cat > "$WORK/fake-cmake" <<'SH'
#!/bin/sh
for i in $(seq 1 50); do echo "[ $i%] Building CXX object"; done
[ -z "$FAIL_BUILD" ] || { echo "error: something broke"; exit 2; }
SH
chmod +x "$WORK/fake-cmake"
out="$(make -s -C "$REPO" quiet-build CMAKE="$WORK/fake-cmake" BUILD_DIR="$WORK/b" 2>&1)" || fail "quiet-build: $out"
[ "$(echo "$out" | wc -l)" = 1 ] || fail "quiet-build printed the build's output: $out"
rc=0
out="$(FAIL_BUILD=1 make -s -C "$REPO" quiet-build CMAKE="$WORK/fake-cmake" BUILD_DIR="$WORK/b" 2>&1)" || rc=$?
[ "$rc" -ne 0 ] || fail "quiet-build passed a failed build"
echo "$out" | grep -q "error: something broke" || fail "quiet-build hid the failing output: $out"
echo "new_user_edges: ok"
