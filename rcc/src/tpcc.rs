//! TPC-C New-Order alone, as RCC runs it (RCC, 5.1: "we run the transaction
//! New-Order, which consists of longer (up to 15) write sets"), on RCC tuples,
//! partitioned by warehouse.
//!
//! # The transaction (TPC-C, clause 2.4)
//!
//! A home warehouse `w` (uniform), a district `d` (uniform of 10), a customer
//! (NURand(1023), TPC-C, clause 2.1.6) and 5 to 15 distinct items (NURand(8191)), each
//! with a quantity 1..=10 and, for 1% of the lines when there is more than one
//! warehouse, a remote supply warehouse (TPC-C, clause 2.4.1.5). Records, in
//! [`crate::coord::TxnSpec::ops`] order:
//!
//! | # | table | access |
//! |---|---|---|
//! | 0 | WAREHOUSE `w` | read (`w_tax`) |
//! | 1 | DISTRICT `(w, d)` | write (`d_tax`, `d_next_o_id += 1`) |
//! | 2 | CUSTOMER `(w, d, c)` | read (`c_discount`, `c_credit`) |
//! | 3.. | ITEM `i` (the home node's replica) per line | read (`i_price`) |
//! | 3+n.. | STOCK `(supply_w, i)` per line | write (`s_quantity`, `s_ytd`, `s_order_cnt`, `s_remote_cnt`; TPC-C, clause 2.4.2.2) |
//!
//! then, at commit, the inserts ([`crate::coord::Insert`]): one ORDER, one NEW_ORDER
//! and one ORDER_LINE per line, keyed by the district's `o_id = d_next_o_id` read. Two
//! committed New-Orders never share an `o_id`: both wrote the district row under the
//! protocol's concurrency control. 1% of the transactions name an unused item as their
//! last line and roll back (TPC-C, clause 2.4.1.4): their logic returns false (a user
//! abort, final) after reading the other records; the unused item is not a record, so
//! it is not fetched.
//!
//! No other transaction type runs, and New-Order never reads a row it did not insert
//! itself among ORDER, NEW_ORDER and ORDER_LINE, so no reader can see an inserted row
//! half-written; inserts therefore take no lock.
//!
//! # Placement (by warehouse, as TPC-C is usually partitioned)
//!
//! Every row of warehouse `w` lives on node `w % nodes`: a row with index `j` among its
//! warehouse's `per_wh` rows of a table has key `((w / nodes) * per_wh + j) * nodes + w %
//! nodes`, and a table has `ceil(W / nodes) * per_wh * nodes` rows (rows of warehouses
//! `>= W` that padding creates stay empty). ITEM is read-only and replicated: every node
//! holds all items, item `i`'s copy on node `n` at key `i * nodes + n`, and a New-Order
//! reads the home warehouse's node's copy.
//!
//! # Capacity
//!
//! ORDER and NEW_ORDER hold [`NewOrder::max_orders_per_district`] rows per district,
//! ORDER_LINE 15 per order. A New-Order that finds `d_next_o_id` past that capacity
//! aborts (its own decision, final, never writing outside the table) and is counted in
//! [`NewOrder::district_full`]; the check reports the count.
//!
//! # The check (TPC-C, clause 3.3.2, the conditions that hold with New-Order alone)
//!
//! Per district: `d_next_o_id - 1 = max(o_id) = max(no_o_id)` (3.3.2.2, 3.3.2.3 with
//! orders numbered 1..); every order and new-order row below `d_next_o_id` present and
//! none above, so `max(no_o_id) - min(no_o_id) + 1 = count(new-orders)` (3.3.2.3);
//! `sum(o_ol_cnt) = count(order-lines)` (3.3.2.4), each line's amount its quantity times
//! its item's price. Stock conservation: per stock row, `s_ytd` equals the quantities of
//! its order lines, `s_order_cnt` and `s_remote_cnt` their counts, and `s_quantity`
//! moved down by `s_ytd` modulo 91 (TPC-C, clause 2.4.2.2's refill). Finally the
//! orders committed equal the New-Orders the driver saw commit (`delta`).
//!
//! Deviations: the database starts with no orders (`d_next_o_id = 1`) instead of 3,000
//! per district, so every order checked was inserted by the run; records hold only the
//! fields New-Order and the check use (names, addresses and data strings are left
//! out); amounts are integer cents, taxes and discounts basis points.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::Rng;

