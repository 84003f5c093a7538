//! Post-run audits of `txn-bench`: the newest committed version of a workload's rows
//! and the lock words left held, read with one-sided READs from a fresh thread context
//! (`TxnClient::audit_row`), plus the lock service's
//! queues; then each workload's own check: SmallBank's money, KVS checksums and update
//! counts, TATP's referential consistency (`txn::tatp::check`), TPC-C's consistency
//! conditions 1 to 4 (`txn::tpcc::check`).

use std::collections::HashMap;
use std::rc::Rc;

use anyhow::{bail, Context};
use rrpc::fabric::Fabric;
use rrpc::runtime::{block_on, join_all, ThreadCtx};
use txn::coordinator::{ClusterAddrs, Protocol, TxnClient, TxnConfig};

/// Rows read per round of one-sided READs (each row: its CVT, its version, its lock
/// word).
const CHUNK: usize = 512;

/// What an audit found.
pub(crate) struct Audit {
    /// The newest committed value of each item audited, in order (`None`: absent).
    pub(crate) values: Vec<Option<Vec<u8>>>,
    /// CVT lock words held.
    pub(crate) cvt_locked: u64,
    /// Lock service locks held or queued (`None` without a lock service).
    pub(crate) lockd_held: Option<u64>,
}

/// SmallBank's items: savings and checking of every account.
pub(crate) fn smallbank_items(accounts: u64) -> Vec<(u32, u64)> {
    [txn::smallbank::SAVINGS, txn::smallbank::CHECKING]
        .into_iter()
        .flat_map(|t| (0..accounts).map(move |a| (t, a)))
        .collect()
}

/// KVS items: the loaded records and the keys `inserted`.
pub(crate) fn kvs_items(records: u64, inserted: &[u64]) -> Vec<(u32, u64)> {
    (0..records)
        .chain(inserted.iter().copied())
        .map(|k| (txn::kvs::TABLE, k))
        .collect()
}

/// Sum of all balances in `a` (SmallBank), cents. Errors: an account absent or not a
/// balance.
pub(crate) fn money(a: &Audit, items: &[(u32, u64)]) -> anyhow::Result<i64> {
    let mut total = 0i64;
    for (&(table, k), v) in items.iter().zip(&a.values) {
        let Some(v) = v else {
            bail!("audit: table {table} has no account {k}");
        };
        total += i64::from_le_bytes(
            v.as_slice()
                .try_into()
                .with_context(|| format!("audit: table {table} account {k}: {} bytes", v.len()))?,
        );
    }
    Ok(total)
}

/// The KVS check of an audit.
pub(crate) struct KvsCheck {
    /// Keys audited.
    pub(crate) keys: usize,
    /// Keys inserted among them.
    inserted: usize,
    /// Keys absent.
    missing: Vec<u64>,
    /// Values that failed their check.
    bad: Vec<String>,
    /// Committed updates counted by the coordinators.
    counted: u64,
    /// Sum of the keys' update counters.
    pub(crate) found: u64,
}

impl KvsCheck {
    pub(crate) fn ok(&self) -> bool {
        self.missing.is_empty() && self.bad.is_empty()
    }

    /// `kvs check: N records, checksums ok, updates counted C = found C`, or what failed.
    pub(crate) fn line(&self) -> String {
        let mut s = format!("kvs check: {} records", self.keys - self.inserted);
        if self.inserted > 0 {
            s.push_str(&format!(" + {} inserted", self.inserted));
        }
        if self.bad.is_empty() {
            s.push_str(", checksums ok");
        } else {
            s.push_str(&format!(
                ", {} BAD VALUES (first: {})",
                self.bad.len(),
                self.bad[0]
            ));
        }
        if !self.missing.is_empty() {
            s.push_str(&format!(
                ", {} KEYS MISSING (first: {})",
                self.missing.len(),
                self.missing[0]
            ));
        }
        let rel = if self.counted == self.found {
            "="
        } else {
            "!="
        };
        s.push_str(&format!(
            ", updates counted {} {rel} found {}",
            self.counted, self.found
        ));
        if self.counted != self.found || !self.ok() {
            s.push_str(" (FAILED)");
        }
        s
    }
}

