//! TPC-C transaction profiles (standard specification 5.11, clause 2; the tables, their
//! population and the consistency conditions are `txn::tpcc`): NEW-ORDER, PAYMENT,
//! ORDER-STATUS, DELIVERY and STOCK-LEVEL in the standard mix (45/43/4/4/4), each
//! coordinator bound to a home warehouse.
//!
//! Deviations, all standard practice among the disaggregated-memory systems (FORD,
//! Motor, Lotus): DELIVERY runs as one transaction delivering one order per district in
//! the foreground (no deferred queue); ORDER-STATUS finds the customer's last order
//! through an index table NEW-ORDER maintains; `c_data` of bad-credit customers is
//! updated in place (its first 100 bytes), not shifted; dates are a counter.

use std::sync::Arc;

use anyhow::bail;
use rand::rngs::StdRng;
use rand::Rng;
use serde::{Deserialize, Serialize};
use txn::coordinator::{AbortReason, Txn, TxnError};
use txn::tpcc::{
    customer_key, district_key, get_i64, get_u16, get_u32, name_key, order_key, order_line_key,
    stock_key, CUSTOMER, CUSTOMER_BY_NAME, CUSTOMER_LAST_ORDER, CUSTOMER_LAST_ORDER_BYTES,
    DELIVERY_CURSOR, DELIVERY_CURSOR_BYTES, DISTRICT, DISTRICTS, DISTRICT_YTD, HISTORY,
    HISTORY_BYTES, ITEM, ITEMS, NEW_ORDER, NEW_ORDER_BYTES, ORDER, ORDER_BYTES, ORDER_LINE,
    ORDER_LINE_BYTES, STOCK, WAREHOUSE, WAREHOUSE_YTD,
};

use crate::report::WorkerStats;
use crate::txn_args::Args;
use crate::workload::Mix;
use crate::workload::RunError;
use crate::workload::{AuditCx, Audited, Finished, Profiles, Workload, WorkloadSpec};

/// The five TPC-C transaction types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TxnType {
    /// Enter an order of 5 to 15 lines (45%).
    NewOrder,
    /// Record a customer's payment (43%).
    Payment,
    /// Read a customer's last order (4%).
    OrderStatus,
    /// Deliver the oldest new order of each district (4%).
    Delivery,
    /// Count recently sold items low in stock (4%).
    StockLevel,
}

impl TxnType {
    /// All types, in report order.
    pub const ALL: [TxnType; 5] = [
        Self::NewOrder,
        Self::Payment,
        Self::OrderStatus,
        Self::Delivery,
        Self::StockLevel,
    ];
    /// Share of the mix, percent.
    pub fn percent(self) -> u32 {
        match self {
            Self::NewOrder => 45,
            Self::Payment => 43,
            _ => 4,
        }
    }
    /// Index in [`Self::ALL`].
    pub fn index(self) -> usize {
        Self::ALL.iter().position(|&t| t == self).expect("listed")
    }
    /// The specification's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::NewOrder => "NewOrder",
            Self::Payment => "Payment",
            Self::OrderStatus => "OrderStatus",
            Self::Delivery => "Delivery",
            Self::StockLevel => "StockLevel",
        }
    }
}

/// `NURand` constants at run time (clause 2.1.6): `C` for last names differs from the
/// load's by 70 (allowed: 65 to 119, not 96 or 112).
const C_LAST_RUN: u64 = txn::tpcc::C_LAST_LOAD + 70;
const C_ID: u64 = 259;
const C_OL_I_ID: u64 = 7911;

fn nurand(rng: &mut impl Rng, a: u64, c: u64, lo: u64, hi: u64) -> u64 {
    ((rng.random_range(0..=a) | rng.random_range(lo..=hi)) + c) % (hi - lo + 1) + lo
}

/// A customer, by id or (60% of PAYMENT and ORDER-STATUS) by last name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CustomerRef {
    /// `c_id`.
    Id(u16),
    /// Last name number (0 to 999).
    Name(u16),
}

/// One order line of a NEW-ORDER.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// Item; `ITEMS + 1` (unused) marks the 1% rollback.
    pub item: u32,
    /// Supplying warehouse.
    pub supply_w: u16,
    /// Quantity, 1 to 10.
    pub quantity: u8,
}

