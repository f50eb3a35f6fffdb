#!/usr/bin/env bash
# Renders a `shardlm report` / `shardlm bench` HTML file to PNG with headless Chromium,
# to look at it (docs and bench use; not run by the tests).
#   bench/render_report.sh REPORT.html OUT.png [WIDTHxHEIGHT]
# Needs Debian's chromium (`apt-get install -y chromium`). The page is self-contained,
# so Chromium fetches nothing.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 REPORT.html OUT.png [WIDTHxHEIGHT]" >&2; exit 2; }
html="$(realpath "$1")"
out="$(realpath -m "$2")"
size="${3:-1400x5000}"
browser="$(command -v chromium || command -v chromium-browser || true)"
[ -n "$browser" ] || { echo "error: chromium not found (apt-get install -y chromium)" >&2; exit 1; }
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --user-data-dir="$profile" --window-size="${size/x/,}" --screenshot="$out" "file://$html" \
  > /dev/null 2>&1
[ -s "$out" ] || { echo "error: chromium wrote no screenshot to $out" >&2; exit 1; }
echo "rendered $html -> $out ($size)"
