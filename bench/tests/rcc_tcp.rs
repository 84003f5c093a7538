//! The RPC variants over tonic (the RCC suite's `tcp` transport): every protocol's run
//! passes its checks (the workload's check, locks free, serializability; CALVIN's
//! determinism), and the transport refuses the one-sided variant.

use std::sync::Arc;
use std::time::Duration;

use bench::rcc_tcp::TonicCalls;
use rcc::cluster::{run, RunConfig, RunError};
use rcc::smallbank::SmallBank;
use rcc::ycsb::Ycsb;
use rcc::{Proto, Variant};

fn cfg(proto: Proto, variant: Variant) -> RunConfig {
    RunConfig {
        model: Some("none".into()),
        nodes: 2,
        coroutines: 3,
        proto,
        variant,
        duration: Duration::from_millis(300),
        watchdog: Duration::from_secs(3),
        calls: Some(Arc::new(TonicCalls)),
        ..RunConfig::default()
    }
}

#[test]
fn every_protocol_passes_its_checks_over_tonic() {
    let sb = Arc::new(SmallBank {
        accounts: 2_000,
        hot: (20, 0.5),
    });
    let ycsb = Arc::new(Ycsb {
        records: 5_000,
        hot: 50,
        hot_prob: 0.3,
        ops: 6,
        write_prob: 0.3,
        compute_us: 0,
    });
    for p in Proto::ALL {
        for (name, wl) in [
            (
                "smallbank",
                sb.clone() as Arc<dyn rcc::workload::Workload + Send + Sync>,
            ),
            ("ycsb", ycsb.clone()),
        ] {
            let o = run(&cfg(p, Variant::Rpc), wl).expect("the run starts");
            let what = format!("{} tcp {name}", p.name());
            assert!(o.report.error.is_none(), "{what}: {:?}", o.report.error);
            assert!(!o.stalled, "{what}: stalled");
            assert!(o.report.commits > 0, "{what}: nothing committed");
            let lines = o.audit.unwrap_or_else(|e| panic!("{what}: {e}"));
            if p == Proto::Calvin {
                assert!(
                    lines.iter().any(|l| l.contains("determinis")),
                    "{what}: {lines:?}"
                );
            }
        }
    }
}

#[test]
fn the_tcp_transport_serves_the_rpc_variant_only() {
    let e = run(
        &cfg(Proto::NoWait, Variant::OneSided),
        Arc::new(SmallBank {
            accounts: 100,
            hot: (0, 0.0),
        }),
    )
    .unwrap_err();
    assert!(matches!(e, RunError::Config(_)), "{e}");
    assert!(e.to_string().contains("RPC variant only"), "{e}");
}
