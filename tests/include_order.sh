#!/usr/bin/env bash
# Fails on an #include that points up the room order of docs/architecture.md
# (core < backend < comm < model < parallel < optim < data < ckpt < train < plan <
# report < cli): a room may use the rooms below it, never one above.
# usage: tests/include_order.sh [SOURCE_ROOT]   (default: the checkout holding this script)
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
rooms=(core backend comm model parallel optim data ckpt train plan report cli)
declare -A level
for i in "${!rooms[@]}"; do level[${rooms[$i]}]=$i; done

bad=0
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
  echo "include_order: $rel:$line: $from includes $to, a room above it"
  bad=$((bad + 1))
done < <(grep -rnE '#include "shardlm/[a-z_]+/' "$root/src/shardlm" --include='*.hpp' --include='*.cpp' --include='*.cu' --include='*.cuh')

echo "include_order: $bad include(s) pointing up the room order"
[ "$bad" -eq 0 ]
