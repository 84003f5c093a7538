//! The `pairs` atomicity workload end to end: a short in-process run passes every check
//! and its `--history-out` file has one parsable line per commit, with its timeline;
//! and the post-run audit reports a group whose objects were planted with different
//! values (one object written alone, through a real transaction on a real cluster).

mod common;

use std::rc::Rc;
use std::time::Duration;

use bench::history_out::HistoryLine;
use bench::pairs::{audit_groups, encode, Groups, VALUE_BYTES};
use bench::workload::AuditCx;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind};
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};
use rrpc::NodeId;
use txn::coordinator::{Protocol, TxnClient, TxnConfig};

#[test]
fn a_short_pairs_run_passes_and_its_history_file_has_a_line_per_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.jsonl");
    let p = path.to_str().unwrap();
    let (ok, stdout, sum) = common::txn_bench_watched(
        "pairs-history",
        &[
            "--workload",
            "pairs",
            "--groups",
            "500",
            "--memnodes",
            "3",
            "--protocol",
            "occ-cas",
            "--threads",
            "1",
            "--coroutines",
            "4",
            "--duration",
            "1",
            "--timeline-ms",
            "100",
            "--history-out",
            p,
        ],
        Duration::from_secs(300),
    );
    assert!(ok, "{stdout}");
    let r = &sum["runs"][0];
    common::assert_checked_run(r, &["write-group", "read-group"], &stdout);
    let check = r["workload_check"].as_str().unwrap();
    assert!(
        check.starts_with("pairs: 500 groups of 3: uniform"),
        "{check}"
    );
    let committed: u64 = r["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["committed"].as_u64().unwrap())
        .sum();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<HistoryLine> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len() as u64, committed);
    for l in &lines {
        assert!(l.start_ns > 0 && l.start_ns <= l.end_ns, "{l:?}");
        assert_eq!((l.cnode, l.incarnation), (0, 0));
        let n = if l.kind == "write-group" { 3 } else { 0 };
        assert_eq!((l.reads.len(), l.writes.len()), (3, n), "{l:?}");
    }
    // The timeline counts the same commits.
    let total: u64 = r["timeline"]["total"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .sum();
    assert_eq!(total, committed);
    assert!(
        stdout.contains("timeline: commits per 100 ms interval"),
        "{stdout}"
    );
}

#[test]
fn the_audit_reports_a_planted_non_uniform_group() {
    let _one = common::serial();
    let groups = Groups::new(50, 3, 1);
    let protocol = Protocol::OccCas;
    let (cluster, addrs, _tso) = common::start_cluster(
        "pairs-audit",
        protocol,
        &[
            "--kvs-records".into(),
            groups.records().to_string(),
            "--kvs-value-bytes".into(),
            VALUE_BYTES.to_string(),
        ],
        groups.records(),
    );
    let kind = FabricKind::from_env().unwrap();
    let fabric = Fabric::open(&FabricConfig::new(kind, cluster.name(), NodeId(100))).unwrap();
    let cx = AuditCx {
        fabric: &fabric,
        addrs: &addrs,
        protocol,
    };
    let before = audit_groups(&cx, &groups).unwrap();
    let (line, ok) = before.check.unwrap();
    assert!(ok, "{line}");
    assert_eq!(line, "pairs: 50 groups of 3: uniform (0 written)");
    // Plant: one object of group 7 written alone, committed by a real transaction.
    let key = groups.keys(7)[1];
    let ctx = ThreadCtx::new(fabric.clone(), RuntimeConfig::default()).unwrap();
    let client = Rc::new(
        TxnClient::connect(
            ctx.clone(),
            &addrs,
            TxnConfig::default().with_protocol(protocol),
        )
        .unwrap(),
    );
    let c = client.clone();
    block_on(&ctx, async move {
        let mut t = c.begin();
        t.read_for_update(txn::kvs::TABLE, key).await?;
        t.write(txn::kvs::TABLE, key, encode(42))?;
        t.commit().await
    })
    .unwrap();
    let after = audit_groups(&cx, &groups).unwrap();
    let (line, ok) = after.check.unwrap();
    assert!(!ok, "{line}");
    assert!(line.contains("1 NOT UNIFORM (FAILED)"), "{line}");
    assert!(
        line.contains(&format!(
            "first: group 7 keys {:?} values [Some(0), Some(42), Some(0)]",
            groups.keys(7)
        )),
        "{line}"
    );
    assert_eq!(after.cvt_locked, 0);
}
