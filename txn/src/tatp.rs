//! TATP (Telecom Application Transaction Processing, benchmark description version 1.0,
//! Solid/IBM): its four tables as CVT tables, the data the specification generates at
//! load, and the consistency check of the tables after a run. The transaction profiles
//! live in the `bench` crate.
//!
//! Keys pack the primary keys into the 64-bit keys of the store (as FORD and Motor do):
//! - SUBSCRIBER: `s_id` (1 to P);
//! - ACCESS_INFO: `s_id * 4 + ai_type - 1` (`ai_type` 1 to 4);
//! - SPECIAL_FACILITY: `s_id * 4 + sf_type - 1` (`sf_type` 1 to 4);
//! - CALL_FORWARDING: `(s_id * 4 + sf_type - 1) * 3 + start_time / 8` (`start_time` 0, 8
//!   or 16).
//!
//! `sub_nbr` is `s_id` written as 15 decimal digits, so the transactions that look a
//! subscriber up by `sub_nbr` compute `s_id` from it (the usual implementation, FORD's
//! and Motor's, instead of a secondary index).
//!
//! Population (specification 3.1 to 3.4): every subscriber has 1 to 4 ACCESS_INFO rows
//! and 1 to 4 SPECIAL_FACILITY rows of distinct types (uniform counts), each special
//! facility 0 to 3 CALL_FORWARDING rows of distinct start times, `is_active` 1 with
//! probability 85%; `end_time = start_time + N(1..8)`. Generation is a deterministic
//! function of (`s_id`, seed), so a loader on each memory node produces its partition
//! without coordination.

use rrpc::fabric::{Fabric, MemoryRegion};
use tso::Timestamp;

use crate::cvt_remote::partition_of;
use crate::cvt_store::{CvtTableBuilder, CvtTableExport};
use crate::store::{KeyDraws, StoreError};

/// Table id of SUBSCRIBER.
pub const SUBSCRIBER: u32 = 0;
/// Table id of ACCESS_INFO.
pub const ACCESS_INFO: u32 = 1;
/// Table id of SPECIAL_FACILITY.
pub const SPECIAL_FACILITY: u32 = 2;
/// Table id of CALL_FORWARDING.
pub const CALL_FORWARDING: u32 = 3;

/// Bytes of a SUBSCRIBER row: `sub_nbr` (u64), `bit_1..10` (u16, bit i-1),
/// `hex_1..10` (u64, 4 bits each), `byte2_1..10` (10 bytes), `msc_location` (u32),
/// `vlr_location` (u32), 4 bytes of padding.
pub const SUBSCRIBER_BYTES: usize = 40;
/// Bytes of an ACCESS_INFO row: `data1`, `data2` (u8 each), `data3` (3 bytes), `data4`
/// (5 bytes), 6 bytes of padding.
pub const ACCESS_INFO_BYTES: usize = 16;
/// Bytes of a SPECIAL_FACILITY row: `is_active`, `error_cntrl`, `data_a` (u8 each),
/// `data_b` (5 bytes).
pub const SPECIAL_FACILITY_BYTES: usize = 8;
/// Bytes of a CALL_FORWARDING row: `end_time` (u8), `numberx` (15 bytes).
pub const CALL_FORWARDING_BYTES: usize = 16;

/// The start times a call forwarding may have (hours).
pub const START_TIMES: [u8; 3] = [0, 8, 16];

/// The loaded data's version: below every timestamp.
pub const LOAD_VERSION: Timestamp = Timestamp::ZERO;

/// Key of ACCESS_INFO (`s_id`, `ai_type` 1 to 4).
pub fn ai_key(s_id: u64, ai_type: u8) -> u64 {
    s_id * 4 + u64::from(ai_type - 1)
}

/// Key of SPECIAL_FACILITY (`s_id`, `sf_type` 1 to 4).
pub fn sf_key(s_id: u64, sf_type: u8) -> u64 {
    s_id * 4 + u64::from(sf_type - 1)
}