/// Check every KVS value of `a` ([`txn::kvs::check_value`]) and sum the update
/// counters; `counted` is what the coordinators committed. Keys from `records` on are
/// inserted ones.
pub(crate) fn kvs_check(a: &Audit, items: &[(u32, u64)], records: u64, counted: u64) -> KvsCheck {
    let mut c = KvsCheck {
        keys: items.len(),
        inserted: 0,
        missing: Vec::new(),
        bad: Vec::new(),
        counted,
        found: 0,
    };
    for (&(_, k), v) in items.iter().zip(&a.values) {
        c.inserted += usize::from(k >= records);
        match v {
            None => c.missing.push(k),
            Some(v) => match txn::kvs::check_value(k, v) {
                Ok(n) => c.found += n,
                Err(e) => c.bad.push(e),
            },
        }
    }
    c
}

/// The run's replica view, for the audits after a memory node failed over (they then
/// read the promoted primaries and skip the dead node). Set by the run before its
/// audits, cleared by the next run.
static RUN_VIEW: std::sync::Mutex<Option<txn::view::ViewFeed>> = std::sync::Mutex::new(None);

/// Audits of this run follow `feed`'s view (`None`: the initial placement).
pub(crate) fn set_run_view(feed: Option<txn::view::ViewFeed>) {
    *RUN_VIEW.lock().unwrap_or_else(|e| e.into_inner()) = feed;
}

fn run_view() -> Option<txn::view::ViewFeed> {
    RUN_VIEW.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// A thread context and client for audits (no transactions: committed reads only).
pub(crate) struct Auditor {
    ctx: Rc<ThreadCtx>,
    client: Rc<TxnClient>,
}

impl Auditor {
    /// Connect to the cluster's memory nodes (and lock service when `protocol` has
    /// one).
    pub(crate) fn connect(
        fabric: &Fabric,
        addrs: &ClusterAddrs,
        protocol: Protocol,
    ) -> anyhow::Result<Self> {
        let ctx = ThreadCtx::new(fabric.clone(), crate::run_runtime::get())?;
        // Audits read committed rows one-sided; Lotus's lock tables died with the run's
        // coordinators (its INVISIBLE cells count as held locks, `audit_row`).
        let protocol = if protocol.needs_lock_tables() {
            Protocol::OccCas
        } else {
            protocol
        };
        let cfg = TxnConfig::default()
            .with_protocol(protocol)
            .with_view_feed(run_view());
        let client =
            Rc::new(TxnClient::connect(ctx.clone(), addrs, cfg).context("audit: connecting")?);
        Ok(Self { ctx, client })
    }

    /// The newest committed value of each item (`None`: absent; all `None` unless
    /// `keep`), and how many of the items' CVT lock words are held.
    pub(crate) fn rows(&self, items: &[(u32, u64)], keep: bool) -> anyhow::Result<Rows> {
        let (client, items) = (self.client.clone(), items.to_vec());
        block_on(&self.ctx, async move {
            let mut values = Vec::with_capacity(items.len());
            let mut cvt_locked = 0;
            for chunk in items.chunks(CHUNK) {
                let got = join_all(
                    chunk
                        .iter()
                        .map(|&(table, k)| client.audit_row(table, k, keep)),
                )
                .await;
                for (&(table, k), v) in chunk.iter().zip(got) {
                    let (v, locked) =
                        v.with_context(|| format!("audit: reading table {table} key {k}"))?;
                    values.push(v.map(|(_, v)| v));
                    cvt_locked += u64::from(locked);
                }
            }
            Ok((values, cvt_locked))
        })
    }

    /// Locks of the lock services held or queued (the lockd's, or every memory node's),
    /// `None` without a lock service (each table read in READs of 1 MiB).
    pub(crate) fn lockd_held(&self) -> anyhow::Result<Option<u64>> {
        let client = self.client.clone();
        block_on(&self.ctx, async move {
            let services = client.lock_services();
            if services.is_empty() {
                return Ok(None);
            }
            // The one lockd's table, or every memory node's.
            let mut n = 0;
            for locks in services {
                n += locks
                    .count_busy(client.ctx(), 0..locks.n_locks(), 1 << 20)
                    .await
                    .context("audit: reading the lock table")?;
            }
            Ok(Some(n))
        })
    }
}

/// Read the newest committed version of every item, and count held locks (every CVT
/// lock word of the items; every lock service lock when `protocol` has one).
pub(crate) fn audit(
    fabric: &Fabric,
    addrs: &ClusterAddrs,
    protocol: Protocol,
    items: &[(u32, u64)],
) -> anyhow::Result<Audit> {
    let (values, cvt_locked) = rows_parallel(fabric, addrs, protocol, items, true)?;
    Ok(Audit {
        values,
        cvt_locked,
        lockd_held: Auditor::connect(fabric, addrs, protocol)?.lockd_held()?,
    })
}

/// What [`Auditor::rows`] returns: the values (or `None`s) and the held lock words.
type Rows = (Vec<Option<Vec<u8>>>, u64);

/// [`Auditor::rows`] over `keys` split across one thread per core (each with its own
/// thread context and client), in order.
pub(crate) fn rows_parallel(
    fabric: &Fabric,
    addrs: &ClusterAddrs,
    protocol: Protocol,
    keys: &[(u32, u64)],
    keep: bool,
) -> anyhow::Result<Rows> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = keys.len().div_ceil(threads).max(CHUNK);
    let parts: Vec<anyhow::Result<Rows>> = std::thread::scope(|s| {
        let hs: Vec<_> = keys
            .chunks(per)
            .map(|part| {
                let fabric = fabric.clone();
                s.spawn(move || Auditor::connect(&fabric, addrs, protocol)?.rows(part, keep))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("an audit thread panicked")))
            })
            .collect()
    });
    let mut values = Vec::with_capacity(keys.len());
    let mut locked = 0;
    for p in parts {
        let (v, l) = p?;
        values.extend(v);
        locked += l;
    }
    Ok((values, locked))
}

