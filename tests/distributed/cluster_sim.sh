#!/usr/bin/env bash
# scripts/cluster-sim: a 2-host run over TCP (ranks in different network namespaces,
# link shaped with tc) ends on the same weights digest as the shared-memory run, and
# `down` - also after a failed `up` - leaves no namespace, link or qdisc behind.
# Skipped (exit 77, ctest's SKIP_RETURN_CODE) where namespaces cannot be created.
source "$(dirname "$0")/../cli/lib/common.sh" "$@"
SIM="$(cd "$(dirname "$0")/../.." && pwd)/scripts/cluster-sim"
NAME="shardlm-test-$$"
export SHARDLM_CLUSTER_SIM_STATE="$WORK/sim-state"
trap '"$SIM" down --name "$NAME" > /dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

probe="shardlm-probe-$$"
if ! command -v ip > /dev/null || ! command -v tc > /dev/null || ! ip netns add "$probe" 2> /dev/null; then
  echo "SKIP: cannot create network namespaces here (needs root and iproute2)"
  exit 77
fi
ip netns del "$probe"

root_state() { { ip -o link show; tc qdisc show; ip -o addr show; ip route show; } | sed 's/ *$//' | sort; }
namespaces() { ip netns list | awk '{print $1}' | grep "^$NAME-" || true; }
before="$(root_state)"

# A failed `up` (tc refuses) removes what it had made.
mkdir -p "$WORK/bin"
printf '#!/bin/sh\nexit 1\n' > "$WORK/bin/tc"
chmod +x "$WORK/bin/tc"
if PATH="$WORK/bin:$PATH" "$SIM" up --hosts 2 --rate 1gbit --name "$NAME" > "$WORK/failed-up.log" 2>&1; then
  fail "up succeeded with a tc that fails"
fi
[ -z "$(namespaces)" ] || fail "failed up left namespaces: $(namespaces)"
[ "$(root_state)" = "$before" ] || fail "failed up changed the root namespace"

"$SIM" up --hosts 2 --rate 1gbit --delay 0.2ms --name "$NAME" > "$WORK/up.log" 2>&1 \
  || { cat "$WORK/up.log"; fail "up failed"; }
[ "$(namespaces | wc -l)" -eq 3 ] || fail "expected 2 host namespaces and a bridge's, got: $(namespaces)"
ip netns exec "$NAME-h0" tc qdisc show dev sim0 | grep -Eq "tbf|netem" || fail "host 0's link is not shaped"
# Ranks land in different namespaces (different hosts to Open MPI, TCP between them).
"$SIM" run --name "$NAME" -n 2 -- sh -c 'readlink /proc/self/ns/net' > "$WORK/ns.txt" 2>&1 \
  || { cat "$WORK/ns.txt"; fail "run of a plain command failed"; }
[ "$(sort -u "$WORK/ns.txt" | grep -c '^net:')" -eq 2 ] || fail "ranks shared a namespace: $(cat "$WORK/ns.txt")"

make_byte_data
COMMON=("${TINY[@]}" --data "$WORK/data" --steps 4 --global-batch 8 --strategy zero3)
timeout 300 "$SIM" run --name "$NAME" -n 2 -- "$SHARDLM" train "${COMMON[@]}" --out "$WORK/sim" \
  > "$WORK/sim.log" 2>&1 || { tail -n 30 "$WORK/sim.log"; fail "training on the simulated cluster failed"; }
run_mpi 2 "$SHARDLM" train "${COMMON[@]}" --out "$WORK/shm" > "$WORK/shm.log" 2>&1 \
  || { tail -n 30 "$WORK/shm.log"; fail "shared-memory run failed"; }
a="$(digest_of "$WORK/sim")"; b="$(digest_of "$WORK/shm")"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "simulated cluster $a vs shared memory $b"
# It really crossed the link: traffic counted on host 1's interface.
rx="$(ip netns exec "$NAME-h1" cat /sys/class/net/sim0/statistics/rx_bytes)"
[ "$rx" -gt 100000 ] || fail "host 1 received only $rx bytes"

# bench --cluster, with the user's cluster up, brings up one of its own and leaves the
# user's alone, even where cluster-sim's default name is the user's (it used to fail on
# "already up" and then take the user's cluster down).
SHARDLM_CLUSTER_SIM_NAME="$NAME" timeout 600 "$SHARDLM" bench --model gpt2-tiny --n-layer 2 --n-embd 32 --n-head 2 --seq-len 32 --micro-batch 4 -n 2 --data "$WORK/data" --steps 2 --threads 1 --strategies ddp \
  --cluster 2x1gbit --delay 0ms --out "$WORK/bench" > "$WORK/bench.log" 2>&1 \
  || { tail -n 30 "$WORK/bench.log"; fail "bench --cluster with the user's cluster up failed"; }
[ "$(namespaces | wc -l)" -eq 3 ] || fail "bench --cluster touched the user's cluster: $(namespaces)"
"$SIM" status --name "$NAME" > /dev/null || fail "the user's cluster is not up after bench"
[ -z "$(ip netns list | awk '{print $1}' | grep '^shardlm-bench-' || true)" ] || fail "bench left its cluster up"

"$SIM" down --name "$NAME" || fail "down failed"
[ -z "$(namespaces)" ] || fail "down left namespaces: $(namespaces)"
[ "$(root_state)" = "$before" ] || fail "the root namespace's links, qdiscs, addresses or routes changed"
[ ! -e "$SHARDLM_CLUSTER_SIM_STATE/$NAME" ] || fail "down left its state directory"
out="$("$SIM" run --name "$NAME" -- true 2>&1)" && fail "run on a cluster that is down succeeded"
echo "$out" | grep -q "is not up" || fail "run on a cluster that is down said: $out"
echo "1 passed, 0 failed"
