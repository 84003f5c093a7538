//! `txn-bench`: SmallBank, KVS / YCSB, TATP or TPC-C on a local cluster over the shm
//! fabric, one protocol or all of them compared (see [`bench::txnbench`]); settings from
//! flags and `--config FILE.toml`. Exit codes ([`bench::cli`]'s, as every benchmark
//! binary): 0 when every check of every run passed; 1 when a check failed (the
//! workload's own: money, KVS checksums, TATP's or TPC-C's consistency; locks, a
//! transaction type that never committed, serializability, snapshot isolation for
//! `mvcc-si`), a coordinator hit a service failure, or on another run-time error; 2 on a
//! usage error (bad flags or config file, found before anything starts); 130 when
//! interrupted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bench::txnbench::{run, Args, ConfigError, Outcome};

fn main() {
    bench::cli::init_logging();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if bench::rcc_suite::wants_suite(&argv) {
        let args = bench::cli::try_parse_from::<bench::rcc_suite::RccArgs, _, _>(
            argv,
            bench::rcc_suite::DEFAULTS,
        )
        .unwrap_or_else(|e| e.exit());
        match bench::rcc_suite::main_with(args) {
            Ok(true) => std::process::exit(0),
            Ok(false) => std::process::exit(1),
            Err(e) => {
                eprintln!("txn-bench: error: {e:#}");
                std::process::exit(bench::cli::exit_code(&e));
            }
        }
    }
    let args = match Args::parse_with_config(argv) {
        Ok(a) => a,
        Err(ConfigError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("txn-bench: error: {e}");
            std::process::exit(2);
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let (stop, interrupted) = (stop.clone(), interrupted.clone());
        let installed = ctrlc::set_handler(move || {
            stop.store(true, Ordering::SeqCst);
            if interrupted.swap(true, Ordering::SeqCst) {
                std::process::exit(130); // second Ctrl-C: children die with us (PDEATHSIG)
            }
            eprintln!(
                "\ninterrupted: stopping coordinators and cleaning up (Ctrl-C again to force)"
            );
        });
        if let Err(e) = installed {
            eprintln!("txn-bench: error: installing the signal handler: {e}");
            std::process::exit(2);
        }
    }
    match run(args, stop) {
        Ok((_, Outcome::Failed)) => std::process::exit(1),
        Ok((_, Outcome::Passed)) if interrupted.load(Ordering::SeqCst) => std::process::exit(130),
        Ok((_, Outcome::Passed)) => {}
        Err(e) => {
            eprintln!("txn-bench: error: {e:#}");
            std::process::exit(bench::cli::exit_code(&e));
        }
    }
}
