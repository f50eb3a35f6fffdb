#!/usr/bin/env bash
# tests/cli/disk_full.sh on a real full disk: a 512 KiB tmpfs, on which the tiny run's
# config files fit and its first checkpoint does not. Needs to mount (root with
# CAP_SYS_ADMIN): skipped (77) where it cannot.
source "$(dirname "$0")/lib/common.sh" "$@"
mkdir -p "$WORK/small_disk"
mount -t tmpfs -o size=512k tmpfs "$WORK/small_disk" 2> /dev/null || { echo "cannot mount a tmpfs here: skipped"; exit 77; }
trap 'umount "$WORK/small_disk"; rm -rf "$WORK"' EXIT
make_byte_data
# 4 layers, 64 wide: about 0.2M parameters, 2.5 MiB of checkpoint (weights, m, v).
expect_error "cannot write '$WORK/small_disk/run/checkpoints/.tmp-step_00000001/rank_00000.bin': No space left on device (no checkpoint was committed: removed what this job wrote in '$WORK/small_disk/run')\$" \
  "$SHARDLM" train "${TINY[@]}" --n-layer 4 --n-embd 64 --global-batch 8 --data "$WORK/data" --steps 1 \
  --out "$WORK/small_disk/run"
[ ! -e "$WORK/small_disk/run" ] || fail "left $(ls -A "$WORK/small_disk/run")"
[ -z "$(ls -A "$WORK/small_disk")" ] || fail "the disk still holds $(ls -A "$WORK/small_disk")"
echo "1 passed, 0 failed"
