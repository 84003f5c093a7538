//! The range index after a run (`ycsb-e`, TPC-C with `--range-index`): the B-link
//! tree's structure ([`rtx::blink::check::check_tree`]: fences, sibling chains and
//! parents agree, keys in order), no rTX lock held and no log left unfinished
//! ([`rtx::blink::check::check_quiescent`]), and every row of the indexed tables that
//! exists has its key in the index (stale keys of aborted inserts may remain: scans skip
//! them).
//!
//! A coordinator killed during an index operation leaves its log or its leaf locked.
//! Every coordinator has stopped when the audit runs, so the audit first does what the
//! next client to meet them would (rTX 4.3): it restarts each rTX ID whose log is not
//! DONE ([`rtx::Client::recover`]) and repairs each lock once its lease has expired
//! ([`rtx::Client::repair`]), and says how many it found. A run without a kill must find
//! none.

use std::collections::HashSet;

use anyhow::Context;
use rrpc::fabric::Fabric;
use rrpc::runtime::{block_on, ThreadCtx};
use rtx::rrpc_mem::RrpcMem;
use txn::coordinator::ClusterAddrs;
use txn::range_index::{index_key, KEY_BITS};

/// What the audit found, for the report's check line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IndexAudit {
    /// Keys of the audited tables in the index.
    pub keys: u64,
    /// Rows (table, key) that exist but whose key is not in the index (none when the
    /// index is right).
    pub missing: Vec<(u32, u64)>,
    /// Index keys whose row does not exist (stale, harmless).
    pub stale: u64,
    /// What the structural or quiescence check found wrong, if anything.
    pub broken: Option<String>,
    /// rTX logs left unfinished that the audit finished, and locks it repaired, before
    /// checking (what dead coordinators left).
    pub repaired: (u64, u64),
}

impl IndexAudit {
    /// Whether every check held.
    pub fn ok(&self) -> bool {
        self.missing.is_empty() && self.broken.is_none()
    }

    /// The report's line.
    pub fn line(&self) -> String {
        let mut s = format!(
            "range index: {} keys ({} stale), tree {}",
            self.keys,
            self.stale,
            match (&self.broken, self.repaired) {
                (None, (0, 0)) => "sound, no rTX lock held or log unfinished".to_string(),
                (None, (logs, locks)) => format!(
                    "sound after finishing {logs} rTX log(s) and repairing {locks} expired \
                     lock(s) that dead coordinators left, no rTX lock held or log unfinished"
                ),
                (Some(b), _) => format!("FAILED: {b}"),
            }
        );
        if self.missing.is_empty() {
            s += ", every row indexed";
        } else {
            s += &format!(
                ", FAILED: {} rows not indexed (first: table {} key {})",
                self.missing.len(),
                self.missing[0].0,
                self.missing[0].1
            );
        }
        s
    }
}

/// Read the range index of the cluster at `addrs` and check it against `rows`, the
/// (table, key) of every row of the indexed `tables` that exists. Errors: no memory node
/// exports a range index, a READ failed.
pub(crate) fn audit_range_index(
    fabric: &Fabric,
    addrs: &ClusterAddrs,
    tables: &[u32],
    rows: &[(u32, u64)],
) -> anyhow::Result<IndexAudit> {
    let ctx = ThreadCtx::new(fabric.clone(), crate::run_runtime::get())?;
    let mut found = None;
    for &a in &addrs.memnodes {
        let info = ctx.connect(a).context("range index audit: connecting")?;
        if info
            .export::<txn::range_index::RangeIndexExport>(txn::range_index::EXPORT_KEY)
            .is_ok()
        {
            let e: rtx::host::RtxExport = info.export(rtx::host::EXPORT_KEY)?;
            found = Some((RrpcMem::new(ctx.clone(), info.node, e.region), e.layout));
            break;
        }
    }
    let (mem, layout) = found.context("range index audit: no memory node hosts the index")?;
    let (repaired, entries, quiescent) = block_on(&ctx, async move {
        let repaired = repair_leftovers(&mem, &layout).await?;
        let entries = rtx::blink::check::check_tree(&mem, &layout).await;
        let quiescent = rtx::blink::check::check_quiescent(&mem, &layout).await;
        anyhow::Ok((repaired, entries, quiescent))
    })?;
    let broken = match (&entries, &quiescent) {
        (Err(e), _) | (Ok(_), Err(e)) => Some(e.to_string()),
        _ => None,
    };
    index_key(tables.iter().copied().max().unwrap_or(0), 0)?;
    let keys: HashSet<(u32, u64)> = entries
        .unwrap_or_default()
        .into_iter()
        .map(|(k, _)| ((k >> KEY_BITS) as u32, k & ((1 << KEY_BITS) - 1)))
        .filter(|(t, _)| tables.contains(t))
        .collect();
    let rowset: HashSet<(u32, u64)> = rows.iter().copied().collect();
    let mut missing: Vec<(u32, u64)> = rows.iter().copied().filter(|k| !keys.contains(k)).collect();
    missing.sort_unstable();
    Ok(IndexAudit {
        repaired,
        keys: keys.len() as u64,
        stale: keys.iter().filter(|k| !rowset.contains(k)).count() as u64,
        missing,
        broken,
    })
}

