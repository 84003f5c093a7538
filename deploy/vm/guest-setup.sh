#!/bin/bash
# Runs inside the Soft-RoCE VM, in the chroot of the host's root (see init), as
# /run/softroce/ctl/setup.sh (softroce-vm.sh copies it into the results share, so
# editing this file needs no initramfs rebuild).
#
# 1. loads the RDMA modules explicitly (the module tree is the host's one, read over
#    9p; we don't rely on the kernel's on-demand loading),
# 2. builds the network and one Soft-RoCE (rxe) device per interface, all in the
#    root network namespace:
#      veth0 (192.168.100.1) <-> veth0p (unused)   rxe0 on veth0: the "loopback"
#                                                  device (both ends on one device)
#      vethA (192.168.200.1) <-> vethB (192.168.200.2)
#                                                  rxeA on vethA, rxeB on vethB: two
#                                                  "hosts", packets really cross
#                                                  the veth wire
#    Why not two network namespaces: rxe in this kernel (6.1) is not namespace-aware.
#    Its UDP/4791 sockets and its route lookups live in the initial namespace, so an
#    rxe device whose netdev sits in another namespace can neither route nor receive
#    (ibv_rc_pingpong fails with "local QP operation error"). Instead, policy routing
#    makes traffic between the two local addresses leave through vethA/vethB instead
#    of short-cutting through lo (see below).
# 3. runs the command (ctl/cmd) with the RXE_* variables set, records its exit
#    status in ctl/status, and returns it.
set -u
CTL=/run/softroce/ctl
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp     # the host root is read-only; /tmp is a tmpfs

log() { echo "[vm-setup] $*"; }
status() { echo "$1" > "$CTL/status"; sync; }
fail() { log "FATAL: $*"; echo "setup: $*" > "$CTL/setup-error"; status 125; exit 125; }

# The job: optional settings from the host (ctl/env, sourced), the command (ctl/cmd).
# shellcheck disable=SC1091
[ -f "$CTL/env" ] && . "$CTL/env"

# ---------------------------------------------------------------- modules
# Order matters: rdma_rxe computes the ICRC with the kernel's "crc32" crypto
# algorithm when a device is created; on this kernel crc32_generic is a module and
# nothing pulls it in as a dependency, so load it first. modprobe resolves the rest
# (ib_core, ib_uverbs, udp_tunnel, ip6_udp_tunnel, rdma_cm, iw_cm, ib_cm, configfs).
MODULES="crc32_generic rdma_rxe ib_uverbs veth rdma_ucm"
for m in $MODULES; do
    modprobe "$m" || fail "modprobe $m failed"
done
log "modules loaded: $MODULES"

# ---------------------------------------------------------------- network
ip link set lo up
# Loopback device (root namespace). veth needs its peer up to have carrier, and rxe
# reports the port ACTIVE only when the netdev is running.
ip link add veth0 type veth peer name veth0p || fail "veth0"
ip addr add 192.168.100.1/24 dev veth0
ip link set veth0p up
ip link set veth0 up

# Two "hosts" in one namespace. Normally traffic to a local address never leaves
# the box (the "local" routing table, consulted first, sends it through lo). So:
#  - the local table is moved behind two rules that send locally generated traffic
#    (iif lo) for .2 out of vethA and for .1 out of vethB;
#  - packets arriving on vethA/vethB from an address that is local must be accepted
#    (accept_local=1, rp_filter=0);
#  - neighbours are static, so ARP between two local addresses is never needed.
IP_A=192.168.200.1 IP_B=192.168.200.2
ip link add vethA type veth peer name vethB || fail "vethA/vethB"
for d in all default vethA vethB; do
    sysctl -qw net.ipv4.conf.$d.rp_filter=0
done
for d in vethA vethB; do
    sysctl -qw net.ipv4.conf.$d.accept_local=1
