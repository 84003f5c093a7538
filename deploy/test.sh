#!/usr/bin/env bash
# The project's whole test run (the README's test command; CI runs it through .ci/run;
# the book's Testing chapter, docs/src/testing.md, describes each step).
#
# 1. Installs what a fresh Debian machine lacks to build the verbs backend (cmake,
#    libclang-dev), to load libibverbs (libibverbs1, ibverbs-providers), to build the etcd
#    client of the member crate (protobuf-compiler: protoc, and libprotobuf-dev: the
#    well-known .proto files it imports) and to run its tests against a
#    real etcd (etcd-server: each test starts its own on loopback), and to run the
#    launcher's ssh path through a real OpenSSH server (openssh-server, openssh-client:
#    the test starts its own on a loopback port, with keys of its own).
# 2. Checks the formatting (cargo fmt --check), the lints (cargo clippy, warnings denied)
#    and the docs (cargo doc, warnings denied: no broken links); builds the book
#    (mdbook build docs; mdbook is installed with cargo install if missing) and checks
#    that every relative link of README.md and docs/src points to an existing file and
#    heading (deploy/linkcheck.sh); then builds everything with the verbs backend and the
#    etcd client compiled in and runs all tests on the shm fabric (cargo test --workspace);
#    RRPC_REQUIRE_ETCD=1 makes the member tests fail, not skip, when etcd is missing, and
#    RRPC_REQUIRE_SSH=1 the real-ssh launcher test when OpenSSH is.
# 3. Runs rrpc's echo example as a user would (server and client processes), then the
#    fabric conformance suite and the RPC, modes, straws, shm-cluster and async-handler
#    suites again on shm under the cx5 timing model (RRPC_MODEL=cx5).
# 4. Runs the loom models of the Rocket channel (rrpc/src/channel_loom.rs, compiled only
#    with the rrpc feature loom-models), in release (loom is slow unoptimized); the loom
#    model of the bare ring (rrpc/tests/loom_rocket.rs) runs in step 2.
# 5. Runs the Rocket ring's, the channel's, the wire format's and the arena's unit tests under Miri
#    (nightly; installed with rustup if missing), which checks the ring's unsafe memory
#    accesses for undefined behaviour. RRPC_SKIP_MIRI=1 skips this.
# 6. Runs the fabric conformance suite and the RPC (calls, modes, straws, async
#    handlers), lock (Takeout service, release of a killed node's locks, embedded
#    service), TSO (oracle, proxies, multi-process histories, the oracle SIGKILLed and
#    restarted, alone and behind a proxy) and memnode integration tests again on the
#    verbs backend, and one short `txn-bench` run per workload (SmallBank and YCSB A
#    with --protocol all, TATP with scythe, TPC-C with occ-cas; each audited and
#    checked; the workload suites' other runs are shm-only), and a coordinator process
#    SIGKILLed mid-run and recovered (SmallBank, --protocol all), the lock service
#    SIGKILLed and restarted under Scythe, and a memory node SIGKILLed and failed over
#    to its backup (SmallBank, two copies, --protocol all), and RCC's protocols (both
#    variants on SmallBank, YCSB and TPC-C New-Order; doorbell batching; the timestamp
#    oracle), against the Linux kernel's RDMA stack (Soft-RoCE), inside a qemu VM
#    (deploy/vm/softroce-vm.sh). RRPC_SKIP_VM=1 skips this.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"

need=()
for p in cmake libclang-dev libibverbs1 ibverbs-providers protobuf-compiler libprotobuf-dev etcd-server openssh-server openssh-client; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
# sshd's privilege separation directory (a boot-time tmpfs entry elsewhere), for the
# real-ssh launcher test's own sshd.
[ -d /run/sshd ] || $sudo mkdir -p /run/sshd

# The VM sees the host's filesystem except these fresh tmpfs mounts; test executables
# (and the binaries they start) must live elsewhere.
case "$PWD" in
  /tmp/* | /var/tmp/* | /run/* | /dev/shm/*)
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${HOME:-/root}/.cache/rrpc-target}"
    case "$CARGO_TARGET_DIR" in /tmp/* | /var/tmp/* | /run/* | /dev/shm/*)
      echo "CARGO_TARGET_DIR=$CARGO_TARGET_DIR is hidden from the test VM; set it elsewhere" >&2; exit 2;;
    esac;;
esac

# The same features on every workspace-wide line below: etcd-client turns on tonic features
# that bench leaves off, so a line without member/etcd would rebuild tonic and its dependents.
features=(--features rrpc/verbs --features member/etcd)

# Incremental caches roughly double the target directory and a fresh clone gains nothing
# from them; the whole run must fit a CI machine's disk.
export CARGO_INCREMENTAL=0
target_dir="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target_dir"
echo "== disk: $(df -h --output=avail "$target_dir" | tail -1 | tr -d ' ') free for $target_dir"

echo "== hygiene: cargo fmt --check, cargo clippy -D warnings, cargo doc -D warnings"
missing=()
for c in rustfmt clippy; do
  rustup component list --installed 2>/dev/null | grep "^$c" >/dev/null || missing+=("$c")
done
if [ ${#missing[@]} -gt 0 ] && command -v rustup >/dev/null; then
  rustup component add "${missing[@]}"
fi
cargo fmt --all --check
cargo clippy --workspace --all-targets "${features[@]}" -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace "${features[@]}"

# The book (docs/): mdbook from crates.io when missing (Debian has no package), built with
# its search and without its server and file watcher, which the build does not need.
echo "== the book: mdbook build docs; relative links of README.md and docs/src"
export PATH="$PATH:${CARGO_HOME:-${HOME:-/root}/.cargo}/bin"
if ! command -v mdbook >/dev/null; then
  echo "== installing mdbook (cargo install, about two minutes)"
  t0=$SECONDS
  cargo install mdbook --version 0.5.4 --locked --no-default-features --features search
  echo "== mdbook installed: $((SECONDS - t0)) s wall"
fi
mdbook build docs
deploy/linkcheck.sh

echo "== cargo test --workspace (shm fabric; verbs backend and etcd client compiled in)"
export RRPC_REQUIRE_ETCD=1 RRPC_REQUIRE_SSH=1
cargo test --workspace "${features[@]}"

# The examples as a user runs them: the echo server and its client as two processes.
echo "== the rrpc echo example: server and client processes (shm)"
cargo build -p rrpc --examples --features rrpc/verbs
exdir="${CARGO_TARGET_DIR:-target}/debug/examples"
echo_log=$(mktemp)
RRPC_FABRIC=shm "$exdir/echo_server" "ci-echo-$$" 127.0.0.1:0 >"$echo_log" 2>&1 &
echo_pid=$!
echo_addr=""
for _ in $(seq 1 100); do
  echo_addr=$(sed -n 's/^echo server: .* on \([0-9.]*:[0-9]*\);.*/\1/p' "$echo_log")
  [ -n "$echo_addr" ] && break
  sleep 0.1