/// The incarnation the audit restarts IDs at (the coordinators use 2 to 254).
const AUDIT_INCARNATION: u8 = 255;

/// Finish every rTX log not DONE (restarting its ID) and repair every lock once its lease
/// expired: returns (logs, locks). Errors: a READ, a repair failed, or a lock stays after
/// its repair.
async fn repair_leftovers(mem: &RrpcMem, layout: &rtx::Layout) -> anyhow::Result<(u64, u64)> {
    use rtx::lease::{Clock, SystemClock};
    use rtx::lllock::LockWord;
    use rtx::mem::Mem;
    let mut logs = 0;
    // The loader's ID (the region's last) repairs: no coordinator uses it.
    let mut rescuer = rtx::Client::new(
        *layout,
        layout.ids - 1,
        AUDIT_INCARNATION,
        SystemClock,
        rtx::Config::default(),
    );
    for id in 0..layout.ids - 1 {
        let w = mem.read_u64(layout.log_addr(id)).await?;
        if w != 0 && rtx::log::Header::decode(w).state != rtx::log::LogState::Done {
            let mut c = rtx::Client::new(
                *layout,
                id,
                AUDIT_INCARNATION,
                SystemClock,
                rtx::Config::default(),
            );
            c.recover(mem)
                .await
                .with_context(|| format!("range index audit: restarting rTX ID {id}"))?;
            logs += 1;
        }
    }
    // The lock words, 512 READs at a time.
    let mut locked = Vec::new();
    let all: Vec<u64> = (0..layout.objects).collect();
    for chunk in all.chunks(512) {
        let words =
            rrpc::runtime::join_all(chunk.iter().map(|&i| mem.read_u64(layout.obj_addr(i)))).await;
        for (&i, w) in chunk.iter().zip(words) {
            if let LockWord::Locked(s) = LockWord::decode(w?) {
                locked.push((i, s));
            }
        }
    }
    let mut locks = 0;
    for (i, s) in locked {
        let at = layout.obj_addr(i);
        let w = mem.read_u64(at).await?;
        if LockWord::decode(w) != LockWord::Locked(s) {
            continue;
        }
        let now = SystemClock.now_ms();
        if !s.expired(now) {
            std::thread::sleep(std::time::Duration::from_millis(
                s.lease_ms.saturating_sub(now) + 1,
            ));
        }
        rescuer
            .repair(mem, at, w)
            .await
            .with_context(|| format!("range index audit: repairing object {i}"))?;
        if mem.read_u64(at).await? == w {
            anyhow::bail!("range index audit: object {i} still locked after its repair");
        }
        locks += 1;
    }
    Ok((logs, locks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_fails_on_a_missing_row_or_a_broken_tree() {
        let mut a = IndexAudit {
            keys: 10,
            missing: Vec::new(),
            stale: 1,
            broken: None,
            repaired: (0, 0),
        };
        assert!(a.ok());
        assert!(!a.line().contains("FAILED"), "{}", a.line());
        a.missing.push((0, 7));
        assert!(!a.ok());
        assert!(
            a.line()
                .contains("FAILED: 1 rows not indexed (first: table 0 key 7)"),
            "{}",
            a.line()
        );
        a.missing.clear();
        a.repaired = (1, 2);
        assert!(a.ok());
        assert!(
            a.line()
                .contains("sound after finishing 1 rTX log(s) and repairing 2 expired"),
            "{}",
            a.line()
        );
        a.broken = Some("object 3 still locked by rTX ID 2".into());
        assert!(!a.ok());
        assert!(a.line().contains("tree FAILED: object 3"), "{}", a.line());
    }
}