done
ip addr add $IP_A/32 dev vethA
ip addr add $IP_B/32 dev vethB
ip link set vethA up
ip link set vethB up
ip route add $IP_B dev vethA src $IP_A table 200
ip route add $IP_A dev vethB src $IP_B table 201
ip rule add pref 10 iif lo to $IP_B lookup 200
ip rule add pref 11 iif lo to $IP_A lookup 201
ip rule add pref 100 lookup local
ip rule del pref 0 lookup local
ip neigh replace $IP_B lladdr "$(cat /sys/class/net/vethB/address)" dev vethA nud permanent
ip neigh replace $IP_A lladdr "$(cat /sys/class/net/vethA/address)" dev vethB nud permanent

# One rxe device per netdev.
rdma link add rxe0 type rxe netdev veth0 || fail "rdma link add rxe0"
rdma link add rxeA type rxe netdev vethA || fail "rdma link add rxeA"
rdma link add rxeB type rxe netdev vethB || fail "rdma link add rxeB"

# GID index of the RoCE v2 GID built from an IPv4 address (::ffff:a.b.c.d). GIDs
# appear asynchronously after the address/device exist, so poll a little.
gid_index() { # DEV IPV4
    local dev=$1 ip=$2 want i g t n
    want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' ${ip//./ })
    for n in $(seq 1 100); do
        for g in /sys/class/infiniband/"$dev"/ports/1/gids/*; do
            i=${g##*/}
            [ "$(cat "$g" 2>/dev/null)" = "$want" ] || continue
            t=$(cat /sys/class/infiniband/"$dev"/ports/1/gid_attrs/types/"$i" 2>/dev/null)
            [ "$t" = "RoCE v2" ] && { echo "$i"; return 0; }
        done
        sleep 0.1
    done
    return 1
}
port_active() { # DEV
    local n
    for n in $(seq 1 100); do
        grep -q ACTIVE /sys/class/infiniband/"$1"/ports/1/state 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}
for d in rxe0 rxeA rxeB; do port_active $d || fail "$d port never became ACTIVE"; done
G0=$(gid_index rxe0 192.168.100.1) || fail "no RoCE v2 GID on rxe0"
GA=$(gid_index rxeA $IP_A) || fail "no RoCE v2 GID on rxeA"
GB=$(gid_index rxeB $IP_B) || fail "no RoCE v2 GID on rxeB"

# ---------------------------------------------------------------- hugepages (opt-in)
if [ "${SOFTROCE_HUGEPAGES:-0}" -gt 0 ]; then
    echo "$SOFTROCE_HUGEPAGES" > /proc/sys/vm/nr_hugepages
    mount -t hugetlbfs none /dev/hugepages || log "warning: cannot mount hugetlbfs"
    log "hugepages: $(cat /proc/sys/vm/nr_hugepages) reserved, hugetlbfs on /dev/hugepages"
fi

# ---------------------------------------------------------------- the command
export SOFTROCE_VM=1
export RXE_LOOPBACK_DEV=rxe0 RXE_LOOPBACK_NETDEV=veth0 RXE_LOOPBACK_IP=192.168.100.1
export RXE_LOOPBACK_GID_INDEX=$G0
export RXE_DEV_A=rxeA RXE_NETDEV_A=vethA RXE_IP_A=$IP_A RXE_GID_INDEX_A=$GA
export RXE_DEV_B=rxeB RXE_NETDEV_B=vethB RXE_IP_B=$IP_B RXE_GID_INDEX_B=$GB
export VM_OUT_DIR=/run/softroce/out
log "ready: loopback $RXE_LOOPBACK_DEV ($RXE_LOOPBACK_IP, gid $G0);" \
    "$RXE_DEV_A ($RXE_IP_A, gid $GA) <-> $RXE_DEV_B ($RXE_IP_B, gid $GB)"

[ -f "$CTL/cmd" ] || fail "no ctl/cmd"
# ctl/cmd defines the array CMD (written with printf %q by the host).
# shellcheck disable=SC1091
. "$CTL/cmd"
cd "${SOFTROCE_CWD:-/}" 2>/dev/null || cd /
log "exec: ${CMD[*]}"
"${CMD[@]}"
rc=$?
log "command exited with status $rc"
status "$rc"
exit "$rc"
