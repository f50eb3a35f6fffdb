#!/usr/bin/env bash
# Fails on an #include that points up the room order of docs/architecture.md
# (core < backend < model < comm < parallel < optim < data < ckpt < train < plan <
# report < cli): a room may use the rooms below it, never one above. Known arrows
# that are still to be removed are listed in tests/include_order.allow ("FILE -> ROOM"
# per line); they are printed, not failed, and an entry that no longer occurs is
# reported so the list shrinks with the code.
# usage: tests/include_order.sh [SOURCE_ROOT]   (default: the checkout holding this script)
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
allow="$root/tests/include_order.allow"
rooms=(core backend model comm parallel optim data ckpt train plan report cli)
declare -A level
for i in "${!rooms[@]}"; do level[${rooms[$i]}]=$i; done

bad=0 known=0
declare -A seen
while IFS= read -r hit; do
  file=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}
  to=$(sed -E 's|.*#include "shardlm/([a-z_]+)/.*|\1|' <<<"$rest")
  rel=${file#"$root"/}
  from=$(cut -d/ -f3 <<<"$rel")
  [ "$from" = "$to" ] && continue
  if [ -z "${level[$from]+x}" ] || [ -z "${level[$to]+x}" ]; then
    echo "include_order: $rel:$line: room '$from' or '$to' is not in the room order (add it to this script and docs/architecture.md)"
    bad=$((bad + 1)); continue
  fi
  [ "${level[$to]}" -lt "${level[$from]}" ] && continue
  key="$rel -> $to"
  if [ -f "$allow" ] && grep -qxF "$key" "$allow"; then
    seen[$key]=1; known=$((known + 1))
    echo "include_order: known, to be removed: $rel:$line: $from includes $to"
  else
    echo "include_order: $rel:$line: $from includes $to, a room above it"
    bad=$((bad + 1))
  fi
done < <(grep -rnE '#include "shardlm/[a-z_]+/' "$root/src/shardlm" --include='*.hpp' --include='*.cpp' --include='*.cu' --include='*.cuh')

if [ -f "$allow" ]; then
  while IFS= read -r entry; do
    [ -z "$entry" ] || [[ "$entry" == \#* ]] && continue
    [ -n "${seen[$entry]+x}" ] || echo "include_order: $entry no longer occurs: remove it from tests/include_order.allow"
  done < "$allow"
fi
echo "include_order: $bad include(s) pointing up the room order, $known known ones still listed"
[ "$bad" -eq 0 ]