use crate::coord::{Insert, Op, TxnSpec};
use crate::layout::TableSpec;
use crate::workload::Workload;

/// Table id of WAREHOUSE: `[w_tax bp, w_ytd]`.
pub const WAREHOUSE: u32 = 0;
/// Table id of DISTRICT: `[d_tax bp, d_next_o_id, d_ytd]`.
pub const DISTRICT: u32 = 1;
/// Table id of CUSTOMER: `[c_discount bp, c_credit (0 good, 1 bad), c_balance]`.
pub const CUSTOMER: u32 = 2;
/// Table id of ITEM (replicated on every node): `[i_price cents, i_im_id]`.
pub const ITEM: u32 = 3;
/// Table id of STOCK: `[s_quantity, s_ytd, s_order_cnt, s_remote_cnt]`.
pub const STOCK: u32 = 4;
/// Table id of ORDER: `[o_id (0: no order), o_c_id, o_ol_cnt, o_all_local]`.
pub const ORDER: u32 = 5;
/// Table id of NEW_ORDER: `[no_o_id (0: none)]`.
pub const NEW_ORDER: u32 = 6;
/// Table id of ORDER_LINE: `[ol_o_id | ol_number << 32, ol_i_id | ol_supply_w_id << 32,
/// ol_quantity | ol_amount cents << 32]` (ids 1-based, 0: no line).
pub const ORDER_LINE: u32 = 7;
/// Districts per warehouse (TPC-C, clause 1.2.1).
pub const DISTRICTS: u64 = 10;
/// Most lines of an order (TPC-C, clause 2.4.1.3).
pub const MAX_LINES: u64 = 15;
/// Transaction kind of New-Order.
pub const NEW_ORDER_KIND: u16 = 0;

const C_ID: u64 = 259;
const C_OL_I_ID: u64 = 7911;

/// TPC-C New-Order over `warehouses` warehouses on `nodes` nodes (see the module
/// documentation). Share one value (it is `Send + Sync`); [`NewOrder::district_full`]
/// counts across clones.
#[derive(Clone, Debug)]
pub struct NewOrder {
    /// Nodes of the cluster the keys are placed for. Must equal the layout's: otherwise a
    /// warehouse's rows are scattered (still correct for the per-transaction protocols;
    /// under CALVIN a run whose inserts land off the transaction's receivers fails).
    pub nodes: usize,
    /// Warehouses, at least 1.
    pub warehouses: u64,
    /// Customers per district (TPC-C: 3,000).
    pub customers: u64,
    /// Items (TPC-C: 100,000).
    pub items: u64,
    /// Capacity of ORDER and NEW_ORDER per district (ORDER_LINE: 15 times as many).
    pub max_orders_per_district: u64,
    /// New-Orders refused because their district was full (final aborts), counted where
    /// the logic runs: once per transaction for the per-transaction protocols; under
    /// CALVIN once per executing node and again in the determinism replay.
    pub district_full: Arc<AtomicU64>,
}

impl NewOrder {
    /// TPC-C's scale (3,000 customers per district, 100,000 items) for `warehouses`
    /// warehouses on `nodes` nodes with `max_orders_per_district` orders of capacity.
    pub fn standard(nodes: usize, warehouses: u64, max_orders_per_district: u64) -> Self {
        Self {
            nodes,
            warehouses,
            customers: 3_000,
            items: 100_000,
            max_orders_per_district,
            district_full: Arc::default(),
        }
    }

    fn n(&self) -> u64 {
        self.nodes as u64
    }