/// A workload check's verdict, its line, and the locks the walk found held.
pub(crate) struct Checked {
    /// `tatp consistency: ...` / `consistency 1-4: ...`.
    pub(crate) line: String,
    /// The check passed.
    pub(crate) ok: bool,
    /// CVT lock words held among the rows walked.
    pub(crate) cvt_locked: u64,
    /// Lock service locks held or queued (`None` without one).
    pub(crate) lockd_held: Option<u64>,
}

/// The rows of `keys` that exist, read by [`rows_parallel`] (values only when `keep`),
/// added to `rows`; returns the CVT lock words held among them.
fn collect(
    fabric: &Fabric,
    addrs: &ClusterAddrs,
    protocol: Protocol,
    rows: &mut HashMap<(u32, u64), Vec<u8>>,
    keys: Vec<(u32, u64)>,
    keep: bool,
) -> anyhow::Result<u64> {
    let (values, locked) = rows_parallel(fabric, addrs, protocol, &keys, keep)?;
    rows.extend(
        keys.into_iter()
            .zip(values)
            .filter_map(|(k, v)| Some((k, v?))),
    );
    Ok(locked)
}

/// TATP after a run: every key a subscriber can have (21 per subscriber: the
/// subscriber, 4 ACCESS_INFO, 4 SPECIAL_FACILITY, 12 CALL_FORWARDING), then
/// [`txn::tatp::check`] over them; `seed` is the population's.
pub(crate) fn tatp(
    fabric: &Fabric,
    addrs: &ClusterAddrs,
    protocol: Protocol,
    subscribers: u64,
    seed: u64,
) -> anyhow::Result<Checked> {
    use txn::tatp::{
        ai_key, cf_key, sf_key, ACCESS_INFO, CALL_FORWARDING, SPECIAL_FACILITY, START_TIMES,
        SUBSCRIBER,
    };
    let mut keys = Vec::with_capacity(subscribers as usize * 21);
    for s in 1..=subscribers {
        keys.push((SUBSCRIBER, s));
        for t in 1..=4u8 {
            keys.push((ACCESS_INFO, ai_key(s, t)));
            keys.push((SPECIAL_FACILITY, sf_key(s, t)));
            keys.extend(
                START_TIMES
                    .iter()
                    .map(|&st| (CALL_FORWARDING, cf_key(s, t, st))),
            );
        }
    }
    let mut rows = HashMap::new();
    let cvt_locked = collect(fabric, addrs, protocol, &mut rows, keys, true)?;
    let c = txn::tatp::check(subscribers, seed, |t, k| rows.get(&(t, k)).cloned());
    Ok(Checked {
        line: c.line(),
        ok: c.holds(),
        cvt_locked,
        lockd_held: Auditor::connect(fabric, addrs, protocol)?.lockd_held()?,
    })
}

