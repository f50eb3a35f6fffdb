#!/usr/bin/env bash
# scripts/gpu_check.sh here, without a GPU, so that a broken script or bundle is found
# on this machine and not in the few minutes of a borrowed one:
#  1. the mechanics, on stand-in commands: a step that fails, one that hangs (stopped by
#     its limit) and one past the run's budget are counted and named; a test that skips
#     itself counts as failed on a GPU machine and as skipped without one; the summary
#     fails the run when anything failed;
#  2. Python's tarfile unpacks the bundle's format as tar + gzip do (the fallback for
#     an image without them);
#  3. `bundle` from this build's binaries (march native: packing build-cuda for x86-64-v3
#     is a whole second build, too slow for CI), then `run` against it with the CUDA
#     steps SKIPPED: preflight, every binary loading from the bundle's libraries, the
#     CPU kernel tests, one emulated-device test, tokenizing, plan's FLOPs, the CPU half
#     of step 6; the log ends with the summary and $OUT holds at most 8 files;
#  4. broken bundles stop the run at once with one line: a missing library (which this
#     machine has, so the check is that every library comes from the bundle), a CPU flag
#     this machine lacks.
# Exit 77 (skipped) where this build has no CUDA test binaries to bundle.
source "$(dirname "$0")/lib/common.sh" "$@"
SCRIPT="$(cd "$(dirname "$0")/../.." && pwd)/scripts/gpu_check.sh"
BUILD="$(cd "$(dirname "$SHARDLM")" && pwd)"

# --- 1. mechanics ------------------------------------------------------------------------
(
  TEST_WORK="$WORK"
  source "$SCRIPT"  # (sets WORK, the run's directory: the test's own is TEST_WORK)
  WORK="$TEST_WORK/mechanics" && mkdir -p "$WORK"
  DETAILS="$WORK/details.log"
  RUN_START=$SECONDS
  step ok 5 true > "$WORK/out.txt" || fail "a passing step failed"
  ! step fails 5 sh -c 'echo "error: something broke"; exit 3' >> "$WORK/out.txt" \
    || fail "a failing step passed"
  t0=$SECONDS
  ! step hangs 1 sleep 60 >> "$WORK/out.txt" || fail "a hanging step passed"
  (( SECONDS - t0 < 20 )) || fail "the step's limit did not stop it ($(( SECONDS - t0 )) s)"
  HAVE_GPU=0
  ! gpu_step needs_gpu 5 true >> "$WORK/out.txt" || fail "a GPU step ran without a GPU"
  step skips 5 true >> "$WORK/out.txt" && skipped_itself skips "no GPU visible" >> "$WORK/out.txt"
  HAVE_GPU=1
  step skips_on_gpu 5 true >> "$WORK/out.txt" \
    && skipped_itself skips_on_gpu "no GPU visible" >> "$WORK/out.txt"
  RUN_START=$(( SECONDS - BUDGET_S ))
  ! step too_late 5 true >> "$WORK/out.txt" || fail "a step past the budget ran"
  ! summary > "$WORK/summary.txt" || fail "the summary passed a run with failures"
  cat "$WORK/out.txt" "$WORK/summary.txt"
  grep -q '^== summary: 1 step(s) passed, 4 failed, 2 skipped' "$WORK/summary.txt" \
    || fail "wrong counts in the summary"
  grep -q '^FAILED: fails: exit 3' "$WORK/summary.txt" || fail "the failing step is not named"
  grep -q 'error: something broke' "$WORK/summary.txt" || fail "the failing step's error is not shown"
  grep -q '^FAILED: hangs: timed out after 1 s' "$WORK/summary.txt" || fail "the timeout is not named"
  grep -q '^FAILED: skips_on_gpu: did not run: no GPU visible' "$WORK/summary.txt" \
    || fail "a self-skipping test on a GPU machine is not a failure"
  grep -q '^FAILED: too_late: did not run' "$WORK/summary.txt" || fail "the budget is not enforced"
  grep -q '^SKIPPED: needs_gpu: needs a GPU' "$WORK/summary.txt" || fail "the GPU step is not skipped"
  grep -q '^gpu_check: 4 failure(s)' "$WORK/summary.txt" || fail "no final count"
  grep -q '^===== fails (exit 3' "$DETAILS" || fail "details.log lacks the failing step"
)
echo "mechanics: ok"

# --- 2. the unpack fallback ------------------------------------------------------------------
mkdir -p "$WORK/tree/bin" "$WORK/fake_bundle"
echo payload > "$WORK/tree/bin/file"
tar -czf "$WORK/fake_bundle/gpu-bundle.tar.gz" -C "$WORK/tree" .
(
  TEST_WORK="$WORK"
  source "$SCRIPT"
  BUNDLE="$TEST_WORK/fake_bundle" WORK="$TEST_WORK/unpacked_by_python"
  mkdir -p "$WORK" && unpack_with_python
  [ "$(cat "$WORK/bin/file")" = payload ] || fail "python's tarfile did not unpack the bundle"
)
echo "unpack with python's tarfile: ok"