    /// Rows per warehouse of `table` (ITEM: per node).
    fn per_wh(&self, table: u32) -> u64 {
        match table {
            WAREHOUSE => 1,
            DISTRICT => DISTRICTS,
            CUSTOMER => DISTRICTS * self.customers,
            ITEM => self.items,
            STOCK => self.items,
            ORDER | NEW_ORDER => DISTRICTS * self.max_orders_per_district,
            _ => DISTRICTS * self.max_orders_per_district * MAX_LINES,
        }
    }

    /// The key of row `j` of warehouse `w` in a table of `per_wh` rows per warehouse.
    fn key_of(&self, table: u32, w: u64, j: u64) -> u64 {
        ((w / self.n()) * self.per_wh(table) + j) * self.n() + w % self.n()
    }

    /// The warehouse and index within it of `key` of `table` (not ITEM).
    fn decode(&self, table: u32, key: u64) -> (u64, u64) {
        let idx = key / self.n();
        let per = self.per_wh(table);
        ((idx / per) * self.n() + key % self.n(), idx % per)
    }

    /// Key of WAREHOUSE `w` (0-based).
    pub fn warehouse_key(&self, w: u64) -> u64 {
        self.key_of(WAREHOUSE, w, 0)
    }
    /// Key of DISTRICT `(w, d)` (0-based).
    pub fn district_key(&self, w: u64, d: u64) -> u64 {
        self.key_of(DISTRICT, w, d)
    }
    /// Key of CUSTOMER `(w, d, c)` (0-based).
    pub fn customer_key(&self, w: u64, d: u64, c: u64) -> u64 {
        self.key_of(CUSTOMER, w, d * self.customers + c)
    }
    /// Key of item `i`'s (0-based) replica on node `node`.
    pub fn item_key(&self, i: u64, node: usize) -> u64 {
        i * self.n() + node as u64
    }
    /// Key of STOCK `(w, i)` (0-based).
    pub fn stock_key(&self, w: u64, i: u64) -> u64 {
        self.key_of(STOCK, w, i)
    }
    /// Key of ORDER (and NEW_ORDER) `o_id` (1-based) of district `(w, d)`.
    pub fn order_key(&self, w: u64, d: u64, o_id: u64) -> u64 {
        self.key_of(ORDER, w, d * self.max_orders_per_district + o_id - 1)
    }
    /// Key of line `l` (0-based) of ORDER `o_id` of district `(w, d)`.
    pub fn order_line_key(&self, w: u64, d: u64, o_id: u64, l: u64) -> u64 {
        self.key_of(
            ORDER_LINE,
            w,
            (d * self.max_orders_per_district + o_id - 1) * MAX_LINES + l,
        )
    }

    /// Bytes of every node's tables in a shape whose tuples add `meta` bytes per record
    /// and hold `slots` record copies (the suite prints it).
    pub fn bytes_per_node(&self, meta: u64, slots: u64) -> u64 {
        self.tables()
            .iter()
            .map(|t| t.rows.div_ceil(self.n()) * (meta + slots * t.value_bytes as u64))
            .sum()
    }

    fn nurand(rng: &mut SmallRng, a: u64, c: u64, n: u64) -> u64 {
        ((rng.random_range(0..=a) | rng.random_range(0..n)) + c) % n
    }

