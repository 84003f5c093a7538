#!/usr/bin/env bash
# Run a command inside a throw-away qemu VM that boots Debian's kernel with Soft-RoCE
# (rdma_rxe), so libibverbs code can be tested against the real kernel RDMA stack on
# a host without RDMA. See README.md beside this file.
#
# usage: deploy/vm/softroce-vm.sh [OPTIONS] -- COMMAND [ARGS...]
#   COMMAND is an absolute path on the host; the guest sees the host's root read-only
#   at the same paths. Exits with COMMAND's exit status.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"

usage() {
    cat <<'EOF'
usage: softroce-vm.sh [OPTIONS] -- COMMAND [ARGS...]
  --timeout SECONDS   kill the VM after this long and fail (default 900)
  --mem SIZE          guest memory, qemu syntax (default 2G)
  --smp N             guest CPUs (default 2)
  --hugepages N       reserve N 2 MiB hugepages in the guest and mount hugetlbfs on
                      /dev/hugepages (default 0: none)
  --out DIR           host directory the command can write to as $VM_OUT_DIR
                      (default: a temporary directory, deleted afterwards)
  --env NAME=VALUE    set a variable for the command (repeatable); RUST_LOG,
                      RUST_BACKTRACE, RUST_TEST_THREADS are passed through if set
  --verbose           show all kernel messages (default: warnings and worse only)
  --no-install        do not install missing Debian packages, fail instead
EOF
}

TIMEOUT=900 MEM=2G SMP=2 HUGEPAGES=0 OUT_DIR="" VERBOSE=0 INSTALL=1
EXTRA_ENV=()
while [ $# -gt 0 ]; do
    case "$1" in
        --timeout) TIMEOUT=$2; shift 2 ;;
        --mem) MEM=$2; shift 2 ;;
        --smp) SMP=$2; shift 2 ;;
        --hugepages) HUGEPAGES=$2; shift 2 ;;
        --out) OUT_DIR=$2; shift 2 ;;
        --env) EXTRA_ENV+=("$2"); shift 2 ;;
        --verbose) VERBOSE=1; shift ;;
        --no-install) INSTALL=0; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; break ;;
        *) echo "softroce-vm: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in /*) ;; *) echo "softroce-vm: COMMAND must be an absolute path: $1" >&2; exit 2 ;; esac
[[ $TIMEOUT =~ ^[0-9]+$ ]] || { echo "softroce-vm: bad --timeout '$TIMEOUT'" >&2; exit 2; }
[[ $HUGEPAGES =~ ^[0-9]+$ ]] || { echo "softroce-vm: bad --hugepages '$HUGEPAGES'" >&2; exit 2; }
# The guest masks these host paths with fresh tmpfs (the host root is read-only).
case "$1" in
    /tmp/*|/var/tmp/*|/run/*|/dev/*|/proc/*|/sys/*)
        echo "softroce-vm: $1 is under a path the guest replaces (tmpfs or kernel fs);" \
             "put the command elsewhere" >&2; exit 2 ;;
esac

say() { echo "softroce-vm: $*" >&2; }
[ "$(id -u)" = 0 ] || { say "must run as root (apt-get, 9p passthrough of /)"; exit 2; }

# ------------------------------------------------------------------ packages
PKGS=(linux-image-amd64 qemu-system-x86 rdma-core ibverbs-providers libibverbs-dev
      ibverbs-utils perftest busybox-static iproute2 kmod)
missing=()
for p in "${PKGS[@]}"; do
    dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$INSTALL" = 1 ] || { say "missing packages: ${missing[*]}"; exit 2; }
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Update the lists only if a first attempt fails (they may be absent or stale).
    apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null >&2 \
        || { apt-get update -q </dev/null >&2 &&
             apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null >&2; }
fi

# ------------------------------------------------------------------ kernel
# The version linux-image-amd64 points at (not the host's running kernel).
KVER=${SOFTROCE_KERNEL:-$(dpkg -s linux-image-amd64 | sed -n 's/^Depends:.*linux-image-\([^ ,]*\).*/\1/p')}
if [ -z "$KVER" ] || [ ! -f "/boot/vmlinuz-$KVER" ]; then
    # Fall back to the newest /boot/vmlinuz-* that has a module tree.
    KVER=""
    for k in $(ls /boot/vmlinuz-* 2>/dev/null | sed 's|^/boot/vmlinuz-||' | sort -V); do
        [ -d "/lib/modules/$k" ] && KVER=$k
    done