/// One transaction's parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnArgs {
    /// Type.
    pub ty: TxnType,
    /// Home warehouse.
    pub w: u16,
    /// District, 1 to 10.
    pub d: u8,
    /// The customer's warehouse and district (PAYMENT may pick a remote one).
    pub c_w: u16,
    /// The customer's district.
    pub c_d: u8,
    /// The customer.
    pub customer: CustomerRef,
    /// NEW-ORDER's lines.
    pub lines: Vec<Line>,
    /// PAYMENT's amount, cents; DELIVERY's carrier; STOCK-LEVEL's threshold.
    pub amount: i64,
}

/// Draws transactions by clause 2 for `warehouses` warehouses.
#[derive(Clone, Debug)]
pub struct Generator {
    warehouses: u16,
    scans: Scans,
}

impl Generator {
    /// Errors: no warehouse.
    pub fn new(warehouses: u16) -> anyhow::Result<Self> {
        anyhow::ensure!(warehouses >= 1, "need at least 1 warehouse");
        Ok(Self {
            warehouses,
            scans: Scans::Cursors,
        })
    }

    /// Find DELIVERY's and STOCK-LEVEL's rows as `scans` says (default
    /// [`Scans::Cursors`]).
    pub fn with_scans(mut self, scans: Scans) -> Self {
        self.scans = scans;
        self
    }

    fn other_warehouse(&self, rng: &mut impl Rng, w: u16) -> u16 {
        if self.warehouses == 1 {
            return w;
        }
        let o = rng.random_range(1..self.warehouses);
        if o >= w {
            o + 1
        } else {
            o
        }
    }

    fn customer(rng: &mut impl Rng) -> CustomerRef {
        if rng.random_range(0..100) < 60 {
            CustomerRef::Name(nurand(rng, 255, C_LAST_RUN, 0, 999) as u16)
        } else {
            CustomerRef::Id(nurand(rng, 1023, C_ID, 1, 3000) as u16)
        }
    }

    /// The next transaction of a coordinator whose home warehouse is `w`.
    pub fn next(&self, rng: &mut impl Rng, w: u16) -> TxnArgs {
        let mut p = rng.random_range(0..100u32);
        let mut ty = TxnType::StockLevel;
        for t in TxnType::ALL {
            if p < t.percent() {
                ty = t;
                break;
            }
            p -= t.percent();
        }
        self.next_of(rng, w, ty)
    }

    /// A transaction of type `ty` with its parameters drawn as [`Self::next`] would.
    pub fn next_of(&self, rng: &mut impl Rng, w: u16, ty: TxnType) -> TxnArgs {
        let d = rng.random_range(1..=DISTRICTS);
        let mut a = TxnArgs {
            ty,
            w,
            d,
            c_w: w,
            c_d: d,
            customer: CustomerRef::Id(nurand(rng, 1023, C_ID, 1, 3000) as u16),
            lines: Vec::new(),
            amount: 0,
        };
        match ty {
            TxnType::NewOrder => {
                let n = rng.random_range(5..=15);
                let rollback = rng.random_range(0..100) == 0;
                for i in 0..n {
                    // Distinct items (a repeated item would update its stock twice).
                    let item = if rollback && i == n - 1 {
                        ITEMS + 1
                    } else {
                        loop {
                            let it = nurand(rng, 8191, C_OL_I_ID, 1, u64::from(ITEMS)) as u32;
                            if a.lines.iter().all(|l: &Line| l.item != it) {
                                break it;
                            }
                        }
                    };
                    let remote = rng.random_range(0..100) == 0;
                    a.lines.push(Line {
                        item,
                        supply_w: if remote {
                            self.other_warehouse(rng, w)
                        } else {
                            w
                        },
                        quantity: rng.random_range(1..=10),
                    });
                }
            }
            TxnType::Payment => {
                if rng.random_range(0..100) >= 85 {
                    a.c_w = self.other_warehouse(rng, w);
                    a.c_d = rng.random_range(1..=DISTRICTS);
                }
                a.customer = Self::customer(rng);
                a.amount = rng.random_range(100..=500_000);
            }
            TxnType::OrderStatus => a.customer = Self::customer(rng),
            TxnType::Delivery => a.amount = rng.random_range(1..=10),
            TxnType::StockLevel => a.amount = rng.random_range(10..=20),
        }
        a
    }
}

