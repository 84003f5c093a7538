#!/usr/bin/env bash
# Runs INSIDE the Soft-RoCE VM (started by deploy/vm/softroce-vm.sh): the project's test
# executables, built on the host with `--features rrpc/verbs`, on the verbs backend.
#
#   verbs-tests.sh TEST_EXECUTABLE...
#
# Every executable runs on the loopback device (rxe0). The fabric conformance suite also
# runs across two "hosts": this process on rxeA, its peer process on rxeB, with the
# traffic crossing a veth pair (see docs/src/testing.md for why not two namespaces).
set -u
export RRPC_FABRIC=verbs
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}
failed=()
ran=0
run() { # label command...
  local label=$1; shift
  echo "=== verbs: $label"
  local t0=$SECONDS
  if "$@"; then
    echo "=== verbs: $label: ok ($((SECONDS - t0)) s)"
  else
    echo "=== verbs: $label: FAILED ($((SECONDS - t0)) s)"
    failed+=("$label")
  fi
  ran=$((ran + 1))
}
ibv_devices || true
for exe in "$@"; do
  name=$(basename "$exe"); name=${name%-*}
  only=()
  # The workloads on verbs, one short `txn-bench` run each (every check of the run);
  # their suites' other runs stay on shm, to keep the VM's time small. SmallBank and
  # YCSB A and E run `--protocol all` (occ-cas, scythe, mvcc and lotus, each on a fresh cluster);
  # TATP runs scythe (the lock service on verbs too), TPC-C occ-cas.
  case "$name" in
    smallbank) only=(--exact all_protocols_pass_every_check_at_theta_0_99) ;;
    ycsb) only=(--exact ycsb_a_passes_every_check_with_every_protocol
      ycsb_e_scans_through_the_range_index_and_passes_every_check) ;;
    tatp) only=(--exact tatp_on_scythe) ;;
    tpcc) only=(--exact tpcc_on_occ_cas) ;;
    # The planted-bug and liveness tests are timing-dependent: shm only.
    rcc_cluster) only=(--exact every_protocol_and_variant_passes_its_checks
      one_sided_lock_and_read_shares_doorbells waitdie_and_mvcc_run_on_the_timestamp_oracle
      every_protocol_and_variant_passes_the_new_order_check) ;;
    # RCC's nodes as rcc-node processes, every protocol in both variants, each process
    # its own verbs context on the device (the suite's other runs stay on shm).
    rcc_suite) only=(--exact every_protocol_runs_with_its_nodes_as_processes) ;;
    # A coordinator process SIGKILLed mid-run on verbs: its memory nodes and lockd fence
    # its QPs, the survivor recovers it (logs, sweep, tickets), its next incarnation
    # starts; money exact, nothing held (etcd from the host's filesystem, on loopback).
    cnodes) only=(--exact every_protocol_recovers_a_killed_cnode_on_smallbank) ;;
    # The lock service SIGKILLed and restarted under Scythe (coordinators reconnect over
    # verbs, the new epoch's grace). (The QP-error suite, transport_faults, stays on shm:
    # on the VM's emulated CPU a debug build commits a few hundred transactions a second
    # and its injections met no WR in flight.)
    lockd_restart) only=(--exact scythe_survives_a_lockd_restart_inside_txn_bench) ;;
    # A memory node SIGKILLed mid-run and failed over to its backup on verbs (the
    # coordinators' QPs to it break, the drain, the promotion, the new view): money
    # exact, nothing committed lost, the surviving copies identical. Then the same node
    # restarted empty and re-replicated (the coordinators reconnect to the new process,
    # each partition copied with RDMA READs and WRITEs): every copy identical again;
    # and a spare memory node filled in the dead one's place.
    failover) only=(--exact a_killed_primary_loses_no_committed_money
      a_restarted_memnode_is_re_replicated_and_every_copy_matches
      a_spare_memnode_takes_the_dead_nodes_place_and_every_copy_matches) ;;
    # An rTX client process SIGKILLed mid-workload on verbs: the other process repairs
    # around it, its clients restart, every acknowledged key is in the B-link tree.
    index_faults) only=(--exact a_killed_client_process_is_repaired_around_and_every_acknowledged_key_is_found) ;;
  esac
  # txn-bench --hosts: the services on rxeA (started through the launcher's ssh path),
  # the coordinators on rxeB, every protocol checked, the traffic on the veth pair.
  if [ "$name" = hosts ]; then
    run "two hosts" env RRPC_TEST_TWO_HOSTS="$RXE_DEV_A,$RXE_IP_A,$RXE_DEV_B,$RXE_IP_B,$RXE_NETDEV_A" \
      "$exe" --test-threads=1 --exact two_hosts_run_every_protocol_across_the_veth_pair --nocapture
    continue
  fi
  # The microbenchmarks' --serve side on rxeB, their --connect side on rxeA, with
  # perftest's ib_write_lat between the same two devices (rrpc-bench peers --perftest).
  if [ "$name" = microbench_remote ]; then
    run "$name across $RXE_DEV_B (--serve) <- $RXE_DEV_A (--connect)" env RRPC_RDMA_DEVICE="$RXE_DEV_A" \
      RRPC_TEST_PEER_DEVICE="$RXE_DEV_B" RRPC_TEST_PEER_LISTEN="$RXE_IP_B:0" "$exe" --test-threads=1 --nocapture
    continue
  fi
  # Failover under mvcc alone here: with replicas, Scythe commits a few transactions a
  # second under the VM's emulated CPUs, too few for every type in a short run.
  run "$name on $RXE_LOOPBACK_DEV" env RRPC_RDMA_DEVICE="$RXE_LOOPBACK_DEV" RRPC_TEST_FAILOVER_PROTOCOL=mvcc \
    "$exe" --test-threads=1 ${only[@]+"${only[@]}"}
  if [ "$name" = fabric_conformance ]; then
    run "$name across $RXE_DEV_A -> $RXE_DEV_B" env RRPC_RDMA_DEVICE="$RXE_DEV_A" \
      RRPC_TEST_PEER_DEVICE="$RXE_DEV_B" RRPC_TEST_PEER_LISTEN="$RXE_IP_B:0" "$exe" --test-threads=1
  fi
done
echo "=== verbs: $ran suites run, ${#failed[@]} failed"
for f in "${failed[@]}"; do echo "=== verbs: FAILED: $f"; done
[ ${#failed[@]} -eq 0 ]