fi
[ -n "$KVER" ] && [ -f "/boot/vmlinuz-$KVER" ] && [ -d "/lib/modules/$KVER" ] \
    || { say "no usable kernel in /boot + /lib/modules"; exit 2; }
KERNEL=/boot/vmlinuz-$KVER
MODDIR=/lib/modules/$KVER

# ------------------------------------------------------------------ initramfs
# Cached per (kernel version, this script, init). Rebuilt when any of them changes.
CACHE=${SOFTROCE_CACHE:-/var/tmp/rrpc-vm}
KEY=$( { echo "$KVER"; cat "$SELF" "$HERE/init"; } | sha256sum | cut -c1-16)
INITRD=$CACHE/initramfs-$KVER-$KEY.cpio.gz

# Modules the initramfs needs to reach the host root, if they are modular.
INITRD_MODULES=(virtio_pci 9pnet_virtio 9p)

# Print, in load order (dependencies first), the modules.dep paths of the modules
# named in $@ and everything they depend on. Names not found are assumed built in.
resolve_modules() {
    local -A path_of=() deps_of=() seen=()
    local line mpath mdeps name
    while IFS= read -r line; do
        mpath=${line%%:*}; mdeps=${line#*:}
        name=${mpath##*/}; name=${name%%.ko*}; name=${name//-/_}
        path_of[$name]=$mpath; deps_of[$mpath]=$mdeps
    done < "$MODDIR/modules.dep"
    visit() { # modules.dep path
        local p=$1 d
        [ -n "${seen[$p]:-}" ] && return 0
        seen[$p]=1
        # The dependency list is complete (transitive); visiting each keeps the order
        # right whatever order it is written in.
        for d in ${deps_of[$p]}; do visit "$d"; done
        echo "$p"
    }
    for name in "$@"; do
        name=${name//-/_}
        if [ -n "${path_of[$name]:-}" ]; then
            visit "${path_of[$name]}"
        elif ! grep -q "/${name//_/[_-]}\.ko" "$MODDIR/modules.builtin" 2>/dev/null; then
            say "warning: module $name neither in modules.dep nor built in"
        fi
    done
}

build_initrd() {
    local stage m base
    stage=$(mktemp -d "$CACHE/stage.XXXXXX")
    mkdir -p "$stage"/{bin,dev,proc,sys,modules,host,results}
    cp /bin/busybox "$stage/bin/busybox"
    cp "$HERE/init" "$stage/init"
    chmod 755 "$stage/init"
    mknod -m 600 "$stage/dev/console" c 5 1
    mknod -m 666 "$stage/dev/null" c 1 3
    : > "$stage/modules/load-order"
    for m in $(resolve_modules "${INITRD_MODULES[@]}"); do
        base=${m##*/}
        # busybox insmod cannot read compressed modules: store them decompressed.
        case "$base" in
            *.ko.xz)  xz -dc "$MODDIR/$m" > "$stage/modules/${base%.xz}"; base=${base%.xz} ;;
            *.ko.zst) zstd -qdc "$MODDIR/$m" > "$stage/modules/${base%.zst}"; base=${base%.zst} ;;
            *.ko.gz)  gzip -dc "$MODDIR/$m" > "$stage/modules/${base%.gz}"; base=${base%.gz} ;;
            *)        cp "$MODDIR/$m" "$stage/modules/$base" ;;
        esac
        echo "$base" >> "$stage/modules/load-order"
    done
    say "initramfs modules: $(tr '\n' ' ' < "$stage/modules/load-order")"
    (cd "$stage" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) > "$INITRD.tmp"
    mv "$INITRD.tmp" "$INITRD"
    rm -rf "$stage"
}

mkdir -p "$CACHE"
exec 9> "$CACHE/.lock"
flock 9
if [ ! -s "$INITRD" ]; then
    say "building initramfs for $KVER -> $INITRD"
    rm -f "$CACHE"/initramfs-*.cpio.gz
    build_initrd
fi
flock -u 9

