//! Benchmarks: a local-cluster launcher, SmallBank, KVS / YCSB, TATP, TPC-C, and run
//! reports.
#![warn(missing_docs)]

pub(crate) mod ablation;
mod audit;
pub mod breakdown;
pub mod cli;
pub mod client_board;
pub mod cnode;
pub mod config_file;
pub mod driver;
pub mod failover;
pub mod forward;
pub mod history_out;
pub(crate) mod hosts;
pub mod index_fault;
pub mod jsonl;
pub mod launch;
pub mod launcher;
pub mod ledger;
pub(crate) mod lotus_cn;
pub mod lotus_reshard;
pub mod pairs;
pub mod peers;
pub mod perftest;
pub mod plot;
mod range_audit;
pub mod rcc_node;
pub mod rcc_suite;
pub mod rcc_tcp;
pub mod rcc_workload;
pub mod recoverer;
pub mod remote;
pub mod report;
pub mod routing;
pub(crate) mod run_runtime;
pub mod smallbank;
pub mod tatp;
pub mod timeline;
pub mod tpcc;
pub mod txn_args;
pub mod txnbench;
pub(crate) mod view_sync;
pub mod workload;
pub mod ycsb;

/// The body of a benchmark binary's `main` ([`cli`]'s convention): logs to stderr at
/// `warn` unless `RUST_LOG` says otherwise, parses the arguments with the binary's own
/// `defaults` for the shared flags (`("duration", "1s")`) and its `--config` file when
/// it has one ([`config_file::parse_with_config`]), exits 2 on a usage error (clap's, a
/// bad config file, or a [`cli::UsageError`] from `run`), and on another error prints
/// `<name>: <error chain>` and exits 1.
pub fn bench_main<A: clap::Parser>(
    name: &str,
    defaults: &[(&'static str, &'static str)],
    run: impl FnOnce(A) -> anyhow::Result<()>,
) {
    cli::init_logging();
    let args = match config_file::parse_with_config::<A, _, _>(std::env::args_os(), defaults) {
        Ok(a) => a,
        Err(config_file::ConfigError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("{name}: error: {e}");
            std::process::exit(2);
        }
    };
    let r = run(args);
    jsonl::close();
    if let Err(e) = r {
        eprintln!("{name}: {e:#}");
        std::process::exit(cli::exit_code(&e));
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