/// TPC-C after a run: the warehouses and districts (with their YTD and delivery-cursor
/// rows), each district's orders up to `D_NEXT_O_ID` (its ORDER, NEW_ORDER and 15
/// possible ORDER_LINE rows), then [`txn::tpcc::check`]'s conditions 1 to 4; the lock
/// words of every CUSTOMER, STOCK and CUSTOMER_LAST_ORDER row are counted too (HISTORY
/// rows, keyed by transaction id, are not walked).
pub(crate) fn tpcc(
    fabric: &Fabric,
    addrs: &ClusterAddrs,
    protocol: Protocol,
    warehouses: u16,
    range_index: bool,
) -> anyhow::Result<Checked> {
    use txn::tpcc::{
        customer_key, district_key, get_u32, order_key, order_line_key, stock_key, CUSTOMER,
        CUSTOMERS, CUSTOMER_LAST_ORDER, DELIVERY_CURSOR, DISTRICT, DISTRICTS, DISTRICT_YTD, ITEMS,
        NEW_ORDER, ORDER, ORDER_LINE, STOCK, WAREHOUSE, WAREHOUSE_YTD,
    };
    let mut rows = HashMap::new();
    let mut head = Vec::new();
    for w in 1..=warehouses {
        head.extend([(WAREHOUSE, u64::from(w)), (WAREHOUSE_YTD, u64::from(w))]);
        for d in 1..=DISTRICTS {
            let k = district_key(w, d);
            head.extend([(DISTRICT, k), (DISTRICT_YTD, k), (DELIVERY_CURSOR, k)]);
        }
    }
    let mut cvt_locked = collect(fabric, addrs, protocol, &mut rows, head, true)?;
    let (mut orders, mut locks_only) = (Vec::new(), Vec::new());
    for w in 1..=warehouses {
        locks_only.extend((1..=ITEMS).map(|i| (STOCK, stock_key(w, i))));
        for d in 1..=DISTRICTS {
            let Some(next) = rows
                .get(&(DISTRICT, district_key(w, d)))
                .map(|r| get_u32(r, 12))
            else {
                continue; // The check reports the missing district.
            };
            for o in 1..=next {
                orders.push((ORDER, order_key(w, d, o)));
                orders.push((NEW_ORDER, order_key(w, d, o)));
                orders.extend((1..=15).map(|ol| (ORDER_LINE, order_line_key(w, d, o, ol))));
            }
            locks_only.extend((1..=CUSTOMERS).flat_map(|c| {
                let k = customer_key(w, d, c);
                [(CUSTOMER, k), (CUSTOMER_LAST_ORDER, k)]
            }));
        }
    }
    cvt_locked += collect(fabric, addrs, protocol, &mut rows, orders, true)?;
    cvt_locked += collect(fabric, addrs, protocol, &mut rows, locks_only, false)?;
    let c = txn::tpcc::check(warehouses, !range_index, |t, k| rows.get(&(t, k)).cloned());
    let (mut line, mut ok) = (c.line(), c.holds());
    if range_index {
        let tables = [NEW_ORDER, ORDER_LINE];
        let indexed: Vec<(u32, u64)> = rows
            .keys()
            .filter(|(t, _)| tables.contains(t))
            .copied()
            .collect();
        let ix = crate::range_audit::audit_range_index(fabric, addrs, &tables, &indexed)?;
        line = format!("{line}; {}", ix.line());
        ok &= ix.ok();
    }
    Ok(Checked {
        line,
        ok,
        cvt_locked,
        lockd_held: Auditor::connect(fabric, addrs, protocol)?.lockd_held()?,
    })
}

