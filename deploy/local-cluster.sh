#!/usr/bin/env bash
# Start a memnode, a lockd, a tso and a tso-proxy as standalone processes of one cluster
# over the shm fabric, print their bootstrap addresses, and stop them all on Ctrl-C.
#
#   deploy/local-cluster.sh [CLUSTER] [ACCOUNTS]
#
# Build first: cargo build --release --workspace
set -euo pipefail
cluster=${1:-local}
accounts=${2:-100000}
bin=${BIN_DIR:-$(cd "$(dirname "$0")/.." && pwd)/target/release}
for b in memnode lockd tso tso-proxy; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b: run cargo build --release --workspace" >&2; exit 1; }
done
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rmdir "${RRPC_SHM_ROOT:-/dev/shm}/rrpc-$cluster" 2>/dev/null || true; }
trap cleanup EXIT INT TERM
start() { # name node args...
  local name=$1 node=$2; shift 2
  local out; out=$(mktemp)
  "$bin/$name" --cluster "$cluster" --node "$node" "$@" >"$out" &
  pids+=($!)
  for _ in $(seq 1 600); do
    if grep -q '^READY ' "$out"; then
      last_addr=$(grep '^READY ' "$out" | cut -d' ' -f2)
      echo "$name node $node: $last_addr"; rm -f "$out"; return
    fi
    kill -0 "${pids[-1]}" 2>/dev/null || { echo "$name exited" >&2; exit 1; }
    sleep 0.1
  done
  echo "$name not ready after 60 s" >&2; exit 1
}
start memnode 1 --smallbank-accounts "$accounts"
start lockd 2 --locks $((2 * accounts))
start tso 3
start tso-proxy 4 --oracle "$last_addr"
echo "cluster $cluster running; Ctrl-C stops it"
wait