/// Key of CALL_FORWARDING (`s_id`, `sf_type` 1 to 4, `start_time` 0, 8 or 16).
pub fn cf_key(s_id: u64, sf_type: u8, start_time: u8) -> u64 {
    sf_key(s_id, sf_type) * 3 + u64::from(start_time / 8)
}

/// The (`s_id`, `sf_type`, `start_time`) of a CALL_FORWARDING key.
pub fn cf_parts(key: u64) -> (u64, u8, u8) {
    let sf = key / 3;
    (sf / 4, (sf % 4) as u8 + 1, (key % 3) as u8 * 8)
}

/// `sub_nbr` of a subscriber: `s_id` as 15 decimal digits.
pub fn sub_nbr(s_id: u64) -> String {
    format!("{s_id:015}")
}

/// The draws of one (seed, table, `s_id`): [`KeyDraws`] in TATP's domain.
fn draws(seed: u64, table: u32, s_id: u64) -> KeyDraws {
    KeyDraws::new(200, 17, seed, table, s_id)
}

/// A subscriber's generated SUBSCRIBER row.
pub fn subscriber_row(seed: u64, s_id: u64) -> Vec<u8> {
    let mut d = draws(seed, SUBSCRIBER, s_id);
    let mut r = vec![0u8; SUBSCRIBER_BYTES];
    r[0..8].copy_from_slice(&s_id.to_le_bytes());
    r[8..10].copy_from_slice(&((d.draw() & 0x3ff) as u16).to_le_bytes());
    r[10..18].copy_from_slice(&(d.draw() & 0xff_ffff_ffff).to_le_bytes());
    for b in &mut r[18..28] {
        *b = d.draw() as u8;
    }
    r[28..32].copy_from_slice(&(d.draw() as u32).to_le_bytes());
    r[32..36].copy_from_slice(&(d.draw() as u32).to_le_bytes());
    r
}

/// The `sub_nbr` field of a SUBSCRIBER row, as a number.
pub fn row_sub_nbr(row: &[u8]) -> u64 {
    u64::from_le_bytes(row[0..8].try_into().expect("8 bytes"))
}

/// The generated rows of one subscriber in the three other tables:
/// `(table, key, row)`.
pub fn subscriber_rows(seed: u64, s_id: u64) -> Vec<(u32, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut d = draws(seed, ACCESS_INFO, s_id);
    let n = d.range(1, 4);
    for (i, _) in d.subset(4, n).iter().enumerate().filter(|c| *c.1) {
        let mut r = vec![0u8; ACCESS_INFO_BYTES];
        for b in &mut r[..10] {
            *b = d.draw() as u8;
        }
        out.push((ACCESS_INFO, ai_key(s_id, i as u8 + 1), r));
    }
    let mut d = draws(seed, SPECIAL_FACILITY, s_id);
    let n = d.range(1, 4);
    for (i, _) in d.subset(4, n).iter().enumerate().filter(|c| *c.1) {
        let sf_type = i as u8 + 1;
        let mut r = vec![0u8; SPECIAL_FACILITY_BYTES];
        r[0] = u8::from(d.draw() % 100 < 85);
        for b in &mut r[1..] {
            *b = d.draw() as u8;
        }
        out.push((SPECIAL_FACILITY, sf_key(s_id, sf_type), r));
        let n_cf = d.range(0, 3);
        let chosen = d.subset(START_TIMES.len(), n_cf);
        for (j, &start) in START_TIMES.iter().enumerate() {
            if chosen[j] {
                out.push((
                    CALL_FORWARDING,
                    cf_key(s_id, sf_type, start),
                    call_forwarding_row(start, d.range(1, 8) as u8, d.draw()),
                ));
            }
        }
    }
    out
}

/// A CALL_FORWARDING row: `end_time = start_time + hours`, `numberx` from `number`.
pub fn call_forwarding_row(start_time: u8, hours: u8, number: u64) -> Vec<u8> {
    let mut r = vec![0u8; CALL_FORWARDING_BYTES];
    r[0] = start_time + hours;
    let digits = format!("{:015}", number % 1_000_000_000_000_000);
    r[1..16].copy_from_slice(digits.as_bytes());
    r
}

