//! The protocols on rrpc's shm fabric, nodes and coordinators sharing server threads as
//! RCC runs them: every protocol and variant passes its checks on SmallBank and YCSB;
//! one-sided lock-and-read shares doorbells; the planted MVCC and SUNDIAL bugs are
//! caught.

use std::sync::Arc;
use std::time::Duration;

use rcc::cluster::{run, RunConfig};
use rcc::smallbank::SmallBank;
use rcc::ycsb::Ycsb;
use rcc::{Proto, Variant};

fn cfg(proto: Proto, variant: Variant) -> RunConfig {
    RunConfig {
        nodes: 2,
        coroutines: 4,
        proto,
        variant,
        duration: Duration::from_millis(400),
        ..RunConfig::default()
    }
}

#[test]
fn every_protocol_and_variant_passes_its_checks_over_shm() {
    let sb = Arc::new(SmallBank {
        accounts: 2_000,
        hot: (20, 0.5),
    });
    let ycsb = Arc::new(Ycsb {
        records: 20_000,
        hot: 100,
        hot_prob: 0.3,
        ..Ycsb::default()
    });
    for p in Proto::ALL {
        for v in [Variant::Rpc, Variant::OneSided] {
            for wl in [
                sb.clone() as Arc<dyn rcc::workload::Workload + Send + Sync>,
                ycsb.clone(),
            ] {
                let what = format!("{} {} {}", wl.name(), p.name(), v.name());
                let o = run(&cfg(p, v), wl).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(o.report.error.is_none(), "{what}: {:?}", o.report.error);
                assert!(!o.stalled, "{what}: stalled");
                assert!(
                    o.report.commits > 20,
                    "{what}: {} commits",
                    o.report.commits
                );
                let lines = o.audit.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(lines.len(), 3, "{what}: {lines:?}");
                eprintln!(
                    "{what}: {} commits, {:.1}% aborts, {:.2} rounds/txn; {}",
                    o.report.commits,
                    100.0 * o.report.abort_rate(),
                    o.report.stats.rounds as f64 / o.report.commits as f64,
                    lines.join("; ")
                );
            }
        }
    }
}

#[test]
fn one_sided_lock_and_read_shares_doorbells() {
    let o = run(
        &RunConfig {
            coroutines: 1,
            ..cfg(Proto::NoWait, Variant::OneSided)
        },
        Arc::new(SmallBank {
            accounts: 10_000,
            hot: (0, 0.0),
        }),
    )
    .unwrap();
    o.audit.unwrap();
    let per = o.rrpc.wrs as f64 / o.rrpc.doorbells as f64;
    assert!(
        per >= 2.0,
        "{} WRs in {} doorbells: lock-and-read and update-and-unlock are not batched",
        o.rrpc.wrs,
        o.rrpc.doorbells
    );
}

/// The planted MVCC and SUNDIAL bugs on the write-skew workload over shm, where the
/// nodes' server threads run in parallel: the same run without the bug passes its
/// checks, with it the serializability check finds a cycle (up to three tries).
#[cfg(feature = "fault-injection")]
#[test]
fn planted_mvcc_and_sundial_bugs_show_cycles_over_shm() {
    use rcc::coord::Fault;
    use rcc::skew::Skew;
    for (p, f) in [
        (Proto::Mvcc, Fault::MvccReadersDontRaiseRts),
        (Proto::Sundial, Fault::SundialBlindRenewal),
    ] {
        for v in [Variant::Rpc, Variant::OneSided] {
            let what = format!("{} {}", p.name(), v.name());
            let run_with = |fault| {
                let c = RunConfig {
                    fault,
                    duration: Duration::from_millis(300),
                    ..cfg(p, v)
                };
                run(&c, Arc::new(Skew { pairs: 4 })).unwrap_or_else(|e| panic!("{what}: {e}"))
            };
            let o = run_with(None);
            o.audit
                .unwrap_or_else(|e| panic!("{what} without the bug: {e}"));
            let caught = (0..3).find_map(|_| run_with(Some(f)).audit.err());
            let e = caught.unwrap_or_else(|| panic!("{what}: the planted bug went unnoticed"));
            assert!(e.contains("serializability"), "{what}: {e}");
        }
    }
}
