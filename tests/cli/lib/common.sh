# Shared helpers for the CLI end-to-end tests. Usage in a test:
#   source "$(dirname "$0")/lib/common.sh" "$@"
set -euo pipefail
SHARDLM="$1"
SHARED_DATA="$2"
WORK="$(mktemp -d /tmp/shardlm-cli-test.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# A small byte-level dataset from the first 60 KB of TinyShakespeare (fast to train on).
make_byte_data() {
  head -c 60000 "$SHARED_DATA/tinyshakespeare.txt" > "$WORK/small.txt"
  rm -rf "$WORK/data"  # prepare never replaces a dataset
  "$SHARDLM" prepare --tokenizer byte --input "$WORK/small.txt" --out "$WORK/data" > /dev/null
}

# Tiny model flags used by most tests: 2 layers, 32 wide, 2 heads, vocab 256.
TINY=(--model gpt2-tiny --n-layer 2 --n-embd 32 --n-head 2 --seq-len 32 --micro-batch 4
      --threads 1 --lr 3e-3 --warmup 2 --grad-clip 0.5)

digest_of() { "$SHARDLM" inspect "$1" | awk '/^digest:/ {print $2}'; }

# expect_error "<substring>" cmd...: the command must fail (non-zero) and print the
# substring on stderr, as one line starting with "error:".
expect_error() {
  local needle="$1"; shift
  local out rc=0
  out="$("$@" 2>&1 >/dev/null)" || rc=$?
  [ "$rc" -ne 0 ] || fail "expected failure for: $* (exit 0)"
  # (A here-string, not `echo | grep -q`: under pipefail echo fails with SIGPIPE when
  # grep has matched and gone before the rest of an output over 4 KiB is written.)
  grep -q "^error: .*$needle" <<< "$out" || fail "expected 'error: ...$needle' for: $*; got: $out"
}

# same_curves RUN_A RUN_B TOL [WHAT]: every step's loss and gradient norm of two runs
# (their metrics.jsonl) within TOL relative, the same number of steps.
same_curves() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" "${4:-$1 vs $2}" <<'PY' || fail "${4:-$1 and $2}: loss or gradient norm differ"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
tol = float(sys.argv[3])
assert len(a) == len(b) and a, (len(a), len(b))
worst = 0.0
for x, y in zip(a, b):
    for k in ("loss", "grad_norm"):
        worst = max(worst, abs(x[k] - y[k]) / abs(y[k]))
print(f"{sys.argv[4]}: loss and grad norm within {worst:.2e} relative over {len(a)} steps")
sys.exit(0 if worst <= tol else 1)
PY
}

# peft_agrees OURS BASE_DIR ADAPTER_DIR DATA_DIR TOOLS REF_PYTHON: PEFT on the base with the
# exported adapter (tools/check_peft_export.py, 8 windows of 32 tokens of val.bin) gives
# shardlm's loss OURS within 1e-5 relative; returns 1 (having said so) when the reference
# python or its packages are not there, fails the test when PEFT cannot load the adapter
# or disagrees.
peft_agrees() {
  local ours="$1" base="$2" adapter="$3" data="$4" tools="$5" ref_python="$6" rc=0 peft theirs
  peft="$(cd "$tools" && "$ref_python" check_peft_export.py "$base" "$adapter" "$data/val.bin" 32 8 2>&1)" || rc=$?
  if [ "$rc" -eq 77 ] || [ ! -x "$ref_python" ]; then
    echo "PEFT check skipped (${peft:-no $ref_python})"
    return 1
  fi
  [ "$rc" -eq 0 ] || { echo "$peft"; fail "peft could not load the adapter"; }
  theirs="$(echo "$peft" | awk '/^loss:/ {print $2}')"
  python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b) <= 1e-5*abs(b) else 1)" \
    "$ours" "$theirs" || fail "PEFT loss $theirs differs from shardlm's $ours"
  echo "shardlm loss $ours, PEFT on the base $theirs ($(echo "$peft" | grep 'adapter tensors'))"
}

# mpirun with this machine's flags (root, oversubscription); never hangs past 300 s,
# and says so on stderr when it is ended for that (mpirun ends its ranks silently, so a
# log cut short would otherwise not tell a hang from a crash).
run_mpi() {
  local n="$1" rc=0; shift
  timeout 300 mpirun -n "$n" --oversubscribe "$@" || rc=$?
  [ "$rc" -ne 124 ] || echo "run_mpi: mpirun -n $n did not end within 300 s; ended by timeout(1)" >&2
  return "$rc"
}

# Field of the last metrics record: metric RUN_DIR FIELD (python3's json, stdlib only).
metric() {
  python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][-1]
v=r
for k in sys.argv[2].split("."): v=v[k]
print(v)' "$1/metrics.jsonl" "$2"
}

# make_llama64_config DIR: a llama config whose tensor-parallel split runs are multiples
# of NF4's 64-value blocks (head_dim 64, an MLP of 256), which --quantize-base nf4 with
# --tensor-parallel 2 needs (llama-tiny's head_dim 24 cuts the blocks and is refused).
make_llama64_config() {
  mkdir -p "$1"
  cat > "$1/config.json" <<'JSON'
{"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 256,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
}