/// The tables' names, row sizes and capacities for `subscribers` subscribers, per
/// partition of `partitions` (room for inserted call forwardings: up to 12 per
/// subscriber).
fn tables(subscribers: u64, partitions: u32) -> [(u32, &'static str, usize, u64); 4] {
    let share = subscribers.div_ceil(u64::from(partitions.max(1))) * 5 / 4 + 16;
    [
        (SUBSCRIBER, "subscriber", SUBSCRIBER_BYTES, share),
        (ACCESS_INFO, "access_info", ACCESS_INFO_BYTES, share * 4),
        (
            SPECIAL_FACILITY,
            "special_facility",
            SPECIAL_FACILITY_BYTES,
            share * 4,
        ),
        (
            CALL_FORWARDING,
            "call_forwarding",
            CALL_FORWARDING_BYTES,
            share * 12,
        ),
    ]
}

/// Build the four tables of partition `partition` of `partitions` for subscribers `1..=
/// subscribers`, generated with `seed`, as CVT tables of `versions` cells, loaded at
/// [`LOAD_VERSION`]. Errors: registering memory failed.
pub fn load(
    fabric: &Fabric,
    subscribers: u64,
    seed: u64,
    versions: usize,
    partition: u32,
    partitions: u32,
) -> Result<Vec<(CvtTableExport, [MemoryRegion; 3])>, StoreError> {
    let mut builders = tables(subscribers, partitions)
        .into_iter()
        .map(|(id, name, len, cap)| CvtTableBuilder::new(fabric, id, name, versions, len, cap))
        .collect::<Result<Vec<_>, _>>()?;
    let mine = |t: u32, k: u64| partition_of(t, k, partitions) == partition;
    for s_id in 1..=subscribers {
        if mine(SUBSCRIBER, s_id) {
            builders[SUBSCRIBER as usize].insert(
                s_id,
                &subscriber_row(seed, s_id),
                LOAD_VERSION,
            )?;
        }
        for (t, k, row) in subscriber_rows(seed, s_id) {
            if mine(t, k) {
                builders[t as usize].insert(k, &row, LOAD_VERSION)?;
            }
        }
    }
    Ok(builders.into_iter().map(CvtTableBuilder::finish).collect())
}

/// What the consistency check found wrong (the first few of each).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Consistency {
    /// Subscribers checked.
    pub subscribers: u64,
    /// Rows seen per table.
    pub rows: [u64; 4],
    /// Violations, as lines.
    pub violations: Vec<String>,
    /// Violations in all (`violations` keeps the first 10).
    pub count: u64,
}

impl Consistency {
    fn flag(&mut self, what: String) {
        self.count += 1;
        if self.violations.len() < 10 {
            self.violations.push(what);
        }
    }

    /// True when nothing was found.
    pub fn holds(&self) -> bool {
        self.count == 0
    }

    /// One line for reports: `tatp consistency: N subscribers, rows a/b/c/d: ok` or the
    /// violations.
    pub fn line(&self) -> String {
        let head = format!(
            "tatp consistency: {} subscribers, rows {}/{}/{}/{} (subscriber/access_info/special_facility/call_forwarding)",
            self.subscribers, self.rows[0], self.rows[1], self.rows[2], self.rows[3]
        );
        if self.holds() {
            format!("{head}: ok")
        } else {
            format!(
                "{head}: {} VIOLATION(S): {}",
                self.count,
                self.violations.join("; ")
            )
        }
    }
}

