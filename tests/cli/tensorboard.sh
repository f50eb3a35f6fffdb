#!/usr/bin/env bash
# `--tensorboard` (issue 28): event files that PyPI tensorboard's EventAccumulator reads
# (its own reader checks every record's CRCs), and every scalar in them equal to
# metrics.jsonl's value of that step (as the float32 an event holds). Bare
# --tensorboard writes RUN/tb; sft too; rank 0 only on two ranks. Skipped (77) without
# /work/venv's tensorboard (the product needs no Python).
source "$(dirname "$0")/lib/common.sh" "$@"
PY="${SHARDLM_VENV:-/work/venv}/bin/python"
"$PY" -c "import tensorboard.backend.event_processing.event_accumulator, numpy" 2>/dev/null \
  || { echo "skipped: no tensorboard in ${SHARDLM_VENV:-/work/venv}"; exit 77; }
make_byte_data

check_events() {  # check_events TB_DIR RUN_DIR MIN_TAGS
  "$PY" - "$1" "$2/metrics.jsonl" "$3" <<'PY'
import glob, json, sys
import numpy as np
from tensorboard.backend.event_processing import event_accumulator
tb_dir, metrics, min_tags = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = glob.glob(tb_dir + "/events.out.tfevents.*")
assert len(files) == 1, files
acc = event_accumulator.EventAccumulator(tb_dir, size_guidance={event_accumulator.SCALARS: 0})
acc.Reload()
records = {r["step"]: r for r in map(json.loads, open(metrics))}
fields = {"train/loss": "loss", "val/loss": "val_loss", "train/lr": "lr", "train/grad_norm": "grad_norm",
          "perf/tokens_per_s": "tokens_per_s", "perf/step_ms": "step_ms", "perf/exposed_comm_ms": "exposed_comm_ms"}
tags = acc.Tags()["scalars"]
assert len(tags) >= min_tags, tags
for want in ["train/loss", "val/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/step_ms",
             "perf/exposed_comm_ms", "memory/params", "memory/optimizer", "memory/activations"]:
    assert want in tags, (want, tags)
checked = 0
for tag in tags:
    events = acc.Scalars(tag)
    for e in events:
        r = records[e.step]
        if tag.startswith("memory/"):
            want = r["mem"]["peak"][tag[len("memory/"):]]
        else:
            want = r[fields[tag]]
        assert np.float32(want) == np.float32(e.value), (tag, e.step, want, e.value)
        checked += 1
    if tag == "val/loss":
        assert [e.step for e in events] == sorted(s for s, r in records.items() if "val_loss" in r), tag
    else:
        assert [e.step for e in events] == sorted(records), (tag, [e.step for e in events])
print(f"{checked} scalars over {len(tags)} tags equal metrics.jsonl")
PY
}

"$SHARDLM" train --data "$WORK/data" --out "$WORK/run" "${TINY[@]}" --steps 6 --eval-every 2 --eval-batches 2 \
  --tensorboard "$WORK/tb" > "$WORK/run.log" 2>&1 || { cat "$WORK/run.log"; fail "train --tensorboard DIR"; }
check_events "$WORK/tb" "$WORK/run" 12 || fail "train --tensorboard DIR: scalars differ"

# Bare --tensorboard: RUN/tb; two ranks, one file (rank 0's).
run_mpi 2 "$SHARDLM" train --data "$WORK/data" --out "$WORK/run2" "${TINY[@]}" --steps 4 --eval-every 2 \
  --eval-batches 2 --tensorboard > "$WORK/run2.log" 2>&1 || { cat "$WORK/run2.log"; fail "train --tensorboard"; }
check_events "$WORK/run2/tb" "$WORK/run2" 12 || fail "2 ranks: scalars differ"

# sft.
head -n 16 "$SHARED_DATA/sft/gsm8k_train.jsonl" > "$WORK/gsm.jsonl"
"$SHARDLM" sft --model qwen3-tiny --n-layer 1 --tokenizer "gpt2:$SHARED_DATA/gpt2" --dataset "$WORK/gsm.jsonl" \
  --val-fraction 0.25 --max-len 128 --threads 1 --micro-batch 4 --steps 3 --eval-every 1 --eval-batches 1 \
  --tensorboard --out "$WORK/sft" > "$WORK/sft.log" 2>&1 || { cat "$WORK/sft.log"; fail "sft --tensorboard"; }
check_events "$WORK/sft/tb" "$WORK/sft" 12 || fail "sft: scalars differ"
echo "tensorboard: ok"