/// The durability check after a failover: every object a committed transaction wrote
/// holds, on its (new) primary, a version at least the highest one a committed
/// transaction installed (the replication design's B.8.2: nothing committed lost).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Durability {
    /// Objects checked.
    pub(crate) objects: usize,
    /// The first object found behind: `(table, key, newest found, committed)`.
    pub(crate) behind: Option<(u32, u64, u64, u64)>,
    /// Objects found behind.
    pub(crate) behind_count: usize,
}

impl Durability {
    /// `durability: N objects written by committed transactions hold their last
    /// committed version` or `... LOST: ...`.
    pub(crate) fn line(&self) -> String {
        match self.behind {
            None => format!(
                "durability: {} objects written by committed transactions hold their last \
                 committed version or a later one",
                self.objects
            ),
            Some((t, k, found, want)) => format!(
                "durability: {} of {} objects LOST their last committed version (first: table \
                 {t} key {k} holds version {found}, a committed transaction installed {want})",
                self.behind_count, self.objects
            ),
        }
    }

    /// Nothing committed was lost.
    pub(crate) fn ok(&self) -> bool {
        self.behind.is_none()
    }
}

/// The highest version committed transactions installed, per object written, from the
/// threads' histories (sorted by object).
pub(crate) fn committed_versions<'a>(
    histories: impl IntoIterator<Item = &'a txn::history::History>,
) -> Vec<((u32, u64), u64)> {
    let mut max: HashMap<(u32, u64), u64> = HashMap::new();
    for h in histories {
        for (_, a) in h.iter_accesses() {
            if a.kind == txn::history::AccessKind::Write {
                let e = max.entry((a.table, a.key)).or_insert(0);
                *e = (*e).max(a.version);
            }
        }
    }
    let mut v: Vec<_> = max.into_iter().collect();
    v.sort_unstable();
    v
}

/// Compare the versions found (`found[i]` for `want[i]`; `None`: no version) with the
/// committed ones.
pub(crate) fn compare_versions(want: &[((u32, u64), u64)], found: &[Option<u64>]) -> Durability {
    let mut d = Durability {
        objects: want.len(),
        behind: None,
        behind_count: 0,
    };
    for (&((t, k), w), f) in want.iter().zip(found) {
        let got = f.unwrap_or(0);
        if got < w {
            d.behind_count += 1;
            d.behind.get_or_insert((t, k, got, w));
        }
    }
    d
}