done
if [ -z "$echo_addr" ]; then
  cat "$echo_log" >&2; kill "$echo_pid" 2>/dev/null; echo "the echo server did not start" >&2; exit 1
fi
echo_rc=0
RRPC_FABRIC=shm timeout 120 "$exdir/echo_client" "ci-echo-$$" "$echo_addr" || echo_rc=$?
kill -INT "$echo_pid"; wait "$echo_pid" || true
rm -f "$echo_log"
if [ "$echo_rc" -ne 0 ]; then echo "the echo client failed ($echo_rc)" >&2; exit 1; fi

# Completions that arrive late exercise paths that instant completion never does.
echo "== timing model cx5: the fabric conformance, RPC, modes, straws, shm-cluster and async-handler suites again"
RRPC_MODEL=cx5 cargo test --workspace "${features[@]}" \
  --test fabric_conformance --test rpc --test modes --test straws --test shm_cluster --test async_handlers

# Release profile: builds rrpc's dependencies once more, optimized.
echo "== loom models of the Rocket channel: credit return across wraps, replay"
t0=$SECONDS
cargo test -p rrpc --lib --release --features loom-models channel_loom
echo "== loom models: $((SECONDS - t0)) s wall"

if [ "${RRPC_SKIP_MIRI:-0}" = 1 ]; then
  echo "== RRPC_SKIP_MIRI=1: Miri run skipped"
else
  echo "== Miri: the Rocket ring, channel, wire and arena unit tests"
  if ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "== installing the nightly toolchain's miri and rust-src components"
    rustup toolchain install nightly --profile minimal --component miri,rust-src
  fi
  t0=$SECONDS
  # Miri builds into its own directory (target/miri). The filters are module paths.
  cargo +nightly miri test -p rrpc --lib -- rocket:: channel:: wire:: arena::
  echo "== Miri: $((SECONDS - t0)) s wall"
fi

if [ "${RRPC_SKIP_VM:-0}" = 1 ]; then
  echo "== RRPC_SKIP_VM=1: verbs tests in the Soft-RoCE VM skipped"
  exit 0
fi
echo "== verbs backend: integration tests inside the Soft-RoCE VM"
# The integration-test targets (kind "test") among the build's executables.
mapfile -t exes < <(cargo test --workspace "${features[@]}" --no-run --message-format=json 2>/dev/null |
  grep '"kind":\["test"\]' | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 |
  grep -E '/deps/(fabric_conformance|rpc|modes|straws|async_handlers|takeout_service|release_node|embedded|oracle|proxy|proxy_procs|history_procs|restart|proxy_restart|memnode|smallbank|ycsb|tatp|tpcc|cnodes|lockd_restart|failover|microbench_remote|hosts|rcc_cluster|rcc_suite|index_faults)-[0-9a-f]+$')
# 27 executables; the VM runs 28 suites (the conformance suite twice: one device, two;
# the microbenchmarks and txn-bench --hosts across the two devices only).
if [ ${#exes[@]} -ne 27 ]; then
  echo "expected 27 integration test executables, found ${#exes[@]}: ${exes[*]}" >&2
  exit 1
fi
# The guest runs the script from the target directory, which it can see even when the
# checkout itself lives under /tmp.
runner="$(dirname "$(dirname "$(dirname "${exes[0]}")")")/verbs-tests.sh"
cp deploy/vm/verbs-tests.sh "$runner"
t0=$SECONDS
deploy/vm/softroce-vm.sh --timeout "${RRPC_VM_TIMEOUT:-1500}" -- "$runner" "${exes[@]}"
echo "== Soft-RoCE VM run: $((SECONDS - t0)) s wall"
echo "== disk: target directory $(du -sh "$target_dir" 2>/dev/null | cut -f1), $(df -h --output=avail "$target_dir" | tail -1 | tr -d ' ') free"
