//! TPC-C (standard specification 5.11): its nine tables as CVT tables, the initial
//! population of clause 4.3.3.1, two secondary indexes (customers by last name, each
//! customer's last order), and the
//! consistency conditions 1 to 4 of clause 3.3.2 checked after a run. The transaction
//! profiles live in the `bench` crate.
//!
//! Three fields live in rows of their own (vertical partitioning, which clause 1.6
//! allows): `w_ytd` (WAREHOUSE_YTD), `d_ytd` (DISTRICT_YTD) and DELIVERY's cursor, the
//! oldest undelivered order of a district (DELIVERY_CURSOR, standing in for the ordered
//! scan of NEW_ORDER of clause 2.7.4.2). PAYMENT writes only the YTD rows, NEW-ORDER only
//! `d_next_o_id`, DELIVERY only the cursor, so a transaction conflicts with another only
//! over data both really use (the specification's rows would make every PAYMENT conflict
//! with every NEW-ORDER of its district over the one DISTRICT row).
//!
//! Rows are fixed-size byte records with the fields the five transactions and the
//! consistency conditions use at fixed offsets (see each `*_BYTES` constant); text
//! fields the transactions never read are filler of the specification's length, so
//! records have their real sizes (CUSTOMER is 672 bytes, the papers' largest record).
//!
//! Keys pack the primary keys (warehouses up to 65,535, order ids up to 2^28):
//! - DISTRICT `(w, d)`: `w * 16 + d`; CUSTOMER `(w, d, c)`: `district * 4096 + c`;
//! - ORDER and NEW_ORDER `(w, d, o)`: `district << 28 | o`; ORDER_LINE: `order * 16 + ol`;
//! - ITEM `i`; STOCK `(w, i)`: `w << 17 | i`;
//! - HISTORY: loaded rows use the customer's key, rows inserted at run time
//!   [`history_key`] (a client's own sequence, never colliding);
//! - CUSTOMER_BY_NAME `(w, d, last name number 0..999)`: `district * 1024 + n`, a row
//!   listing the customers of that last name sorted by first name (the secondary index
//!   of clause 2.5.2.2 and 2.6.2.2, static since customers are never added).
//!
//! Generation is a deterministic function of the row's key and the seed, so each memory
//! node loads its partition on its own.

use rrpc::fabric::{Fabric, MemoryRegion};
use tso::Timestamp;

use crate::cvt_remote::partition_of;
use crate::cvt_store::{CvtTableBuilder, CvtTableExport};
use crate::store::{KeyDraws, StoreError};

/// Table ids.
pub const WAREHOUSE: u32 = 0;
/// DISTRICT.
pub const DISTRICT: u32 = 1;
/// CUSTOMER.
pub const CUSTOMER: u32 = 2;
/// HISTORY.
pub const HISTORY: u32 = 3;
/// NEW_ORDER.
pub const NEW_ORDER: u32 = 4;
/// ORDER.
pub const ORDER: u32 = 5;
/// ORDER_LINE.
pub const ORDER_LINE: u32 = 6;
/// ITEM.
pub const ITEM: u32 = 7;
/// STOCK.
pub const STOCK: u32 = 8;
/// CUSTOMER_BY_NAME (the last-name index).
pub const CUSTOMER_BY_NAME: u32 = 9;
/// CUSTOMER_LAST_ORDER: each customer's most recent order id (the index ORDER-STATUS
/// needs, clause 2.6.2.2; NEW-ORDER maintains it).
pub const CUSTOMER_LAST_ORDER: u32 = 10;
/// WAREHOUSE_YTD: `w_ytd` of a warehouse (key `w`).
pub const WAREHOUSE_YTD: u32 = 11;
/// DISTRICT_YTD: `d_ytd` of a district (key [`district_key`]).
pub const DISTRICT_YTD: u32 = 12;
/// DELIVERY_CURSOR: a district's oldest undelivered order (key [`district_key`]); the
/// district's NEW_ORDER rows are exactly this one to `d_next_o_id - 1`.
pub const DELIVERY_CURSOR: u32 = 13;
/// Tables, ids `0..TABLES`.
pub const TABLES: usize = 14;