/// The durability check of `want` ([`committed_versions`]) against the primaries of
/// the run's view, one thread per core.
pub(crate) fn durability(
    fabric: &Fabric,
    addrs: &ClusterAddrs,
    protocol: Protocol,
    want: &[((u32, u64), u64)],
) -> anyhow::Result<Durability> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = want.len().div_ceil(threads).max(CHUNK);
    let parts: Vec<anyhow::Result<Vec<Option<u64>>>> = std::thread::scope(|s| {
        let hs: Vec<_> = want
            .chunks(per)
            .map(|part| {
                let fabric = fabric.clone();
                let keys: Vec<(u32, u64)> = part.iter().map(|&(k, _)| k).collect();
                s.spawn(move || {
                    let a = Auditor::connect(&fabric, addrs, protocol)?;
                    let client = a.client.clone();
                    block_on(&a.ctx, async move {
                        let mut out = Vec::with_capacity(keys.len());
                        for chunk in keys.chunks(CHUNK) {
                            let got =
                                join_all(chunk.iter().map(|&(t, k)| client.newest_version(t, k)))
                                    .await;
                            for (g, &(t, k)) in got.into_iter().zip(chunk) {
                                let v = g.with_context(|| {
                                    format!("durability: reading table {t} key {k}")
                                })?;
                                out.push(v.map(tso::Timestamp::get));
                            }
                        }
                        anyhow::Ok(out)
                    })
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a durability thread panicked")))
            })
            .collect()
    });
    let mut found = Vec::with_capacity(want.len());
    for p in parts {
        found.extend(p?);
    }
    Ok(compare_versions(want, &found))
}

/// The replica audit ([`txn::replica_audit`]) of the cluster's memory nodes, after the
/// run: every backup compared with its primary. Errors: a memory node unreachable or a
/// READ failed.
pub(crate) fn replicas(
    fabric: &Fabric,
    addrs: &ClusterAddrs,
) -> anyhow::Result<txn::replica_audit::ReplicaAudit> {
    let t0 = std::time::Instant::now();
    let ctx = ThreadCtx::new(fabric.clone(), crate::run_runtime::get())?;
    let store =
        txn::cvt_remote::CvtRemote::connect_with(ctx.clone(), &addrs.memnodes, 16, run_view())
            .context("replica audit: connecting to the memory nodes")?;
    let a = block_on(&ctx, async move {
        txn::replica_audit::audit_replicas(&store).await
    })
    .context("replica audit")?;
    eprintln!(
        "audited {} backup(s) of {} partitions in {:.1} s",
        a.backups,
        a.partitions,
        t0.elapsed().as_secs_f64()
    );
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_durability_check_catches_an_object_behind_its_committed_version() {
        let mut h = txn::history::History::new(1 << 20);
        h.record(
            0,
            &[
                txn::history::Access::read(1, 7, 4),
                txn::history::Access::write(1, 7, 5),
                txn::history::Access::write(2, 9, 3),
            ],
        );
        h.record(0, &[txn::history::Access::write(1, 7, 6)]);
        let want = committed_versions([&h]);
        assert_eq!(want, vec![((1, 7), 6), ((2, 9), 3)]);
        assert!(compare_versions(&want, &[Some(6), Some(8)]).ok());
        // A promoted backup that missed the last install of (1, 7).
        let d = compare_versions(&want, &[Some(5), Some(3)]);
        assert!(!d.ok());
        assert_eq!(d.behind, Some((1, 7, 5, 6)));
        assert!(d.line().contains("1 of 2 objects LOST"), "{}", d.line());
        // An object gone altogether.
        assert!(!compare_versions(&want, &[Some(6), None]).ok());
    }

    #[test]
    fn the_kvs_check_catches_bad_missing_and_uncounted_values() {
        use txn::kvs::encode_value;
        let items = kvs_items(3, &[7]);
        let good = |counters: [u64; 4]| Audit {
            values: items
                .iter()
                .zip(counters)
                .map(|(&(_, k), c)| Some(encode_value(k, c, 40)))
                .collect(),
            cvt_locked: 0,
            lockd_held: None,
        };
        let c = kvs_check(&good([1, 0, 2, 0]), &items, 3, 3);
        assert!(c.ok() && c.found == 3);
        assert_eq!(
            c.line(),
            "kvs check: 3 records + 1 inserted, checksums ok, updates counted 3 = found 3"
        );
        // An update lost (or counted twice).
        let c = kvs_check(&good([1, 0, 2, 0]), &items, 3, 4);
        assert!(c.line().ends_with("updates counted 4 != found 3 (FAILED)"));
        // A planted corruption, another key's value, a missing key.
        let mut a = good([1, 0, 2, 0]);
        a.values[0].as_mut().unwrap()[12] ^= 1;
        a.values[1] = Some(encode_value(2, 0, 40));
        a.values[3] = None;
        let c = kvs_check(&a, &items, 3, 3);
        assert!(!c.ok());
        let line = c.line();
        assert!(
            line.contains("2 BAD VALUES (first: key 0: checksum"),
            "{line}"
        );
        assert!(line.contains("1 KEYS MISSING (first: 7)"), "{line}");
        assert!(line.ends_with("(FAILED)"), "{line}");
    }
}
