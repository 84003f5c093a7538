#!/bin/bash
# Smoke test for the Soft-RoCE VM; runs INSIDE the guest:
#   deploy/vm/softroce-vm.sh -- "$PWD/deploy/vm/smoke.sh"     (from the checkout)
# Lists the devices, then runs ibv_rc_pingpong (RC send/recv over RoCE v2)
#   1. between two "hosts": server on $RXE_DEV_B, client on $RXE_DEV_A, across the
#      veth pair (checked: vethA's packet counters must grow by the traffic);
#   2. on the loopback device $RXE_LOOPBACK_DEV (client and server on one device).
# Exits 0 only if both pass. Also reports (without failing) a few facts about the
# guest: /dev/infiniband, dynamic linking of libibverbs, hugepages.
set -u
: "${RXE_DEV_A:?run me through softroce-vm.sh}"
fail=0
step() { echo; echo "=== smoke: $*"; }

step "ibv_devices"
ibv_devices || fail=1
step "rdma link show"
rdma link show || fail=1
step "/dev/infiniband"
ls -l /dev/infiniband/ || fail=1
step "ibv_devinfo -v -d $RXE_DEV_A (GID table)"
ibv_devinfo -v -d "$RXE_DEV_A" | grep -E 'hca_id|state|GID' || fail=1
step "ldd ibv_devices (host-built, dynamically linked to libibverbs)"
ldd "$(command -v ibv_devices)" | grep -E 'ibverbs|libc'

# Server/client pair of ibv_rc_pingpong; the server must be listening before the
# client connects (TCP on port PORT to exchange QP info), so retry the client.
pingpong() { # NAME SRV_DEV SRV_GID CLI_DEV CLI_GID SRV_IP PORT
    local name=$1 sdev=$2 sgid=$3 cdev=$4 cgid=$5 sip=$6 port=$7
    local opts=(-n 100 -s 4096)
    local srv_out=/tmp/pp-$name-server.log cli_out=/tmp/pp-$name-client.log
    step "ibv_rc_pingpong $name: server $sdev (gid $sgid) <- client $cdev (gid $cgid) -> $sip:$port"
    timeout 60 ibv_rc_pingpong -d "$sdev" -g "$sgid" -p "$port" "${opts[@]}" > "$srv_out" 2>&1 &
    local srv=$! crc=1 i
    for i in 1 2 3 4 5 6 7 8 9 10; do
        sleep 0.5
        timeout 60 ibv_rc_pingpong -d "$cdev" -g "$cgid" -p "$port" "${opts[@]}" "$sip" \
            > "$cli_out" 2>&1 && { crc=0; break; }
        grep -q "Couldn't connect" "$cli_out" || break   # a real failure, not "too early"
    done
    [ $crc = 0 ] || kill $srv 2>/dev/null
    wait $srv; local src=$?
    echo "--- server:"; cat "$srv_out"
    echo "--- client:"; cat "$cli_out"
    if [ $crc = 0 ] && [ $src = 0 ]; then echo "=== smoke: $name PASS"; return 0; fi
    echo "=== smoke: $name FAIL (server rc=$src client rc=$crc)"; return 1
}

step "routes between the two hosts (must use vethA / vethB, not lo)"
ip route get "$RXE_IP_B" from "$RXE_IP_A"
ip route get "$RXE_IP_A" from "$RXE_IP_B"
tx0=$(cat /sys/class/net/$RXE_NETDEV_A/statistics/tx_packets)
rx0=$(cat /sys/class/net/$RXE_NETDEV_A/statistics/rx_packets)
pingpong two-hosts "$RXE_DEV_B" "$RXE_GID_INDEX_B" "$RXE_DEV_A" "$RXE_GID_INDEX_A" \
    "$RXE_IP_B" 18515 || fail=1
tx=$(( $(cat /sys/class/net/$RXE_NETDEV_A/statistics/tx_packets) - tx0 ))
rx=$(( $(cat /sys/class/net/$RXE_NETDEV_A/statistics/rx_packets) - rx0 ))
echo "$RXE_NETDEV_A: +$tx packets sent, +$rx received during two-hosts"
# 100 iterations of send/recv, each way, plus acks: far more than 200 packets.
if [ $tx -lt 200 ] || [ $rx -lt 200 ]; then
    echo "=== smoke: two-hosts traffic did not cross the veth pair: FAIL"; fail=1
fi
pingpong loopback "$RXE_LOOPBACK_DEV" "$RXE_LOOPBACK_GID_INDEX" \
    "$RXE_LOOPBACK_DEV" "$RXE_LOOPBACK_GID_INDEX" "$RXE_LOOPBACK_IP" 18516 || fail=1

step "hugepages (informational)"
if echo 64 > /proc/sys/vm/nr_hugepages && mkdir -p /dev/hugepages &&
   { mountpoint -q /dev/hugepages || mount -t hugetlbfs none /dev/hugepages; }; then
    grep -E 'HugePages_(Total|Free)|Hugepagesize' /proc/meminfo
    if dd if=/dev/zero of=/dev/hugepages/probe bs=2M count=1 2>/dev/null ||
       fallocate -l 2M /dev/hugepages/probe; then
        echo "hugepages: usable (2 MiB file created on hugetlbfs)"
    else
        echo "hugepages: mounted, but could not create a file"
    fi
    rm -f /dev/hugepages/probe
else
    echo "hugepages: NOT usable"
fi

echo
if [ $fail = 0 ]; then echo "=== smoke: ALL PASS"; else echo "=== smoke: FAILED"; fi
exit $fail