/// Districts per warehouse.
pub const DISTRICTS: u8 = 10;
/// Customers per district.
pub const CUSTOMERS: u16 = 3000;
/// Items.
pub const ITEMS: u32 = 100_000;
/// Orders per district at load.
pub const ORDERS: u32 = 3000;
/// The first undelivered order at load (orders 2101 to 3000 are new orders).
pub const FIRST_NEW_ORDER: u32 = 2101;
/// Customers one CUSTOMER_BY_NAME row lists at most: NURand's skew puts up to about 70
/// of a district's 3000 customers under one last name (simulated); a longer list would
/// be cut, which the population test would notice.
pub const NAME_INDEX_SLOTS: usize = 128;

/// WAREHOUSE row: `w_tax` u32 (1/10000) @8, filler to 96 (`w_ytd` is in WAREHOUSE_YTD).
pub const WAREHOUSE_BYTES: usize = 96;
/// DISTRICT row: `d_tax` u32 @8, `d_next_o_id` u32 @12, filler to 96 (`d_ytd` is in
/// DISTRICT_YTD, DELIVERY's cursor in DELIVERY_CURSOR).
pub const DISTRICT_BYTES: usize = 96;
/// WAREHOUSE_YTD and DISTRICT_YTD rows: the year-to-date balance i64 cents @0.
pub const YTD_BYTES: usize = 8;
/// DELIVERY_CURSOR row: the oldest undelivered order id u32 @0.
pub const DELIVERY_CURSOR_BYTES: usize = 8;
/// CUSTOMER row: `c_balance` i64 @0, `c_ytd_payment` i64 @8, `c_payment_cnt` u32 @16,
/// `c_delivery_cnt` u32 @20, `c_discount` u32 (1/10000) @24, `c_credit` 2 bytes @28
/// ("GC"/"BC"), last name number u16 @30, `c_first` 16 bytes @32, `c_data` 500 bytes
/// @48, filler to 672.
pub const CUSTOMER_BYTES: usize = 672;
/// HISTORY row: `h_amount` i64 @0, `h_c_id` u16 @8, `h_c_d_id` u8 @10, `h_c_w_id` u16
/// @12, `h_d_id` u8 @14, `h_w_id` u16 @16, `h_date` u64 @24, `h_data` 24 bytes @32.
pub const HISTORY_BYTES: usize = 56;
/// NEW_ORDER row: nothing but its key (8 bytes of zeros).
pub const NEW_ORDER_BYTES: usize = 8;
/// ORDER row: `o_c_id` u16 @0, `o_carrier_id` u8 @2 (0 = null), `o_ol_cnt` u8 @3,
/// `o_all_local` u8 @4, `o_entry_d` u64 @8.
pub const ORDER_BYTES: usize = 16;
/// ORDER_LINE row: `ol_i_id` u32 @0, `ol_supply_w_id` u16 @4, `ol_quantity` u8 @6,
/// `ol_amount` i64 @8, `ol_delivery_d` u64 @16 (0 = null), `ol_dist_info` 24 bytes @24.
pub const ORDER_LINE_BYTES: usize = 48;
/// ITEM row: `i_price` i64 cents @0, `i_im_id` u32 @8, `i_name` 24 bytes @12, `i_data`
/// 50 bytes @36, filler to 88.
pub const ITEM_BYTES: usize = 88;
/// STOCK row: `s_quantity` i32 @0, `s_ytd` i64 @8, `s_order_cnt` u32 @16,
/// `s_remote_cnt` u32 @20, `s_dist_01..10` 24 bytes each @24, `s_data` 50 bytes @264,
/// filler to 320.
pub const STOCK_BYTES: usize = 320;
/// CUSTOMER_BY_NAME row: count u16 @0, then up to [`NAME_INDEX_SLOTS`] `c_id`s (u16),
/// sorted by first name.
pub const CUSTOMER_BY_NAME_BYTES: usize = 2 + 2 * NAME_INDEX_SLOTS;

/// CUSTOMER_LAST_ORDER row: `o_id` u32 @0.
pub const CUSTOMER_LAST_ORDER_BYTES: usize = 8;

/// The loaded data's version: below every timestamp.
pub const LOAD_VERSION: Timestamp = Timestamp::ZERO;