# ------------------------------------------------------------------ job files
# The writable share: ctl/ (job in, status out) and out/ (the command's $VM_OUT_DIR).
SHARE=$(mktemp -d /var/tmp/softroce-run.XXXXXX)
cleanup() {
    # qemu deletes its pidfile when it exits normally; kill it if it is still there.
    [ -s "$SHARE/qemu.pid" ] && kill -KILL "$(cat "$SHARE/qemu.pid")" 2>/dev/null || true
    if [ -n "$OUT_DIR" ]; then
        mkdir -p "$OUT_DIR" && cp -a "$SHARE/out/." "$OUT_DIR/" 2>/dev/null || true
    fi
    rm -rf "$SHARE"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$SHARE/ctl" "$SHARE/out"
chmod 755 "$SHARE"; chmod 777 "$SHARE/out"
cp "$HERE/guest-setup.sh" "$SHARE/ctl/setup.sh"
{
    printf 'CMD=('; printf '%q ' "$@"; printf ')\n'
} > "$SHARE/ctl/cmd"
{
    printf 'export SOFTROCE_HUGEPAGES=%q\n' "$HUGEPAGES"
    # The guest starts the command in the same directory, unless it is one the
    # guest masks with an empty tmpfs (then it starts in /).
    case "$PWD" in
        /tmp|/tmp/*|/var/tmp|/var/tmp/*|/run|/run/*) ;;
        *) printf 'export SOFTROCE_CWD=%q\n' "$PWD" ;;
    esac
    for v in RUST_LOG RUST_BACKTRACE RUST_TEST_THREADS; do
        [ -n "${!v:-}" ] && printf 'export %s=%q\n' "$v" "${!v}"
    done
    for kv in "${EXTRA_ENV[@]}"; do
        [[ $kv == *=* ]] || { say "--env wants NAME=VALUE: $kv"; exit 2; }
        printf 'export %s=%q\n' "${kv%%=*}" "${kv#*=}"
    done
} > "$SHARE/ctl/env"

# ------------------------------------------------------------------ boot
# TCG, never KVM: nested KVM hung at boot on these machines; TCG boots in seconds.
# No network device at all (-nic none): the guest's only networks are its own veths.
# -no-reboot + panic=-1: any kernel panic (including init dying) stops qemu.
LOGLEVEL=4; [ "$VERBOSE" = 1 ] && LOGLEVEL=7
APPEND="console=ttyS0 panic=-1 loglevel=$LOGLEVEL mitigations=off tsc=reliable"
QEMU=(qemu-system-x86_64
    -accel tcg,thread=multi -cpu max -smp "$SMP" -m "$MEM"
    -display none -monitor none -serial stdio -pidfile "$SHARE/qemu.pid"
    -no-reboot -nic none -nodefaults -vga none
    -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND"
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap
    -virtfs "local,path=$SHARE,mount_tag=results,security_model=none,multidevs=remap"
)
say "booting $KVER under qemu/TCG (timeout ${TIMEOUT}s): $*"
START=$(date +%s)
# stdin from /dev/null: works with no TTY and no stdin (CI). (-display none +
# -serial stdio is -nographic without the monitor multiplexed on stdin.) The serial
# line writes CRLF; strip the CRs, unbuffered so the output streams.
( "${QEMU[@]}" </dev/null 2>&1 | sed -u 's/\r//g' ) &
RUNNER=$!
# Watchdog: after TIMEOUT seconds kill qemu (by its pidfile), which ends the runner.
(
    sleep "$TIMEOUT" & SLEEPER=$!
    trap 'kill $SLEEPER; exit 0' TERM
    wait $SLEEPER
    touch "$SHARE/timed-out"
    [ -s "$SHARE/qemu.pid" ] && kill -KILL "$(cat "$SHARE/qemu.pid")"
) </dev/null >/dev/null 2>&1 &
WATCHDOG=$!
set +e
{ wait "$RUNNER"; } 2>/dev/null   # no "Killed" job notice when the watchdog fired
QEMU_RC=$?
set -e
kill "$WATCHDOG" 2>/dev/null || true
wait "$WATCHDOG" 2>/dev/null || true
ELAPSED=$(( $(date +%s) - START ))

if [ -e "$SHARE/timed-out" ]; then
    say "FAILED: the VM timed out after ${TIMEOUT}s and was killed (command: $*)"
    exit 124
fi
for f in init-error setup-error; do
    [ -s "$SHARE/ctl/$f" ] && say "guest reported: $(cat "$SHARE/ctl/$f")"
done
if [ ! -s "$SHARE/ctl/status" ]; then
    say "FAILED: the guest never reported the command's exit status" \
        "(qemu exit code $QEMU_RC after ${ELAPSED}s; see the console output above)"
    exit 125
fi
RC=$(cat "$SHARE/ctl/status")
[[ $RC =~ ^[0-9]+$ ]] || { say "FAILED: bad status '$RC' from the guest"; exit 125; }
say "command exited with status $RC (VM wall time ${ELAPSED}s)"
exit "$RC"