    /// The New-Order of home warehouse `w`, district `d`, customer `c` and `lines`
    /// (item, supply warehouse, quantity), all 0-based, items distinct; `rollback`: a
    /// last line on an unused item (TPC-C, clause 2.4.1.4). `delta` gets 1 when it
    /// commits. Panics on an empty or too long order (a generator bug).
    pub fn txn(
        &self,
        w: u64,
        d: u64,
        c: u64,
        lines: Vec<(u64, u64, u64)>,
        rollback: bool,
        delta: Rc<Cell<i64>>,
    ) -> TxnSpec {
        let n = lines.len();
        assert!((1..=MAX_LINES as usize).contains(&n), "{n} lines");
        let home = (w % self.n()) as usize;
        let r = |table, key| Op {
            table,
            key,
            write: false,
        };
        let wr = |table, key| Op {
            table,
            key,
            write: true,
        };
        let mut ops = vec![
            r(WAREHOUSE, self.warehouse_key(w)),
            wr(DISTRICT, self.district_key(w, d)),
            r(CUSTOMER, self.customer_key(w, d, c)),
        ];
        ops.extend(
            lines
                .iter()
                .map(|&(i, _, _)| r(ITEM, self.item_key(i, home))),
        );
        ops.extend(
            lines
                .iter()
                .map(|&(i, sw, _)| wr(STOCK, self.stock_key(sw, i))),
        );
        let max = self.max_orders_per_district;
        let full = self.district_full.clone();
        let ls = lines.clone();
        let exec = Box::new(move |v: &mut [Vec<u8>]| {
            let o_id = get(&v[1], 1);
            if rollback {
                return false;
            }
            if o_id > max {
                full.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            put(&mut v[1], 1, o_id + 1);
            for (k, &(_, sw, q)) in ls.iter().enumerate() {
                let s = &mut v[3 + n + k];
                let (sq, ytd, cnt, remote) = (get(s, 0), get(s, 1), get(s, 2), get(s, 3));
                put(s, 0, if sq >= q + 10 { sq - q } else { sq + 91 - q });
                put(s, 1, ytd + q);
                put(s, 2, cnt + 1);
                put(s, 3, remote + u64::from(sw != w));
            }
            delta.set(1);
            true
        });
        let me = self.clone();
        let inserts = Box::new(move |v: &[Vec<u8>]| {
            let o_id = get(&v[1], 1) - 1;
            let all_local = u64::from(lines.iter().all(|l| l.1 == w));
            let mut out = vec![
                Insert {
                    table: ORDER,
                    key: me.order_key(w, d, o_id),
                    record: words(&[o_id, c + 1, n as u64, all_local]),
                },
                Insert {
                    table: NEW_ORDER,
                    key: me.order_key(w, d, o_id),
                    record: words(&[o_id]),
                },
            ];
            for (k, &(i, sw, q)) in lines.iter().enumerate() {
                let amount = q * get(&v[3 + k], 0);
                out.push(Insert {
                    table: ORDER_LINE,
                    key: me.order_line_key(w, d, o_id, k as u64),
                    record: words(&[
                        o_id | (k as u64 + 1) << 32,
                        (i + 1) | (sw + 1) << 32,
                        q | amount << 32,
                    ]),
                });
            }
            out
        });
        TxnSpec {
            kind: NEW_ORDER_KIND,
            ops,
            exec,
            inserts: Some(inserts),
        }
    }

    fn hash(table: u32, key: u64) -> u64 {
        let mut z = key
            .wrapping_add(u64::from(table) << 56)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn check_inner(
        &self,
        read: &dyn Fn(u32, u64) -> Vec<u8>,
        delta: i64,
    ) -> Result<String, String> {
        let max = self.max_orders_per_district;
        let mut orders = 0u64;
        let mut lines_total = 0u64;
        // Per stock row touched: (quantity sum, lines, remote lines).
        let mut stock: std::collections::HashMap<(u64, u64), (u64, u64, u64)> = Default::default();
        for w in 0..self.warehouses {
            for d in 0..DISTRICTS {
                let dist = read(DISTRICT, self.district_key(w, d));
                let next = get(&dist, 1);
                if next == 0 || next > max + 1 {
                    return Err(format!(
                        "district ({w}, {d}): d_next_o_id {next} outside 1..={}",
                        max + 1
                    ));
                }
                let (mut ol_cnt_sum, mut ol_count) = (0u64, 0u64);
                let (mut no_min, mut no_max, mut no_count) = (u64::MAX, 0u64, 0u64);
                let mut o_max = 0u64;
                for o in 1..=max {
                    let ord = read(ORDER, self.order_key(w, d, o));
                    let no = get(&read(NEW_ORDER, self.order_key(w, d, o)), 0);
                    let id = get(&ord, 0);
                    let present = o < next;
                    if (id != 0) != present || (id != 0 && id != o) {
                        return Err(format!(
                            "district ({w}, {d}) with d_next_o_id {next}: order slot {o} holds o_id {id} (TPC-C 3.3.2.2)"
                        ));
                    }
                    if (no != 0) != present || (no != 0 && no != o) {
                        return Err(format!(
                            "district ({w}, {d}) with d_next_o_id {next}: new-order slot {o} holds no_o_id {no} (TPC-C 3.3.2.3)"
                        ));
                    }
                    if no != 0 {
                        no_min = no_min.min(no);
                        no_max = no_max.max(no);
                        no_count += 1;
                    }
                    if !present {
                        continue;
                    }
                    o_max = o_max.max(id);
                    let cnt = get(&ord, 2);
                    ol_cnt_sum += cnt;
                    let mut all_local = true;
                    for l in 0..MAX_LINES {
                        let ol = read(ORDER_LINE, self.order_line_key(w, d, o, l));
                        let (a, b, c) = (get(&ol, 0), get(&ol, 1), get(&ol, 2));
                        if l >= cnt {
                            if a != 0 {
                                return Err(format!(
                                    "order ({w}, {d}, {o}) of {cnt} lines has a line {}",
                                    l + 1
                                ));
                            }
                            continue;
                        }
                        if a != (o | (l + 1) << 32) {
                            return Err(format!(
                                "order ({w}, {d}, {o}): line {} missing or misplaced ({a:#x})",
                                l + 1
                            ));
                        }
                        ol_count += 1;
                        let (i, sw) = ((b & 0xffff_ffff) - 1, (b >> 32) - 1);
                        let (q, amount) = (c & 0xffff_ffff, c >> 32);
                        let price = get(&read(ITEM, self.item_key(i, 0)), 0);
                        if amount != q * price {
                            return Err(format!(
                                "order ({w}, {d}, {o}) line {}: amount {amount} for {q} x {price}",
                                l + 1
                            ));
                        }
                        all_local &= sw == w;
                        let e = stock.entry((sw, i)).or_default();
                        e.0 += q;
                        e.1 += 1;
                        e.2 += u64::from(sw != w);
                    }
                    if get(&ord, 3) != u64::from(all_local) {
                        return Err(format!("order ({w}, {d}, {o}): o_all_local wrong"));
                    }
                }
                if o_max != next - 1 || (no_count > 0 && no_max != next - 1) {
                    return Err(format!(
                        "district ({w}, {d}): d_next_o_id - 1 = {}, max(o_id) = {o_max}, max(no_o_id) = {no_max} (TPC-C 3.3.2.2)",
                        next - 1
                    ));
                }
                if no_count > 0 && no_max - no_min + 1 != no_count {
                    return Err(format!(
                        "district ({w}, {d}): max(no_o_id) - min(no_o_id) + 1 = {} but {no_count} new-orders (TPC-C 3.3.2.3)",
                        no_max - no_min + 1
                    ));
                }
                if ol_cnt_sum != ol_count {
                    return Err(format!(
                        "district ({w}, {d}): sum(o_ol_cnt) = {ol_cnt_sum} but {ol_count} order-lines (TPC-C 3.3.2.4)"
                    ));
                }
                orders += next - 1;
                lines_total += ol_count;
            }
        }
        for w in 0..self.warehouses {
            for i in 0..self.items {
                let key = self.stock_key(w, i);
                let s = read(STOCK, key);
                let (q, ytd, cnt, remote) = (get(&s, 0), get(&s, 1), get(&s, 2), get(&s, 3));
                let want = stock.get(&(w, i)).copied().unwrap_or_default();
                let q0 = get(&self.initial(STOCK, key), 0);
                if (ytd, cnt, remote) != want
                    || (q0 as i64 - q as i64 - ytd as i64).rem_euclid(91) != 0
                {
                    return Err(format!(
                        "stock ({w}, {i}): s_ytd {ytd}, s_order_cnt {cnt}, s_remote_cnt {remote}, s_quantity {q} (from {q0}); its order lines sum to {} units in {} lines, {} remote",
                        want.0, want.1, want.2
                    ));
                }
            }
        }
        if orders as i64 != delta {
            return Err(format!(
                "the districts hold {orders} orders, {delta} New-Orders committed"
            ));
        }
        Ok(format!(
            "tpc-c new-order ok ({orders} orders, {lines_total} order lines, stock conserved; {} refused: district full)",
            self.district_full.load(Ordering::Relaxed)
        ))
    }
}

fn get(v: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(v[8 * i..8 * i + 8].try_into().expect("8 bytes"))
}

fn put(v: &mut [u8], i: usize, x: u64) {
    v[8 * i..8 * i + 8].copy_from_slice(&x.to_le_bytes());
}

fn words(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Workload for NewOrder {
    fn name(&self) -> &'static str {
        "tpcc-neworder"
    }
    fn tables(&self) -> Vec<TableSpec> {
        let wh = self.warehouses.div_ceil(self.n()) * self.n();
        let t = |rows, value_bytes| TableSpec { rows, value_bytes };
        vec![
            t(wh * self.per_wh(WAREHOUSE), 16),
            t(wh * self.per_wh(DISTRICT), 24),
            t(wh * self.per_wh(CUSTOMER), 24),
            t(self.items * self.n(), 16),
            t(wh * self.per_wh(STOCK), 32),
            t(wh * self.per_wh(ORDER), 32),
            t(wh * self.per_wh(NEW_ORDER), 8),
            t(wh * self.per_wh(ORDER_LINE), 24),
        ]
    }
    fn initial(&self, table: u32, key: u64) -> Vec<u8> {
        let h = Self::hash(table, key);
        if table == ITEM {
            let i = key / self.n();
            let h = Self::hash(ITEM, i);
            return words(&[100 + h % 9_901, h % 10_000]);
        }
        let (w, _) = self.decode(table, key);
        let vb = self.tables()[table as usize].value_bytes;
        if w >= self.warehouses {
            return vec![0; vb];
        }
        match table {
            WAREHOUSE => words(&[h % 2_001, 30_000_000]),
            DISTRICT => words(&[h % 2_001, 1, 3_000_000]),
            CUSTOMER => words(&[h % 5_001, u64::from(h.is_multiple_of(10)), 0]),
            STOCK => words(&[10 + h % 91, 0, 0, 0]),
            _ => vec![0; vb],
        }
    }
    fn next(&self, rng: &mut SmallRng, delta: Rc<Cell<i64>>) -> TxnSpec {
        let w = rng.random_range(0..self.warehouses);
        let d = rng.random_range(0..DISTRICTS);
        let c = Self::nurand(rng, 1023, C_ID, self.customers);
        let n = rng.random_range(5..=MAX_LINES).min(self.items) as usize;
        let rollback = rng.random_range(0..100) == 0;
        let mut lines: Vec<(u64, u64, u64)> = Vec::with_capacity(n);
        while lines.len() < n {
            let i = Self::nurand(rng, 8191, C_OL_I_ID, self.items);
            if lines.iter().any(|l| l.0 == i) {
                continue;
            }
            let sw = if self.warehouses > 1 && rng.random_range(0..100) == 0 {
                let o = rng.random_range(0..self.warehouses - 1);
                if o >= w {
                    o + 1
                } else {
                    o
                }
            } else {
                w
            };
            lines.push((i, sw, rng.random_range(1..=10)));
        }
        if rollback && n > 1 {
            // The unused item is the last line: not a record, so not fetched.
            lines.pop();
        }
        self.txn(w, d, c, lines, rollback, delta)
    }
    fn kind_name(&self, kind: u16) -> &'static str {
        if kind == NEW_ORDER_KIND {
            "NewOrder"
        } else {
            "?"
        }
    }
    fn check(&self, read: &dyn Fn(u32, u64) -> Vec<u8>, delta: i64) -> Result<String, String> {
        self.check_inner(read, delta)
    }
}