/// DISTRICT key.
pub fn district_key(w: u16, d: u8) -> u64 {
    u64::from(w) * 16 + u64::from(d)
}
/// CUSTOMER key.
pub fn customer_key(w: u16, d: u8, c: u16) -> u64 {
    district_key(w, d) * 4096 + u64::from(c)
}
/// ORDER and NEW_ORDER key.
pub fn order_key(w: u16, d: u8, o: u32) -> u64 {
    district_key(w, d) << 28 | u64::from(o)
}
/// ORDER_LINE key (`ol` 1 to 15).
pub fn order_line_key(w: u16, d: u8, o: u32, ol: u8) -> u64 {
    order_key(w, d, o) * 16 + u64::from(ol)
}
/// STOCK key.
pub fn stock_key(w: u16, i: u32) -> u64 {
    u64::from(w) << 17 | u64::from(i)
}
/// CUSTOMER_BY_NAME key (`name` 0 to 999).
pub fn name_key(w: u16, d: u8, name: u16) -> u64 {
    district_key(w, d) * 1024 + u64::from(name)
}
/// HISTORY key of a row inserted at run time: bit 63 set, then the client's tag and its
/// sequence number (loaded rows use customer keys, below 2^40).
pub fn history_key(client_tag: u32, seq: u32) -> u64 {
    1 << 63 | u64::from(client_tag) << 32 | u64::from(seq)
}

/// The syllables of clause 4.3.2.3.
const SYLLABLES: [&str; 10] = [
    "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
];

/// Last name number `n` (0 to 999) as the specification spells it.
pub fn last_name(n: u16) -> String {
    let d = [n / 100, n / 10 % 10, n % 10];
    d.iter().map(|&i| SYLLABLES[i as usize]).collect()
}

/// The constant `C` of `NURand(255, 0, 999)` for last names at load (clause 2.1.6).
pub const C_LAST_LOAD: u64 = 157;

/// Lines of loaded order `(w, d, o)` (5 to 15; the population's `o_ol_cnt`).
pub fn order_line_count(seed: u64, w: u16, d: u8, o: u32) -> u8 {
    draws(seed, ORDER, order_key(w, d, o)).range(5, 15) as u8
}

/// The loaded rows of the tables a range index keeps ordered for DELIVERY and
/// STOCK-LEVEL (`txn-bench --range-index`): every NEW_ORDER row (orders 2101 to 3000 of
/// each district) and every ORDER_LINE row of warehouses `1..=warehouses`, as (table,
/// key) in key order.
pub fn range_index_keys(seed: u64, warehouses: u16) -> Vec<(u32, u64)> {
    let mut new_orders = Vec::new();
    let mut lines = Vec::new();
    for w in 1..=warehouses {
        for d in 1..=DISTRICTS {
            for o in 1..=ORDERS {
                if o >= FIRST_NEW_ORDER {
                    new_orders.push((NEW_ORDER, order_key(w, d, o)));
                }
                for ol in 1..=order_line_count(seed, w, d, o) {
                    lines.push((ORDER_LINE, order_line_key(w, d, o, ol)));
                }
            }
        }
    }
    new_orders.extend(lines);
    new_orders
}

/// The draws of one (seed, table, key): [`KeyDraws`] in TPC-C's domain.
fn draws(seed: u64, table: u32, key: u64) -> KeyDraws {
    KeyDraws::new(300, 23, seed, table, key)
}

/// Last name number of customer `c` of `(w, d)`: `c - 1` for the first 1000, else
/// `NURand(255, 0, 999)` (clause 4.3.3.1).
pub fn customer_last_name(seed: u64, w: u16, d: u8, c: u16) -> u16 {
    if c <= 1000 {
        c - 1
    } else {
        draws(seed, CUSTOMER_BY_NAME, customer_key(w, d, c)).nurand(255, C_LAST_LOAD, 0, 999) as u16
    }
}

/// Customer `c`'s first name (16 bytes, for the index's order).
fn first_name(seed: u64, w: u16, d: u8, c: u16) -> [u8; 16] {
    let mut r = draws(seed, CUSTOMER, customer_key(w, d, c) ^ 0xf1);
    let mut f = [0u8; 16];
    for b in &mut f {
        *b = b'a' + (r.draw() % 26) as u8;
    }
    f
}

