//! Benchmarks: a local-cluster launcher, SmallBank, KVS / YCSB, TATP, TPC-C, and run
//! reports.
#![warn(missing_docs)]

pub(crate) mod ablation;
mod audit;
pub mod breakdown;
pub mod cnode;
pub mod config_file;
pub mod driver;
pub mod failover;
pub mod forward;
pub mod history_out;
pub(crate) mod hosts;
pub mod launch;
pub mod launcher;
pub mod ledger;
pub(crate) mod lotus_cn;
pub mod lotus_reshard;
pub mod pairs;
pub mod peers;
pub mod perftest;
pub mod plot;
pub mod rcc_suite;
pub mod rcc_tcp;
pub mod recoverer;
pub mod remote;
pub mod report;
pub mod routing;
pub mod smallbank;
pub mod tatp;
pub mod timeline;
pub mod tpcc;
pub mod txn_args;
pub mod txnbench;
pub(crate) mod view_sync;
pub mod workload;
pub mod ycsb;

/// The body of a benchmark binary's `main`: logs to stderr at `warn` unless `RUST_LOG`
/// says otherwise, parses the arguments, and on an error prints `<name>: <error chain>`
/// and exits 1.
pub fn bench_main<A: clap::Parser>(name: &str, run: impl FnOnce(A) -> anyhow::Result<()>) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(A::parse()) {
        eprintln!("{name}: {e:#}");
        std::process::exit(1);
    }
}

/// Join scoped client threads in order: each thread's result, a thread that panicked
/// as an error (the benchmark fails instead of aborting without a report).
pub fn join_clients<T>(
    hs: Vec<std::thread::ScopedJoinHandle<'_, anyhow::Result<T>>>,
) -> Vec<anyhow::Result<T>> {
    hs.into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("client thread panicked")))
        })
        .collect()
}