# --- 3. bundle and dry run ---------------------------------------------------------------------
for b in tests/test_backend_ops tests/test_emulated_device tests/mpi_test_comm_nccl; do
  if [ ! -x "$BUILD/$b" ]; then
    echo "SKIP: $BUILD/$b is not built (a CUDA build of every test target is needed to bundle)"
    exit 77
  fi
done
export GPU_CHECK_BUNDLE="$WORK/bundle" GPU_CHECK_WORK="$WORK/run" GPU_CHECK_DATA="$SHARED_DATA"
export GPU_CHECK_ALLOW_NO_GPU=1 GPU_CHECK_QUICK=1 OMP_NUM_THREADS=2 OUT="$WORK/out"
t0=$SECONDS
bash "$SCRIPT" bundle "$BUILD" || fail "bundle"
echo "bundle: $(( SECONDS - t0 )) s"
tar -tzf "$WORK/bundle/gpu-bundle.tar.gz" > "$WORK/bundle.list"
grep -q '^./bin/shardlm$' "$WORK/bundle.list" || fail "no bin/shardlm in the bundle"
grep -q '^./lib/libfmt' "$WORK/bundle.list" || fail "no libfmt in the bundle's lib"
t0=$SECONDS
bash "$SCRIPT" run > "$WORK/run.txt" 2>&1 || { cat "$WORK/run.txt"; fail "the dry run failed"; }
echo "dry run: $(( SECONDS - t0 )) s"
cat "$WORK/run.txt"
cmp -s "$WORK/run.txt" "$OUT/gpu_check.log" || fail "gpu_check.log is not what the run printed"
tail -n 1 "$OUT/gpu_check.log" | grep -q '^gpu_check: 0 failure(s)$' || fail "the log does not end with the summary"
for s in gpt2_bf16 gpt2_bf16_offload qwen05_bf16 eq_cuda; do
  grep -q "^SKIPPED: $s: needs a GPU" "$OUT/gpu_check.log" || fail "$s is not reported SKIPPED"
done
grep -q '^shardlm: shardlm (CPU kernels -march=' "$OUT/gpu_check.log" || fail "no --version line"
grep -q '^   eq_cpu: ok' "$OUT/gpu_check.log" || fail "the CPU half of step 6 did not run"
[ "$(find "$OUT" -type f | wc -l)" -le 8 ] || fail "more than 8 files under \$OUT"

# --- 4. broken bundles stop at once, with one line ---------------------------------------------
broken() {  # name, then a command run in a copy of the bundle (bundle.txt, tree/) that is packed again
  local name="$1"; shift
  rm -rf "$WORK/broken" && mkdir -p "$WORK/broken/tree" "$WORK/broken/bundle"
  cp "$WORK/bundle/bundle.txt" "$WORK/broken/bundle/"
  if [ "$1" = "in-tree" ]; then
    shift
    tar -xzf "$WORK/bundle/gpu-bundle.tar.gz" -C "$WORK/broken/tree"
    (cd "$WORK/broken/tree" && "$@")
    tar -cf - -C "$WORK/broken/tree" . | gzip -1 > "$WORK/broken/bundle/gpu-bundle.tar.gz"
  else
    ln "$WORK/bundle/gpu-bundle.tar.gz" "$WORK/broken/bundle/"
    (cd "$WORK/broken/bundle" && "$@")
  fi
  local status=0
  GPU_CHECK_BUNDLE="$WORK/broken/bundle" OUT="$WORK/broken/out" bash "$SCRIPT" run \
    > "$WORK/broken/run.txt" 2>&1 || status=$?
  [ "$status" -eq 2 ] || { cat "$WORK/broken/run.txt"; fail "$name: exit $status, expected 2 (stopped)"; }
  grep '^gpu_check: stopped before any step: ' "$WORK/broken/run.txt" \
    || { cat "$WORK/broken/run.txt"; fail "$name: no one-line reason"; }
}
broken "a missing library" in-tree sh -c 'rm lib/libfmt*'
grep -q 'libfmt.* not from the bundle' "$WORK/broken/run.txt" || fail "the missing library is not named"
broken "a CPU flag this machine lacks" sed -i 's/^cpu_flags=/cpu_flags=imaginary_flag /' bundle.txt
grep -q 'lacks imaginary_flag' "$WORK/broken/run.txt" || fail "the missing CPU flag is not named"
echo "broken bundles stop at once: ok"