/// The consistency check of the four tables after a run, over `row(table, key)` (the
/// committed row, `None` when absent):
/// 1. every subscriber `1..=P` exists and its `sub_nbr` is its `s_id` (its row was
///    only ever updated in its other fields);
/// 2. every subscriber has 1 to 4 ACCESS_INFO rows and 1 to 4 SPECIAL_FACILITY rows (no
///    transaction inserts or deletes them), the same ones as loaded;
/// 3. every CALL_FORWARDING row belongs to an existing SPECIAL_FACILITY row (referential
///    integrity: the insert transaction checks it) and ends 1 to 8 hours after its
///    start (loaded and inserted rows alike).
///
/// A key outside these patterns cannot be asked; the caller walks every possible key
/// (21 per subscriber).
pub fn check(
    subscribers: u64,
    seed: u64,
    mut row: impl FnMut(u32, u64) -> Option<Vec<u8>>,
) -> Consistency {
    let mut c = Consistency {
        subscribers,
        ..Consistency::default()
    };
    for s_id in 1..=subscribers {
        match row(SUBSCRIBER, s_id) {
            Some(r) => {
                c.rows[0] += 1;
                if row_sub_nbr(&r) != s_id {
                    c.flag(format!("subscriber {s_id} has sub_nbr {}", row_sub_nbr(&r)));
                }
            }
            None => c.flag(format!("subscriber {s_id} missing")),
        }
        let loaded: Vec<(u32, u64)> = subscriber_rows(seed, s_id)
            .into_iter()
            .filter(|(t, _, _)| *t != CALL_FORWARDING)
            .map(|(t, k, _)| (t, k))
            .collect();
        for (table, n) in [(ACCESS_INFO, 1usize), (SPECIAL_FACILITY, 2)] {
            let mut found = 0;
            for ty in 1..=4u8 {
                let k = ai_key(s_id, ty); // same packing for both tables
                let present = row(table, k).is_some();
                found += usize::from(present);
                if present != loaded.contains(&(table, k)) {
                    c.flag(format!(
                        "subscriber {s_id}: table {table} type {ty} {} though it was {}loaded",
                        if present { "present" } else { "absent" },
                        if present { "not " } else { "" }
                    ));
                }
            }
            c.rows[n] += found as u64;
            if !(1..=4).contains(&found) {
                c.flag(format!("subscriber {s_id}: {found} rows in table {table}"));
            }
        }
        for sf_type in 1..=4u8 {
            let sf = row(SPECIAL_FACILITY, sf_key(s_id, sf_type)).is_some();
            for &start in &START_TIMES {
                let Some(r) = row(CALL_FORWARDING, cf_key(s_id, sf_type, start)) else {
                    continue;
                };
                c.rows[3] += 1;
                if !sf {
                    c.flag(format!(
                        "call forwarding ({s_id}, {sf_type}, {start}) without its special facility"
                    ));
                }
                if !(r[0] > start && r[0] <= start + 8) {
                    c.flag(format!(
                        "call forwarding ({s_id}, {sf_type}, {start}) ends at {}",
                        r[0]
                    ));
                }
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn population(n: u64) -> HashMap<(u32, u64), Vec<u8>> {
        let mut m = HashMap::new();
        for s in 1..=n {
            m.insert((SUBSCRIBER, s), subscriber_row(7, s));
            for (t, k, r) in subscriber_rows(7, s) {
                assert!(m.insert((t, k), r).is_none(), "key {k} of table {t} twice");
            }
        }
        m
    }

    #[test]
    fn two_partitions_load_the_whole_population() {
        use rrpc::fabric::shm::ClusterGuard;
        use rrpc::fabric::{FabricConfig, FabricKind};
        let (g, _) = ClusterGuard::new(&format!("tatp-load-{}", std::process::id())).unwrap();
        let n = 500;
        let mut rows = [0u64; 4];
        for p in 0..2 {
            let f = Fabric::open(&FabricConfig::new(
                FabricKind::Shm,
                g.name(),
                rrpc::NodeId(p + 1),
            ))
            .unwrap();
            for (e, _) in load(&f, n, 7, 2, p, 2).unwrap() {
                assert_eq!(e.versions, 2);
                rows[e.id as usize] += e.records_loaded;
            }
        }
        let m = population(n);
        for t in 0..4u32 {
            let want = m.keys().filter(|k| k.0 == t).count() as u64;
            assert_eq!(rows[t as usize], want, "table {t}");
        }
    }

    #[test]
    fn keys_pack_and_unpack() {
        assert_eq!(cf_parts(cf_key(12345, 3, 16)), (12345, 3, 16));
        assert_eq!(cf_parts(cf_key(1, 1, 0)), (1, 1, 0));
        assert_eq!(sub_nbr(42), "000000000000042");
        assert_ne!(ai_key(1, 4), ai_key(2, 1));
    }

    #[test]
    fn the_population_follows_the_specification() {
        let n = 2000;
        let m = population(n);
        let count = |t: u32| m.keys().filter(|k| k.0 == t).count() as f64 / n as f64;
        // 1 to 4 uniform: 2.5 per subscriber; call forwardings 0 to 3 per facility: 1.5.
        assert!(
            (count(ACCESS_INFO) - 2.5).abs() < 0.1,
            "{}",
            count(ACCESS_INFO)
        );
        assert!((count(SPECIAL_FACILITY) - 2.5).abs() < 0.1);
        let cf = count(CALL_FORWARDING) / count(SPECIAL_FACILITY);
        assert!((cf - 1.5).abs() < 0.1, "{cf} call forwardings per facility");
        let active = m
            .iter()
            .filter(|(k, r)| k.0 == SPECIAL_FACILITY && r[0] == 1)
            .count() as f64
            / (count(SPECIAL_FACILITY) * n as f64);
        assert!((active - 0.85).abs() < 0.03, "{active}");
        // Deterministic: the same seed gives the same rows.
        assert_eq!(subscriber_rows(7, 99), subscriber_rows(7, 99));
        assert_ne!(subscriber_rows(7, 99), subscriber_rows(8, 99));
    }

    #[test]
    fn the_check_passes_the_loaded_data_and_catches_each_planted_violation() {
        let n = 300;
        let m = population(n);
        let check_with =
            |m: &HashMap<(u32, u64), Vec<u8>>| check(n, 7, |t, k| m.get(&(t, k)).cloned());
        let ok = check_with(&m);
        assert!(ok.holds(), "{}", ok.line());
        assert!(ok.line().ends_with(": ok"));
        assert_eq!(ok.rows[0], n);

        // A call forwarding whose special facility is gone.
        let (&(_, cf), _) = m.iter().find(|(k, _)| k.0 == CALL_FORWARDING).unwrap();
        let (s, sf, _) = cf_parts(cf);
        let mut bad = m.clone();
        bad.remove(&(SPECIAL_FACILITY, sf_key(s, sf)));
        let v = check_with(&bad);
        assert!(
            v.line().contains("without its special facility"),
            "{}",
            v.line()
        );

        // A subscriber lost; a wrong sub_nbr; an access info inserted; a bad end time.
        let mut bad = m.clone();
        bad.remove(&(SUBSCRIBER, 5));
        assert!(check_with(&bad).line().contains("subscriber 5 missing"));
        let mut bad = m.clone();
        bad.insert((SUBSCRIBER, 6), subscriber_row(7, 9));
        assert!(check_with(&bad)
            .line()
            .contains("subscriber 6 has sub_nbr 9"));
        let mut bad = m.clone();
        let free = (1..=n)
            .flat_map(|s| (1..=4).map(move |t| ai_key(s, t)))
            .find(|k| !m.contains_key(&(ACCESS_INFO, *k)))
            .expect("some subscriber has fewer than 4 access infos");
        bad.insert((ACCESS_INFO, free), vec![0; ACCESS_INFO_BYTES]);
        assert!(check_with(&bad)
            .line()
            .contains("present though it was not loaded"));
        let mut bad = m.clone();
        bad.get_mut(&(CALL_FORWARDING, cf)).unwrap()[0] = 0;
        assert!(check_with(&bad).line().contains(" ends at 0"));
    }
}
