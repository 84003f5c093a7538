//! `rrpc-launch up|down|status|logs --hosts cluster.toml`: a standalone cluster of rrpc
//! services from a topology file (see `bench::launch`).

fn main() {
    bench::bench_main("rrpc-launch", &[], bench::launch::run);
}
