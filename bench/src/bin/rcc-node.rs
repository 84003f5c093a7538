//! `rcc-node`: one node of RCC's symmetric cluster (its partition, its handlers and its
//! coordinators on one server thread) as a process of its own, started by `txn-bench
//! --suite rcc --processes`; speaks JSON lines with its parent on stdin and stdout (see
//! [`bench::rcc_node`]). Exits 0 after writing its partition when told to, 1 on an
//! error or when its parent goes away.

fn main() {
    bench::bench_main::<bench::rcc_node::RccNodeArgs>("rcc-node", &[], bench::rcc_node::main);
}
