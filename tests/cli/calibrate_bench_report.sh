#!/usr/bin/env bash
# calibrate -> plan -> bench -> report on a tiny model: calibrate writes a profile that
# plan reads (it prints step times); bench runs ddp and zero3 on 2 ranks and records
# measured traffic equal to the plan's and predictions from the profile; report writes
# a well-formed page for the bench and for a run; bad input gets one-line errors.
source "$(dirname "$0")/lib/common.sh" "$@"
make_byte_data
SHAPE=(--model gpt2-tiny --n-layer 2 --n-embd 64 --n-head 4 --seq-len 32 --micro-batch 2)
PROFILE="$WORK/profile.json"
"$SHARDLM" calibrate -n 2 --model gpt2-tiny --micro-batch 2 --seq-len 32 --precisions fp32 \
  --transports shm --large-mib 1 --repeats 1 --out "$PROFILE" > "$WORK/calibrate.log" 2>&1 \
  || { cat "$WORK/calibrate.log"; fail "calibrate failed"; }
python3 - "$PROFILE" <<'PY' || fail "profile is incomplete"
import json, sys
p = json.load(open(sys.argv[1]))
r = p["compute"][0]["rates"]["fp32"]
assert all(r[k] > 0 for k in r), r
assert p["intra_node"]["all_gather"]["bus_gb_per_s"] > 0
assert 0 < p["intra_node"]["compute_share_during_comm"] <= 1
PY
"$SHARDLM" plan "${SHAPE[@]}" -n 2 --data "$WORK/data" --profile "$PROFILE" > "$WORK/plan.txt" \
  || fail "plan with the calibrated profile failed"
grep -q "^Step time on profile 'this-machine'" "$WORK/plan.txt" || fail "plan printed no step times"
grep -q "^  why: " "$WORK/plan.txt" || fail "plan gave no reason for its recommendation"

"$SHARDLM" bench "${SHAPE[@]}" -n 2 --data "$WORK/data" --steps 3 --threads 1 \
  --strategies ddp,zero3 --profile "$PROFILE" --out "$WORK/bench" > "$WORK/bench.txt" 2>&1 \
  || { cat "$WORK/bench.txt"; fail "bench failed"; }
grep -q "^| zero3 |" "$WORK/bench.txt" || fail "bench printed no zero3 row"
python3 - "$WORK/bench/bench.json" <<'PY' || fail "bench.json is wrong"
import json, sys
b = json.load(open(sys.argv[1]))
assert [r["label"] for r in b["runs"]] == ["ddp", "zero3"]
for r in b["runs"]:
    assert r["predicted"] and r["predicted"]["step_ms"] > 0, r
    m = r["measured"]
    assert m["steps"] == 2 and m["step_ms"] > 0
    assert abs(m["comm_bytes"] / r["planned_wire_bytes"] - 1) < 0.03, (m["comm_bytes"], r["planned_wire_bytes"])
PY
for page in "$WORK/bench/report.html" "$WORK/bench/runs/zero3/report.html"; do
  [ "$page" = "$WORK/bench/report.html" ] || "$SHARDLM" report "$WORK/bench/runs/zero3" > /dev/null \
    || fail "report of a run failed"
  python3 - "$page" <<'PY' || fail "$page is not well-formed"
import html.parser, sys
class Check(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(); self.stack = []
    def handle_starttag(self, tag, attrs):
        if tag not in ("meta",): self.stack.append(tag)
    def handle_startendtag(self, tag, attrs): pass
    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()
c = Check(); text = open(sys.argv[1]).read(); c.feed(text); c.close()
assert not c.stack, c.stack
assert "<script" not in text
PY
done
# A 2-rank run's report draws both ranks' memory (RUN/memory_by_rank.json).
python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["ranks"]; sys.exit(0 if len(r) == 2 and all(x["peak"]["params"] > 0 for x in r) else 1)' \
  "$WORK/bench/runs/zero3/memory_by_rank.json" || fail "memory_by_rank.json does not hold 2 ranks' peaks"
grep -q "<title>rank 1 params: " "$WORK/bench/runs/zero3/report.html" || fail "the 2-rank run's report shows rank 0 only"
expect_error "--data is required" "$SHARDLM" bench --model gpt2-tiny
expect_error "expected HOSTSxRATE" "$SHARDLM" bench --data "$WORK/data" --cluster two
expect_error "hybrid needs its group size" "$SHARDLM" bench --data "$WORK/data" --strategies hybrid
expect_error "has no metrics.jsonl" "$SHARDLM" report "$WORK"
expect_error "unknown profile 'nope'" "$SHARDLM" plan --profile nope
expect_error "--transports: unknown transport 'ib'" "$SHARDLM" calibrate --transports ib
echo "1 passed, 0 failed"