fn put_u16(r: &mut [u8], at: usize, v: u16) {
    r[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(r: &mut [u8], at: usize, v: u32) {
    r[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_i64(r: &mut [u8], at: usize, v: i64) {
    r[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
/// Little-endian `u16` at `at`.
pub fn get_u16(r: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(r[at..at + 2].try_into().expect("2 bytes"))
}
/// Little-endian `u32` at `at`.
pub fn get_u32(r: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(r[at..at + 4].try_into().expect("4 bytes"))
}
/// Little-endian `i64` at `at`.
pub fn get_i64(r: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(r[at..at + 8].try_into().expect("8 bytes"))
}

/// The initial `o_c_id` of order `o` of `(w, d)`: a permutation of 1..=3000 per district.
fn order_customer(seed: u64, w: u16, d: u8, o: u32) -> u16 {
    // An affine permutation of 0..3000 with a multiplier coprime to 3000.
    let k = draws(seed, ORDER, district_key(w, d)).range(0, 2999);
    ((u64::from(o - 1) * 7 + k) % 3000 + 1) as u16
}

/// Every row of warehouse `w` (and, when `items`, the ITEM table) as `(table, key, row)`,
/// handed to `emit` one at a time.
pub fn generate(seed: u64, w: u16, items: bool, mut emit: impl FnMut(u32, u64, Vec<u8>)) {
    if items {
        for i in 1..=ITEMS {
            let mut r = vec![0u8; ITEM_BYTES];
            let mut g = draws(seed, ITEM, u64::from(i));
            put_i64(&mut r, 0, g.range(100, 10_000) as i64);
            put_u32(&mut r, 8, g.range(1, 10_000) as u32);
            if g.range(1, 10) == 1 {
                r[36..44].copy_from_slice(b"ORIGINAL");
            }
            emit(ITEM, u64::from(i), r);
        }
    }
    let mut ytd = vec![0u8; YTD_BYTES];
    put_i64(&mut ytd, 0, 30_000_000);
    emit(WAREHOUSE_YTD, u64::from(w), ytd);
    let mut r = vec![0u8; WAREHOUSE_BYTES];
    put_u32(
        &mut r,
        8,
        draws(seed, WAREHOUSE, u64::from(w)).range(0, 2000) as u32,
    );
    emit(WAREHOUSE, u64::from(w), r);
    for i in 1..=ITEMS {
        let mut r = vec![0u8; STOCK_BYTES];
        let mut g = draws(seed, STOCK, stock_key(w, i));
        put_u32(&mut r, 0, g.range(10, 100) as u32);
        for b in &mut r[24..264] {
            *b = b'a' + (g.draw() % 26) as u8;
        }
        emit(STOCK, stock_key(w, i), r);
    }
    for d in 1..=DISTRICTS {
        let mut r = vec![0u8; DISTRICT_BYTES];
        put_u32(
            &mut r,
            8,
            draws(seed, DISTRICT, district_key(w, d)).range(0, 2000) as u32,
        );
        put_u32(&mut r, 12, ORDERS + 1);
        emit(DISTRICT, district_key(w, d), r);
        let mut ytd = vec![0u8; YTD_BYTES];
        put_i64(&mut ytd, 0, 3_000_000);
        emit(DISTRICT_YTD, district_key(w, d), ytd);
        let mut cursor = vec![0u8; DELIVERY_CURSOR_BYTES];
        put_u32(&mut cursor, 0, FIRST_NEW_ORDER);
        emit(DELIVERY_CURSOR, district_key(w, d), cursor);
        let mut by_name: Vec<Vec<([u8; 16], u16)>> = vec![Vec::new(); 1000];
        for c in 1..=CUSTOMERS {
            let key = customer_key(w, d, c);
            let mut g = draws(seed, CUSTOMER, key);
            let mut r = vec![0u8; CUSTOMER_BYTES];
            put_i64(&mut r, 0, -1000);
            put_i64(&mut r, 8, 1000);
            put_u32(&mut r, 16, 1);
            put_u32(&mut r, 24, g.range(0, 5000) as u32);
            r[28..30].copy_from_slice(if g.range(1, 10) == 1 { b"BC" } else { b"GC" });
            let name = customer_last_name(seed, w, d, c);
            put_u16(&mut r, 30, name);
            let first = first_name(seed, w, d, c);
            r[32..48].copy_from_slice(&first);
            by_name[name as usize].push((first, c));
            emit(CUSTOMER, key, r);
            let mut h = vec![0u8; HISTORY_BYTES];
            put_i64(&mut h, 0, 1000);
            put_u16(&mut h, 8, c);
            h[10] = d;
            put_u16(&mut h, 12, w);
            h[14] = d;
            put_u16(&mut h, 16, w);
            emit(HISTORY, key, h);
        }
        for (n, mut cs) in by_name.into_iter().enumerate() {
            if cs.is_empty() {
                continue;
            }
            cs.sort();
            cs.truncate(NAME_INDEX_SLOTS);
            let mut r = vec![0u8; CUSTOMER_BY_NAME_BYTES];
            put_u16(&mut r, 0, cs.len() as u16);
            for (i, (_, c)) in cs.iter().enumerate() {
                put_u16(&mut r, 2 + 2 * i, *c);
            }
            emit(CUSTOMER_BY_NAME, name_key(w, d, n as u16), r);
        }
        for o in 1..=ORDERS {
            let mut g = draws(seed, ORDER, order_key(w, d, o));
            let delivered = o < FIRST_NEW_ORDER;
            let ol_cnt = g.range(5, 15) as u8;
            let mut r = vec![0u8; ORDER_BYTES];
            let customer = order_customer(seed, w, d, o);
            put_u16(&mut r, 0, customer);
            let mut last = vec![0u8; CUSTOMER_LAST_ORDER_BYTES];
            put_u32(&mut last, 0, o);
            emit(CUSTOMER_LAST_ORDER, customer_key(w, d, customer), last);
            r[2] = if delivered { g.range(1, 10) as u8 } else { 0 };
            r[3] = ol_cnt;
            r[4] = 1;
            emit(ORDER, order_key(w, d, o), r);
            for ol in 1..=ol_cnt {
                let mut r = vec![0u8; ORDER_LINE_BYTES];
                put_u32(&mut r, 0, g.range(1, u64::from(ITEMS)) as u32);
                put_u16(&mut r, 4, w);
                r[6] = 5;
                put_i64(
                    &mut r,
                    8,
                    if delivered {
                        0
                    } else {
                        g.range(1, 999_999) as i64
                    },
                );
                if delivered {
                    r[16..24].copy_from_slice(&1u64.to_le_bytes());
                }
                emit(ORDER_LINE, order_line_key(w, d, o, ol), r);
            }
            if !delivered {
                emit(NEW_ORDER, order_key(w, d, o), vec![0u8; NEW_ORDER_BYTES]);
            }
        }
    }
}

/// Each table's name, row size and capacity (records) per partition for `warehouses`,
/// with room for the rows a run inserts: twice the loaded orders and their lines, three
/// times the loaded history.
fn tables(warehouses: u16, partitions: u32) -> [(u32, &'static str, usize, u64); TABLES] {
    let w = u64::from(warehouses);
    let p = u64::from(partitions.max(1));
    let share = |n: u64| n.div_ceil(p) * 5 / 4 + 64;
    let dists = w * u64::from(DISTRICTS);
    [
        (WAREHOUSE, "warehouse", WAREHOUSE_BYTES, share(w)),
        (DISTRICT, "district", DISTRICT_BYTES, share(dists)),
        (CUSTOMER, "customer", CUSTOMER_BYTES, share(dists * 3000)),
        (HISTORY, "history", HISTORY_BYTES, share(dists * 9000)),
        (NEW_ORDER, "new_order", NEW_ORDER_BYTES, share(dists * 3000)),
        (ORDER, "order", ORDER_BYTES, share(dists * 6000)),
        (
            ORDER_LINE,
            "order_line",
            ORDER_LINE_BYTES,
            share(dists * 60_000),
        ),
        (ITEM, "item", ITEM_BYTES, u64::from(ITEMS) * 5 / 4 + 64),
        (STOCK, "stock", STOCK_BYTES, share(w * u64::from(ITEMS))),
        (
            CUSTOMER_BY_NAME,
            "customer_by_name",
            CUSTOMER_BY_NAME_BYTES,
            share(dists * 1000),
        ),
        (
            CUSTOMER_LAST_ORDER,
            "customer_last_order",
            CUSTOMER_LAST_ORDER_BYTES,
            share(dists * 3000),
        ),
        (WAREHOUSE_YTD, "warehouse_ytd", YTD_BYTES, share(w)),
        (DISTRICT_YTD, "district_ytd", YTD_BYTES, share(dists)),
        (
            DELIVERY_CURSOR,
            "delivery_cursor",
            DELIVERY_CURSOR_BYTES,
            share(dists),
        ),
    ]
}

/// Build the fourteen tables of partition `partition` of `partitions` for warehouses
/// `1..=warehouses` generated with `seed`, as CVT tables of `versions` cells. ITEM is
/// replicated on every memory node (it is read-only). Errors: registering memory failed.
pub fn load(
    fabric: &Fabric,
    warehouses: u16,
    seed: u64,
    versions: usize,
    partition: u32,
    partitions: u32,
) -> Result<Vec<(CvtTableExport, [MemoryRegion; 3])>, StoreError> {
    let mut builders = tables(warehouses, partitions)
        .into_iter()
        .map(|(id, name, len, cap)| CvtTableBuilder::new(fabric, id, name, versions, len, cap))
        .collect::<Result<Vec<_>, _>>()?;
    let mut err = None;
    for w in 1..=warehouses {
        generate(seed, w, w == 1, |t, k, row| {
            if err.is_some() {
                return;
            }
            if t == ITEM || partition_of(t, k, partitions) == partition {
                if let Err(e) = builders[t as usize].insert(k, &row, LOAD_VERSION) {
                    err = Some(e);
                }
            }
        });
    }
    if let Some(e) = err {
        return Err(e);
    }
    Ok(builders.into_iter().map(CvtTableBuilder::finish).collect())
}

/// The consistency conditions' findings (clause 3.3.2.1 to 3.3.2.4).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Consistency {
    /// Districts checked.
    pub districts: u64,
    /// Violations by condition (1 to 4), counted.
    pub counts: [u64; 4],
    /// The first few violations, as lines.
    pub violations: Vec<String>,
}

impl Consistency {
    fn flag(&mut self, cond: usize, what: String) {
        self.counts[cond - 1] += 1;
        if self.violations.len() < 10 {
            self.violations.push(format!("condition {cond}: {what}"));
        }
    }

    /// True when all four conditions hold.
    pub fn holds(&self) -> bool {
        self.counts.iter().all(|&c| c == 0)
    }

    /// `consistency 1-4: ok (N districts)`, or which failed and where.
    pub fn line(&self) -> String {
        if self.holds() {
            format!("consistency 1-4: ok ({} districts)", self.districts)
        } else {
            let failed: Vec<String> = self
                .counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, c)| format!("{} failed {c} time(s)", i + 1))
                .collect();
            format!(
                "consistency 1-4: {} ({} districts): {}",
                failed.join(", "),
                self.districts,
                self.violations.join("; ")
            )
        }
    }
}

/// Check the consistency conditions 1 to 4 over `row(table, key)` (the committed row,
/// `None` when absent) for warehouses `1..=warehouses`:
/// 1. `W_YTD` = sum of the warehouse's `D_YTD`;
/// 2. `D_NEXT_O_ID - 1` = max `O_ID` = max `NO_O_ID` of the district (the latter when it
///    has new orders);
/// 3. max `NO_O_ID` - min `NO_O_ID` + 1 = the district's NEW_ORDER rows;
/// 4. sum of `O_OL_CNT` = the district's ORDER_LINE rows;
///
/// and, with `cursors` (DELIVERY found its orders through DELIVERY_CURSOR rather than a
/// range index), this implementation's own: DELIVERY's cursor is the oldest new order
/// (reported under condition 3).
///
/// Walks orders `1..D_NEXT_O_ID` and one past, each order's 15 possible lines.
pub fn check(
    warehouses: u16,
    cursors: bool,
    mut row: impl FnMut(u32, u64) -> Option<Vec<u8>>,
) -> Consistency {
    let mut c = Consistency::default();
    for w in 1..=warehouses {
        let (Some(_), Some(w_ytd)) = (
            row(WAREHOUSE, u64::from(w)),
            row(WAREHOUSE_YTD, u64::from(w)),
        ) else {
            c.flag(1, format!("warehouse {w} missing"));
            continue;
        };
        let mut d_ytd = 0;
        for d in 1..=DISTRICTS {
            c.districts += 1;
            let dk = district_key(w, d);
            let (Some(dr), Some(ytd), Some(cursor)) = (
                row(DISTRICT, dk),
                row(DISTRICT_YTD, dk),
                row(DELIVERY_CURSOR, dk),
            ) else {
                c.flag(1, format!("district ({w}, {d}) missing"));
                continue;
            };
            d_ytd += get_i64(&ytd, 0);
            let next = get_u32(&dr, 12);
            let (mut max_o, mut no) = (0u32, Vec::new());
            let (mut ol_cnt, mut lines) = (0u64, 0u64);
            for o in 1..=next {
                if let Some(or) = row(ORDER, order_key(w, d, o)) {
                    max_o = o;
                    ol_cnt += u64::from(or[3]);
                }
                if row(NEW_ORDER, order_key(w, d, o)).is_some() {
                    no.push(o);
                }
                for ol in 1..=15 {
                    lines += u64::from(row(ORDER_LINE, order_line_key(w, d, o, ol)).is_some());
                }
            }
            let max_no = no.iter().max().copied();
            if max_o != next - 1 || max_no.is_some_and(|m| m != next - 1) {
                c.flag(
                    2,
                    format!(
                        "district ({w}, {d}): next order {next}, max order {max_o}, max new order {max_no:?}"
                    ),
                );
            }
            let cursor = get_u32(&cursor, 0);
            if cursors
                && (no.first().is_some_and(|&lo| lo != cursor) || (no.is_empty() && cursor != next))
            {
                c.flag(
                    3,
                    format!(
                        "district ({w}, {d}): delivery cursor {cursor}, oldest new order {:?}",
                        no.first()
                    ),
                );
            }
            if let (Some(&lo), Some(&hi)) = (no.iter().min(), no.iter().max()) {
                if u64::from(hi - lo + 1) != no.len() as u64 {
                    c.flag(
                        3,
                        format!(
                            "district ({w}, {d}): new orders {lo}..={hi} but {} rows",
                            no.len()
                        ),
                    );
                }
            }
            if ol_cnt != lines {
                c.flag(
                    4,
                    format!("district ({w}, {d}): sum of o_ol_cnt {ol_cnt}, {lines} order lines"),
                );
            }
        }
        if get_i64(&w_ytd, 0) != d_ytd {
            c.flag(
                1,
                format!(
                    "warehouse {w}: w_ytd {} but districts sum {d_ytd}",
                    get_i64(&w_ytd, 0)
                ),
            );
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn population(w: u16) -> HashMap<(u32, u64), Vec<u8>> {
        let mut m = HashMap::new();
        for w in 1..=w {
            generate(3, w, w == 1, |t, k, r| {
                assert!(m.insert((t, k), r).is_none(), "table {t} key {k} twice");
            });
        }
        m
    }

    #[test]
    fn the_range_index_keys_are_exactly_the_loaded_new_orders_and_lines() {
        let m = population(2);
        let mut want: Vec<(u32, u64)> = m
            .keys()
            .filter(|k| k.0 == NEW_ORDER || k.0 == ORDER_LINE)
            .copied()
            .collect();
        want.sort_unstable();
        let got = range_index_keys(3, 2);
        assert!(got.windows(2).all(|w| w[0] < w[1]), "in key order");
        assert_eq!(got, want);
        for o in [1, 2100, 3000] {
            assert_eq!(
                u64::from(order_line_count(3, 2, 7, o)),
                u64::from(m[&(ORDER, order_key(2, 7, o))][3])
            );
        }
    }

    #[test]
    fn keys_and_names() {
        assert_eq!(last_name(0), "BARBARBAR");
        assert_eq!(last_name(371), "PRICALLYOUGHT");
        assert!(order_line_key(1, 10, (1 << 28) - 1, 15) < order_line_key(2, 1, 1, 1));
        assert!(customer_key(65_535, 10, 3000) < 1 << 40);
        assert!(history_key(0, 0) > customer_key(65_535, 10, 3000));
    }

    #[test]
    fn the_population_follows_the_specification_and_passes_the_check() {
        let m = population(1);
        let count = |t: u32| m.keys().filter(|k| k.0 == t).count();
        assert_eq!(count(ITEM), ITEMS as usize);
        assert_eq!(count(STOCK), ITEMS as usize);
        assert_eq!(count(CUSTOMER), 30_000);
        assert_eq!(count(ORDER), 30_000);
        assert_eq!(count(NEW_ORDER), 9_000);
        assert_eq!(count(CUSTOMER_LAST_ORDER), 30_000);
        let lines = count(ORDER_LINE) as f64 / 30_000.0;
        assert!((lines - 10.0).abs() < 0.1, "{lines} lines per order");
        // Every o_c_id of a district is a distinct customer.
        let mut seen: Vec<u16> = (1..=ORDERS)
            .map(|o| get_u16(&m[&(ORDER, order_key(1, 4, o))], 0))
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (1..=CUSTOMERS).collect::<Vec<_>>());
        // The name index lists every customer once, under its last name.
        let mut listed = 0;
        for n in 0..1000u16 {
            if let Some(r) = m.get(&(CUSTOMER_BY_NAME, name_key(1, 2, n))) {
                for i in 0..get_u16(r, 0) as usize {
                    let c = get_u16(r, 2 + 2 * i);
                    assert_eq!(customer_last_name(3, 1, 2, c), n);
                    listed += 1;
                }
            }
        }
        assert_eq!(listed, 3000, "customers indexed");
        let v = check(1, true, |t, k| m.get(&(t, k)).cloned());
        assert!(v.holds(), "{}", v.line());
        assert_eq!(v.line(), "consistency 1-4: ok (10 districts)");
    }

    #[test]
    fn each_condition_catches_its_planted_violation() {
        let m = population(1);
        let run = |m: &HashMap<(u32, u64), Vec<u8>>| check(1, true, |t, k| m.get(&(t, k)).cloned());
        let scanned =
            |m: &HashMap<(u32, u64), Vec<u8>>| check(1, false, |t, k| m.get(&(t, k)).cloned());
        // 1: a payment that updated the district but not the warehouse.
        let mut bad = m.clone();
        let r = bad.get_mut(&(DISTRICT_YTD, district_key(1, 3))).unwrap();
        let ytd = get_i64(r, 0);
        put_i64(r, 0, ytd + 500);
        assert_eq!(run(&bad).counts, [1, 0, 0, 0], "{}", run(&bad).line());
        // 2: an order inserted without advancing d_next_o_id.
        let mut bad = m.clone();
        bad.insert((ORDER, order_key(1, 5, ORDERS + 1)), vec![0; ORDER_BYTES]);
        assert!(run(&bad).counts[1] > 0, "{}", run(&bad).line());
        // 3: a new order deleted from the middle (a delivery out of order).
        let mut bad = m.clone();
        bad.remove(&(NEW_ORDER, order_key(1, 6, 2500)));
        assert_eq!(run(&bad).counts, [0, 0, 1, 0], "{}", run(&bad).line());
        // Without cursors (DELIVERY scanning the range index) the gap alone counts.
        assert_eq!(
            scanned(&bad).counts,
            [0, 0, 1, 0],
            "{}",
            scanned(&bad).line()
        );
        // 3: DELIVERY's cursor past an undelivered order.
        let mut bad = m.clone();
        put_u32(
            bad.get_mut(&(DELIVERY_CURSOR, district_key(1, 8))).unwrap(),
            0,
            FIRST_NEW_ORDER + 1,
        );
        assert!(
            run(&bad).line().contains("delivery cursor 2102"),
            "{}",
            run(&bad).line()
        );
        assert!(
            scanned(&bad).holds(),
            "no cursor to check when DELIVERY scans"
        );
        // 4: an order line lost.
        let mut bad = m.clone();
        bad.remove(&(ORDER_LINE, order_line_key(1, 7, 10, 1)));
        assert_eq!(run(&bad).counts, [0, 0, 0, 1], "{}", run(&bad).line());
        assert!(run(&bad)
            .line()
            .starts_with("consistency 1-4: 4 failed 1 time(s)"));
    }
}