/// How DELIVERY finds a district's oldest new order and STOCK-LEVEL the order lines of
/// the district's last 20 orders (clauses 2.7.4.2 and 2.8.2.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scans {
    /// DELIVERY reads the district's cursor row (DELIVERY_CURSOR) and advances it;
    /// STOCK-LEVEL reads the 20 ORDER rows for their line counts, then the lines by key
    /// (what FORD, Motor and Lotus do: their stores have no ordered index).
    #[default]
    Cursors,
    /// Both scan the range index ([`txn::range_index`], `txn-bench --range-index`):
    /// DELIVERY the district's NEW_ORDER keys from the lowest, STOCK-LEVEL the
    /// ORDER_LINE keys of the 20 orders.
    RangeIndex,
}

/// How a transaction ended besides committing normally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Committed.
    Done,
    /// NEW-ORDER's 1% rolled back on its unused item (clause 2.4.2.3).
    RolledBack,
}

fn set_u32(r: &mut [u8], at: usize, v: u32) {
    r[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn set_i64(r: &mut [u8], at: usize, v: i64) {
    r[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn add_i64(r: &mut [u8], at: usize, delta: i64) {
    let v = get_i64(r, at);
    set_i64(r, at, v + delta);
}
fn add_u32(r: &mut [u8], at: usize, delta: u32) {
    let v = get_u32(r, at);
    set_u32(r, at, v + delta);
}

/// The customer id a reference names: by last name, the middle of the index row's list
/// (sorted by first name; clause 2.5.2.2). `None` when no customer has that name.
async fn resolve(t: &mut Txn<'_>, w: u16, d: u8, c: CustomerRef) -> Result<Option<u16>, TxnError> {
    match c {
        CustomerRef::Id(id) => Ok(Some(id)),
        CustomerRef::Name(n) => {
            let row = t.get_many(&[(CUSTOMER_BY_NAME, name_key(w, d, n))]).await?;
            Ok(row[0].as_ref().map(|r| {
                let count = get_u16(r, 0) as usize;
                get_u16(r, 2 + 2 * (count.div_ceil(2) - 1))
            }))
        }
    }
}

/// Run one attempt of `args` in `t` and commit it. Conflict aborts come back as
/// `Err(TxnError::Abort(_))`; NEW-ORDER's rollback as `Ok(Outcome::RolledBack)`.
///
/// A row that is missing where the transaction's reads say it must exist (DELIVERY's
/// oldest new order, taken by a concurrent DELIVERY after this one read the district),
/// or present where they say it must not (NEW-ORDER's order id, taken after it read
/// `d_next_o_id`), means an optimistic read was stale: the attempt aborts as
/// [`AbortReason::Inconsistent`] and is retried, as its validation would have failed.
pub async fn run(t: Txn<'_>, a: &TxnArgs, scans: Scans) -> Result<Outcome, TxnError> {
    match attempt(t, a, scans).await {
        Err(TxnError::NotFound { .. } | TxnError::Exists { .. }) => {
            Err(TxnError::Abort(AbortReason::Inconsistent))
        }
        r => r,
    }
}

/// Each district's oldest NEW_ORDER row of warehouse `w`, found through the range index
/// and read for update: per district, the lowest indexed key, skipping keys whose row
/// reads as absent (stale entries: a delivered order whose entry is not removed yet, an
/// insert that aborted); districts without one are left out (clause 2.7.4.2). Errors:
/// [`TxnError::Usage`] without a range index, and as [`Txn::get_many_for_update`].
async fn oldest_new_orders(t: &mut Txn<'_>, w: u16) -> Result<Vec<(u8, u32)>, TxnError> {
    let ix = t
        .client()
        .range_index()
        .ok_or_else(|| TxnError::Usage("TPC-C with range scans needs the range index".into()))?;
    let span = |d: u8| order_key(w, d, 0)..order_key(w, d, 0) + (1 << 28);
    // (district, the next order id to look from).
    let mut pending: Vec<(u8, u32)> = (1..=DISTRICTS).map(|d| (d, 0)).collect();
    let mut found = Vec::new();
    while !pending.is_empty() {
        let mut candidates = Vec::new();
        for &(d, from) in &pending {
            let r = span(d);
            let keys = ix
                .scan(NEW_ORDER, r.start + u64::from(from)..r.end, 1)
                .await?;
            if let Some(&k) = keys.first() {
                candidates.push((d, (k - r.start) as u32));
            }
        }
        let keys: Vec<(u32, u64)> = candidates
            .iter()
            .map(|&(d, o)| (NEW_ORDER, order_key(w, d, o)))
            .collect();
        let rows = t.get_many_for_update(&keys).await?;
        pending.clear();
        for (&(d, o), row) in candidates.iter().zip(rows) {
            if row.is_some() {
                found.push((d, o));
            } else {
                pending.push((d, o + 1));
            }
        }
    }
    found.sort_unstable();
    Ok(found)
}

async fn attempt(mut t: Txn<'_>, a: &TxnArgs, scans: Scans) -> Result<Outcome, TxnError> {
    let (w, d) = (a.w, a.d);
    match a.ty {
        TxnType::NewOrder => {
            let CustomerRef::Id(c) = a.customer else {
                unreachable!("NEW-ORDER names its customer by id")
            };
            let head = t
                .read_mixed(&[
                    (WAREHOUSE, u64::from(w), false),
                    (DISTRICT, district_key(w, d), true),
                    (CUSTOMER, customer_key(w, d, c), false),
                ])
                .await?;
            let mut dist = head[1].clone();
            let o = get_u32(&dist, 12);
            set_u32(&mut dist, 12, o + 1);
            t.write(DISTRICT, district_key(w, d), dist)?;
            // Items and their stocks in one round (the rollback's unused item has none).
            let mut wanted: Vec<(u32, u64, bool)> = a
                .lines
                .iter()
                .map(|l| (ITEM, u64::from(l.item), false))
                .collect();
            wanted.extend(
                a.lines
                    .iter()
                    .map(|l| (STOCK, stock_key(l.supply_w, l.item), true)),
            );
            let mut got = t.get_mixed(&wanted).await?;
            let stocks = got.split_off(a.lines.len());
            let items = got;
            if items.iter().chain(&stocks).any(Option::is_none) {
                // The unused item: roll back (an outcome, not a conflict).
                return match t.abort().await {
                    TxnError::Abort(AbortReason::User) => Ok(Outcome::RolledBack),
                    e => Err(e),
                };
            }
            let mut rows = vec![
                (ORDER, order_key(w, d, o), {
                    let mut r = vec![0u8; ORDER_BYTES];
                    r[0..2].copy_from_slice(&c.to_le_bytes());
                    r[3] = a.lines.len() as u8;
                    r[4] = u8::from(a.lines.iter().all(|l| l.supply_w == w));
                    r
                }),
                (NEW_ORDER, order_key(w, d, o), vec![0u8; NEW_ORDER_BYTES]),
            ];
            for (i, ((l, item), stock)) in a.lines.iter().zip(&items).zip(stocks).enumerate() {
                let price = get_i64(item.as_ref().expect("checked"), 0);
                let mut s = stock.expect("checked");
                let q = get_u32(&s, 0) as i64;
                let need = i64::from(l.quantity);
                let q = if q >= need + 10 {
                    q - need
                } else {
                    q - need + 91
                };
                set_u32(&mut s, 0, q as u32);
                add_i64(&mut s, 8, need);
                add_u32(&mut s, 16, 1);
                if l.supply_w != w {
                    add_u32(&mut s, 20, 1);
                }
                let dist_info = s[24 + 24 * (d as usize - 1)..48 + 24 * (d as usize - 1)].to_vec();
                t.write(STOCK, stock_key(l.supply_w, l.item), s)?;
                let mut r = vec![0u8; ORDER_LINE_BYTES];
                set_u32(&mut r, 0, l.item);
                r[4..6].copy_from_slice(&l.supply_w.to_le_bytes());
                r[6] = l.quantity;
                set_i64(&mut r, 8, need * price);
                r[24..48].copy_from_slice(&dist_info);
                rows.push((ORDER_LINE, order_line_key(w, d, o, i as u8 + 1), r));
            }
            t.insert_many(rows).await?;
            // The customer's last-order index (updated, or created for a new customer).
            let last = customer_key(w, d, c);
            let mut r = vec![0u8; CUSTOMER_LAST_ORDER_BYTES];
            set_u32(&mut r, 0, o);
            match t
                .get_many_for_update(&[(CUSTOMER_LAST_ORDER, last)])
                .await?[0]
            {
                Some(_) => t.write(CUSTOMER_LAST_ORDER, last, r)?,
                None => t.insert(CUSTOMER_LAST_ORDER, last, r).await?,
            }
        }
        TxnType::Payment => {
            let Some(c) = resolve(&mut t, a.c_w, a.c_d, a.customer).await? else {
                return Err(t.abort().await);
            };
            let ck = customer_key(a.c_w, a.c_d, c);
            // The warehouse's and district's rows are read (their names and addresses
            // go to the terminal), their year-to-date rows updated.
            let v = t
                .read_mixed(&[
                    (WAREHOUSE, u64::from(w), false),
                    (DISTRICT, district_key(w, d), false),
                    (WAREHOUSE_YTD, u64::from(w), true),
                    (DISTRICT_YTD, district_key(w, d), true),
                    (CUSTOMER, ck, true),
                ])
                .await?;
            let (mut wr, mut dr, mut cr) = (v[2].clone(), v[3].clone(), v[4].clone());
            add_i64(&mut wr, 0, a.amount);
            add_i64(&mut dr, 0, a.amount);
            add_i64(&mut cr, 0, -a.amount);
            add_i64(&mut cr, 8, a.amount);
            add_u32(&mut cr, 16, 1);
            if &cr[28..30] == b"BC" {
                let note = format!("{c} {} {} {d} {w} {}", a.c_d, a.c_w, a.amount);
                let n = note.len().min(100);
                cr[48..48 + n].copy_from_slice(&note.as_bytes()[..n]);
            }
            t.write(WAREHOUSE_YTD, u64::from(w), wr)?;
            t.write(DISTRICT_YTD, district_key(w, d), dr)?;
            t.write(CUSTOMER, ck, cr)?;
            let mut h = vec![0u8; HISTORY_BYTES];
            set_i64(&mut h, 0, a.amount);
            h[8..10].copy_from_slice(&c.to_le_bytes());
            h[10] = a.c_d;
            h[12..14].copy_from_slice(&a.c_w.to_le_bytes());
            h[14] = d;
            h[16..18].copy_from_slice(&w.to_le_bytes());
            let key = 1 << 63 | (t.id() & !(1 << 63));
            t.insert(HISTORY, key, h).await?;
        }
        TxnType::OrderStatus => {
            let Some(c) = resolve(&mut t, w, d, a.customer).await? else {
                return Err(t.abort().await);
            };
            let v = t
                .get_many(&[
                    (CUSTOMER, customer_key(w, d, c)),
                    (CUSTOMER_LAST_ORDER, customer_key(w, d, c)),
                ])
                .await?;
            if let Some(last) = &v[1] {
                let o = get_u32(last, 0);
                let order = t.read(ORDER, order_key(w, d, o)).await?;
                let lines: Vec<(u32, u64)> = (1..=order[3])
                    .map(|ol| (ORDER_LINE, order_line_key(w, d, o, ol)))
                    .collect();
                t.read_many(&lines).await?;
            }
        }
        TxnType::Delivery => {
            // One order per district, the ten districts side by side: five rounds (the
            // cursors or the index, their new orders, the orders, the lines, the
            // customers).
            let carrier = a.amount as u8;
            let todo = match scans {
                Scans::Cursors => {
                    let cursors: Vec<(u32, u64, bool)> = (1..=DISTRICTS)
                        .map(|d| (DELIVERY_CURSOR, district_key(w, d), true))
                        .collect();
                    let cursors = t.read_mixed(&cursors).await?;
                    let oldest: Vec<(u8, u32)> = cursors
                        .iter()
                        .enumerate()
                        .map(|(i, r)| (i as u8 + 1, get_u32(r, 0)))
                        .collect();
                    let keys: Vec<(u32, u64)> = oldest
                        .iter()
                        .map(|&(d, o)| (NEW_ORDER, order_key(w, d, o)))
                        .collect();
                    let found = t.get_many_for_update(&keys).await?;
                    // Districts without an undelivered order are skipped (clause
                    // 2.7.4.2).
                    let todo: Vec<(u8, u32)> = oldest
                        .into_iter()
                        .zip(&found)
                        .filter(|(_, n)| n.is_some())
                        .map(|(x, _)| x)
                        .collect();
                    for &(d, o) in &todo {
                        let mut cur = vec![0u8; DELIVERY_CURSOR_BYTES];
                        set_u32(&mut cur, 0, o + 1);
                        t.write(DELIVERY_CURSOR, district_key(w, d), cur)?;
                    }
                    todo
                }
                Scans::RangeIndex => oldest_new_orders(&mut t, w).await?,
            };
            // The index entries of the deleted rows go once the transaction committed
            // (`Txn::commit`).
            for &(d, o) in &todo {
                t.delete(NEW_ORDER, order_key(w, d, o)).await?;
            }
            let order_keys: Vec<(u32, u64)> = todo
                .iter()
                .map(|&(d, o)| (ORDER, order_key(w, d, o)))
                .collect();
            let orders = t.read_many_for_update(&order_keys).await?;
            let mut line_keys = Vec::new();
            for (&(d, o), order) in todo.iter().zip(&orders) {
                line_keys
                    .extend((1..=order[3]).map(|ol| (ORDER_LINE, order_line_key(w, d, o, ol))));
            }
            let lines = t.read_many_for_update(&line_keys).await?;
            let mut lines = line_keys.into_iter().zip(lines);
            let mut customers = Vec::new();
            for ((&(d, _), (_, ok)), mut order) in todo.iter().zip(order_keys).zip(orders) {
                order[2] = carrier;
                let (c, n) = (get_u16(&order, 0), order[3]);
                t.write(ORDER, ok, order)?;
                let mut total = 0;
                for ((_, k), mut l) in lines.by_ref().take(usize::from(n)) {
                    total += get_i64(&l, 8);
                    l[16..24].copy_from_slice(&1u64.to_le_bytes());
                    t.write(ORDER_LINE, k, l)?;
                }
                customers.push((customer_key(w, d, c), total));
            }
            let ckeys: Vec<(u32, u64)> = customers.iter().map(|&(k, _)| (CUSTOMER, k)).collect();
            let crs = t.read_many_for_update(&ckeys).await?;
            for ((k, total), mut cr) in customers.into_iter().zip(crs) {
                add_i64(&mut cr, 0, total);
                add_u32(&mut cr, 20, 1);
                t.write(CUSTOMER, k, cr)?;
            }
        }
        TxnType::StockLevel => {
            let dr = t.read(DISTRICT, district_key(w, d)).await?;
            let next = get_u32(&dr, 12);
            let from = next.saturating_sub(20).max(1);
            let lines: Vec<Vec<u8>> = match scans {
                Scans::Cursors => {
                    let orders: Vec<(u32, u64)> =
                        (from..next).map(|o| (ORDER, order_key(w, d, o))).collect();
                    let os = t.get_many(&orders).await?;
                    let mut keys = Vec::new();
                    for (o, row) in (from..next).zip(os) {
                        let Some(row) = row else { continue };
                        keys.extend(
                            (1..=row[3]).map(|ol| (ORDER_LINE, order_line_key(w, d, o, ol))),
                        );
                    }
                    t.get_many(&keys).await?.into_iter().flatten().collect()
                }
                // The lines of orders from..next, at most 15 each.
                Scans::RangeIndex => t
                    .scan(
                        ORDER_LINE,
                        order_line_key(w, d, from, 0)..order_line_key(w, d, next, 0),
                        15 * 20,
                    )
                    .await?
                    .into_iter()
                    .map(|(_, l)| l)
                    .collect(),
            };
            let mut items: Vec<u32> = lines.iter().map(|l| get_u32(l, 0)).collect();
            items.sort_unstable();
            items.dedup();
            let stocks: Vec<(u32, u64)> = items.iter().map(|&i| (STOCK, stock_key(w, i))).collect();
            // The count is the transaction's output; nothing consumes it here.
            let _low_stock = t
                .get_many(&stocks)
                .await?
                .iter()
                .flatten()
                .filter(|s| i64::from(get_u32(s, 0) as i32) < a.amount)
                .count();
        }
    }
    t.commit().await?;
    Ok(Outcome::Done)
}

/// TPC-C as `txn-bench` runs it (`--workload tpcc`): `--warehouses` warehouses (one
/// per coordinator thread by default) populated with `--seed`; coordinator coroutine g
/// (over all threads) has home warehouse g mod N + 1; the check is the consistency
/// conditions 1 to 4 (`txn::tpcc::check`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tpcc {
    warehouses: u16,
    scans: Scans,
    /// The population's seed.
    seed: u64,
}

impl Tpcc {
    /// The workload of `args` (with `args.threads` resolved, which the default number of
    /// warehouses follows). Errors: `--sweep theta` (keys follow NURand), no warehouse,
    /// `--hot-accounts`.
    pub fn from_args(args: &Args) -> anyhow::Result<Self> {
        crate::txn_args::refuse_theta_sweep(args)?;
        let warehouses = args.warehouses();
        if warehouses == 0 {
            bail!("--warehouses must be at least 1");
        }
        crate::txn_args::refuse_hot_accounts(args)?;
        Ok(Self {
            warehouses,
            scans: if args.range_index {
                Scans::RangeIndex
            } else {
                Scans::Cursors
            },
            seed: args.seed.seed,
        })
    }
}

impl WorkloadSpec for Tpcc {
    /// The warehouse id is TPC-C's critical field (Lotus 8.1, Fig. 22: W_ID best) for
    /// every table but ITEM, which is never written at run time and so static (read
    /// without a lock even under SR). HISTORY rows inserted at run time carry no
    /// warehouse in their key: they shard by a hash of it (their lock is never contended).
    fn lotus_lock_key(&self) -> txn::lotus::LockKeyFn {
        use txn::tpcc::*;
        Arc::new(|t, k| {
            let w = match t {
                ITEM => return None,
                WAREHOUSE | WAREHOUSE_YTD => k,
                DISTRICT | DISTRICT_YTD | DELIVERY_CURSOR => k / 16,
                CUSTOMER | CUSTOMER_LAST_ORDER => k / 4096 / 16,
                ORDER | NEW_ORDER => (k >> 28) / 16,
                ORDER_LINE => ((k / 16) >> 28) / 16,
                STOCK => k >> 17,
                CUSTOMER_BY_NAME => k / 1024 / 16,
                HISTORY if k >> 63 == 0 => k / 4096 / 16,
                _ => return Some(txn::lotus::hashed_lock_key(t, k)),
            };
            Some(txn::lotus::critical_lock_key(t, w, k))
        })
    }

    fn workload(&self) -> Workload {
        Workload::Tpcc
    }

    fn label(&self) -> &'static str {
        "TPC-C"
    }

    fn kinds(&self) -> Vec<&'static str> {
        TxnType::ALL.iter().map(|t| t.name()).collect()
    }

    fn keys(&self) -> u64 {
        u64::from(self.warehouses)
    }

    fn scale(&self) -> String {
        match self.scans {
            Scans::Cursors => format!("{} warehouse(s)", self.warehouses),
            Scans::RangeIndex => format!("{} warehouse(s), range scans", self.warehouses),
        }
    }

    fn skew(&self, _theta: f64) -> String {
        "keys by TPC-C's NURand and home warehouses".into()
    }

    /// Customers, stock, districts and a window of the growing order tables.
    fn lockd_locks(&self) -> u64 {
        u64::from(self.warehouses) << 20
    }

    fn memnode_args(&self) -> Vec<String> {
        vec![
            "--tpcc-warehouses".into(),
            self.warehouses.to_string(),
            "--tatp-seed".into(),
            self.seed.to_string(),
        ]
    }

    /// Nothing to audit before the run: the population is checked by the loader's
    /// tests, and the consistency check runs after the run.
    fn initial_total(&self, _cx: &AuditCx<'_>) -> anyhow::Result<i64> {
        Ok(0)
    }

    fn profiles(&self, _theta: f64) -> anyhow::Result<Arc<dyn Mix>> {
        Ok(Arc::new(
            Generator::new(self.warehouses)?.with_scans(self.scans),
        ))
    }

    fn audit_after(&self, cx: &AuditCx<'_>, _: &[WorkerStats]) -> anyhow::Result<Audited> {
        let c = crate::audit::tpcc(
            cx.fabric,
            cx.addrs,
            cx.protocol,
            self.warehouses,
            self.scans == Scans::RangeIndex,
        )?;
        Ok(Audited {
            total: None,
            cvt_locked: c.cvt_locked,
            lockd_held: c.lockd_held,
            check: Some((c.line, c.ok)),
        })
    }
}

impl Profiles for Generator {
    type Txn = TxnArgs;

    fn draw(&self, rng: &mut StdRng, home: u16) -> (TxnArgs, usize) {
        let t = self.next(rng, home);
        let kind = t.ty.index();
        (t, kind)
    }

    /// The home warehouse's row (a warehouse's rows share a shard).
    fn first_record(&self, t: &TxnArgs) -> Option<(u32, u64)> {
        (!matches!(t.ty, TxnType::OrderStatus | TxnType::StockLevel))
            .then_some((txn::tpcc::WAREHOUSE, u64::from(t.w)))
    }

    /// NEW-ORDER's 1% rolls back (final, no retry).
    async fn run<'t>(&'t self, mut txn: Txn<'t>, t: &'t TxnArgs) -> Result<Finished, RunError> {
        if matches!(t.ty, TxnType::OrderStatus | TxnType::StockLevel) {
            txn.declare_read_only();
        }
        match run(txn, t, self.scans).await {
            Ok(Outcome::Done) => Ok(Finished::net(0)),
            Ok(Outcome::RolledBack) => Ok(Finished::RolledBack {
                failed_lookup: false,
            }),
            Err(e) => Err(RunError::Txn(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn mix_lines_and_remote_shares() {
        let g = Generator::new(4).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let (mut counts, mut lines, mut remote, mut rollbacks, mut by_name) =
            ([0u32; 5], 0, 0, 0, 0);
        let n = 100_000;
        for _ in 0..n {
            let a = g.next(&mut rng, 2);
            counts[a.ty.index()] += 1;
            assert!((1..=DISTRICTS).contains(&a.d));
            match a.ty {
                TxnType::NewOrder => {
                    assert!((5..=15).contains(&a.lines.len()));
                    lines += a.lines.len();
                    remote += a.lines.iter().filter(|l| l.supply_w != 2).count();
                    rollbacks += usize::from(a.lines.last().unwrap().item == ITEMS + 1);
                }
                TxnType::Payment => {
                    assert!((100..=500_000).contains(&a.amount));
                    by_name += usize::from(matches!(a.customer, CustomerRef::Name(_)));
                }
                _ => {}
            }
        }
        for t in TxnType::ALL {
            let pct = f64::from(counts[t.index()]) * 100.0 / f64::from(n);
            assert!((pct - f64::from(t.percent())).abs() < 0.6, "{t:?}: {pct}%");
        }
        let orders = counts[0] as f64;
        assert!((lines as f64 / orders - 10.0).abs() < 0.1);
        assert!((remote as f64 / lines as f64 - 0.01).abs() < 0.002);
        assert!((rollbacks as f64 / orders - 0.01).abs() < 0.003);
        assert!((by_name as f64 / f64::from(counts[1]) - 0.6).abs() < 0.02);
        // One warehouse: nothing is remote.
        let one = Generator::new(1).unwrap();
        assert!((0..1000).all(|_| one.next(&mut rng, 1).c_w == 1));
    }
}
