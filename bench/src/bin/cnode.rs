//! `cnode`: one compute node's coordinators (threads x coroutines) as a process of its
//! own, against a cluster `txn-bench --cnodes N` started; streams its counters and
//! history to its parent as JSON lines on stdout (see [`bench::cnode`] and [`bench::txnbench::cnodes`]). Exits 0 after a
//! `stop` line on stdin or SIGTERM, 1 on an error.

fn main() {
    bench::bench_main::<bench::cnode::CnodeArgs>("cnode", &[], bench::txnbench::cnodes::main);
}
