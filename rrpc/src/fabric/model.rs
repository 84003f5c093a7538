//! The timing model of the shm fabric: what an RNIC charges per WR, per doorbell, per byte
//! and per atomic, so that contention experiments on one host behave like a network and
//! not like a cache line.
//!
//! The model is plain arithmetic over *resources* in shared words. A rate-limited unit (a
//! NIC's processing unit, its line out, its line in, its atomic unit) is a *calendar*: a
//! ring of [`CALENDAR_BUCKETS`] words, one per [`BUCKET_NS`] of time, each holding how far
//! into its bucket the unit is booked. Taking the unit for `service` ns no earlier than
//! `at` ([`reserve_span`]) books the first bucket from `at` on with room left, spilling
//! into the next ones, one CAS per bucket: FIFO within a bucket, and a WR that needs the
//! unit *earlier* than one booked before it is not queued behind it. That matters because
//! a plan books a responder's units at future times (its request arrives a wire later;
//! an atomic's response leaves after its PCIe round trip) and a requester's at the time
//! it posts: with one "next free" word per unit, every WR posted after a booking one
//! wire ahead would wait for it, and the units' free times would run ahead of the clock
//! under load though each unit stays idle most of the time. An address slot, which
//! serializes atomics to one word, is one word holding when it is next free ([`reserve`]:
//! FIFO in the order of reservation). Each node's NIC ([`Nic`]) is such a set of words in
//! a file of the node's shared memory (`n<node>.nic`), so the rate caps of one NIC hold
//! across all the processes that use it, requesters and responders alike.
//!
//! A WR posted at `t` (after its doorbell, which the posting CPU pays in
//! [`TimingModel::doorbell_ns`]) goes through [`TimingModel::plan`]:
//!
//! 1. the requester NIC's processing unit (`1 / msg_rate` per WR);
//! 2. the requester's line out (request bytes with per-packet headers over the line rate);
//! 3. the wire, `one_way_ns`, then the responder's line in;
//! 4. the responder NIC's processing unit; an atomic also takes the NIC's atomic unit
//!    (`1 / atomic_mops`) and the word's address slot, which serializes atomics to one
//!    address by the PCIe read-modify-write they need (`same_addr_*_ns`; device memory
//!    needs no PCIe and is faster); the effect happens here: [`Plan::exec_ns`];
//! 5. the response (READ data, atomic value, or an ACK) back over the responder's line out
//!    and the wire; the completion appears at [`Plan::complete_ns`].
//!
//! There is no randomness: a plan is a function of the resources' state, so a run is as
//! deterministic as the order in which its threads post. Atomics to different addresses
//! that hash to one of [`ADDR_SLOTS`] slots serialize as if they shared an address (a
//! small, documented over-estimate).
//!
//! Sources of the profiles' numbers are in `deploy/models/*.toml`, next to each number.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;

/// Profiles built into every binary: the files of `deploy/models/`.
const BUILTIN: [(&str, &str); 4] = [
    ("cx5", include_str!("../../../deploy/models/cx5.toml")),
    (
        "cx3-scaled",
        include_str!("../../../deploy/models/cx3-scaled.toml"),
    ),
    ("cx6", include_str!("../../../deploy/models/cx6.toml")),
    ("rxe", include_str!("../../../deploy/models/rxe.toml")),
];

/// Names accepted by [`TimingModel::load`] besides a path.
pub const BUILTIN_NAMES: &str = "none, cx5, cx6, rxe, cx3-scaled";

/// The parameters of a profile, as its TOML file gives them.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelParams {
    /// Profile name, printed by benchmarks.
    pub name: String,
    /// One line on what the profile stands for.
    #[serde(default)]
    pub description: String,
    /// The link.
    pub link: LinkParams,
    /// The NIC's processing units and doorbell.
    pub nic: NicParams,
    /// The NIC's atomic unit.
    pub atomic: AtomicParams,
}

/// Link parameters.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LinkParams {
    /// Latency of a packet with no payload from requester NIC to responder NIC, ns
    /// (wire, switch, both NICs' pipelines and their PCIe), one way.
    pub one_way_ns: u64,
    /// Line rate, Gbit/s.
    pub line_rate_gbps: f64,
    /// Path MTU, bytes: a message of `n` bytes takes `ceil(n / mtu)` packets.
    pub mtu_bytes: u64,
    /// Header bytes per packet on the wire (RoCEv2: Ethernet, IP, UDP, BTH, ICRC).
    pub packet_overhead_bytes: u64,
}

/// NIC parameters.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NicParams {
    /// WRs per second one NIC processes, millions: each WR a NIC issues as requester and
    /// each request it serves as responder takes `1 / msg_rate` of its processing unit.
    pub msg_rate_mops: f64,
    /// CPU time of one doorbell (MMIO write to the NIC), ns, charged to the posting thread
    /// once per posted list.
    pub doorbell_ns: u64,
}

/// Atomic-unit parameters.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AtomicParams {
    /// Atomics per second one NIC executes on host memory, millions.
    pub host_mops: f64,
    /// Atomics per second one NIC executes on its device memory, millions.
    pub dm_mops: f64,
    /// Time one atomic holds its address on host memory, ns (a PCIe read, then a write
    /// back): atomics to one address serialize at this interval.
    pub same_addr_host_ns: u64,
    /// The same on device memory, ns.
    pub same_addr_dm_ns: u64,
}

/// A loaded profile with its per-WR costs precomputed.
#[derive(Clone, Debug)]
pub struct TimingModel {
    params: ModelParams,
    /// Where it came from: a built-in name or a path.
    origin: String,
    ps_per_byte: u64,
    wr_ns: u64,
    atomic_host_ns: u64,
    atomic_dm_ns: u64,
}

/// Errors of [`TimingModel::load`]: the message says what is wrong and where.
#[derive(Debug, thiserror::Error)]
#[error("timing model {spec:?}: {what}")]
pub struct ModelError {
    /// The name or path asked for.
    pub spec: String,
    /// What is wrong with it.
    pub what: String,
}

/// The operation a WR performs, as far as the model cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelOp {
    /// READ of this many bytes: a request out, the data back.
    Read(u64),
    /// WRITE or SEND of this many bytes: the data out, an ACK back.
    Write(u64),
    /// CAS or FAA on an 8-byte word; `dm` if the word is device memory.
    Atomic {
        /// The target is device memory.
        dm: bool,
        /// The target word's address slot (see [`addr_slot`]).
        slot: usize,
    },
}

/// When a WR takes effect and when its completion appears (ns, `CLOCK_MONOTONIC`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The responder executes the WR: a WRITE's data becomes visible, a READ reads, an
    /// atomic reads, modifies and writes its word.
    pub exec_ns: u64,
    /// The response or ACK is back: the completion can be polled.
    pub complete_ns: u64,
}

/// Number of address slots per NIC that serialize atomics to one address.
pub const ADDR_SLOTS: usize = 4096;

/// Width of one calendar bucket, ns: a unit's bookings are FIFO within a bucket, so a WR
/// can wait behind one booked later for at most this long.
pub const BUCKET_NS: u64 = 256;
/// Buckets in one unit's calendar: it books at most `CALENDAR_BUCKETS * BUCKET_NS` (67 ms)
/// past the time a WR is posted, which covers eight 1 MiB READs in flight on
/// `cx3-scaled`'s 1.75 Gb/s line (38 ms). What a booking needs beyond that horizon queues
/// on the unit's one "far" word, FIFO (see [`reserve_span`]).
pub const CALENDAR_BUCKETS: usize = 262_144;
/// Bits of a bucket word that hold the booked ns; the bucket's lap is above them.
const OFF_BITS: u32 = 16;

// Word indexes of a NIC's resources: the address slots, then one calendar per unit.
const W_SLOTS: usize = 0;
/// The far words: unit `u` (0 processing, 1 line out, 2 line in, 3 atomics) has
/// `W_FAR + 8 * u`, each on its own cache line.
const W_FAR: usize = ADDR_SLOTS;
const C_PROC: usize = W_FAR + 32;
const C_LINE_OUT: usize = C_PROC + CALENDAR_BUCKETS;
const C_LINE_IN: usize = C_LINE_OUT + CALENDAR_BUCKETS;
const C_ATOMIC: usize = C_LINE_IN + CALENDAR_BUCKETS;
/// Words of one NIC's state.
pub const NIC_WORDS: usize = C_ATOMIC + CALENDAR_BUCKETS;
/// Bytes of one NIC's state (the size of its `n<node>.nic` file).
pub const NIC_BYTES: usize = NIC_WORDS * 8;

/// A NIC's resources: [`NIC_WORDS`] words, usually in a node's shared memory.
#[derive(Clone, Copy)]
pub struct Nic<'a> {
    words: &'a [AtomicU64],
}

impl<'a> Nic<'a> {
    /// The NIC whose state is `words`. Panics if there are fewer than [`NIC_WORDS`].
    pub fn new(words: &'a [AtomicU64]) -> Self {
        assert!(words.len() >= NIC_WORDS, "a NIC needs {NIC_WORDS} words");
        Self { words }
    }

    /// Book calendar `unit` for `service` ns from `at` on (`now`: the posting time, for
    /// the horizon); returns (start, end) of the service.
    fn take(&self, unit: usize, at: u64, service: u64, now: u64) -> (u64, u64) {
        // Each unit's far word on its own cache line: units are CALENDAR_BUCKETS apart.
        let far = &self.words[W_FAR + 8 * ((unit - C_PROC) / CALENDAR_BUCKETS)];
        reserve_span(
            &self.words[unit..unit + CALENDAR_BUCKETS],
            far,
            at,
            service,
            now,
        )
    }

    /// The end of the atomic unit's latest booking (ns, `CLOCK_MONOTONIC`; 0 if never
    /// taken): for tests and diagnostics.
    pub fn atomic_free_ns(&self) -> u64 {
        calendar_end(&self.words[C_ATOMIC..C_ATOMIC + CALENDAR_BUCKETS])
    }

    /// When address slot `slot` (see [`addr_slot`]) is next free (ns; 0 if never taken):
    /// for tests and diagnostics.
    pub fn slot_free_ns(&self, slot: usize) -> u64 {
        self.words[W_SLOTS + slot % ADDR_SLOTS].load(Ordering::Acquire)
    }
}

/// Book a calendar (a ring of [`CALENDAR_BUCKETS`] words, one per [`BUCKET_NS`]) for
/// `service` ns no earlier than `at`: returns (start, end), where start is `at` or the end
/// of the bookings already made in `at`'s bucket, and the service fills buckets from
/// there until it is done (end - start is `service` when it fits in the first bucket).
/// What a booking needs past `now` plus the calendar's horizon (`ring.len()` buckets) it
/// takes from `far`, a "next free" word ([`reserve`]), after everything booked there. That
/// is only reached by a unit with more backlog than the horizon; as the clock moves on,
/// bookings in the calendar do not see the far word's, so in that stretch such a unit can
/// serve up to twice its rate (a documented approximation, where the old single word would
/// have made every later WR wait behind the backlog's end).
///
/// A bucket word is `lap << 16 | booked`: `lap` tells this pass over the ring from an
/// older one (whose bookings are void), `booked` the ns of the bucket booked from its
/// start. One CAS per bucket touched.
pub fn reserve_span(
    ring: &[AtomicU64],
    far: &AtomicU64,
    at: u64,
    service: u64,
    now: u64,
) -> (u64, u64) {
    let n = ring.len() as u64;
    let horizon = now / BUCKET_NS + n;
    let mut need = service;
    let mut from = at;
    let mut start = None;
    loop {
        let b = from / BUCKET_NS;
        if need == 0 {
            return (start.unwrap_or(from), from);
        }
        if b >= horizon {
            let s = reserve(far, from, need);
            return (start.unwrap_or(s), s + need);
        }
        let (lap, word) = (b / n, &ring[(b % n) as usize]);
        let bucket_start = b * BUCKET_NS;
        let mut cur = word.load(Ordering::Relaxed);
        let taken = loop {
            let booked = match cur >> OFF_BITS {
                l if l == lap => cur & ((1 << OFF_BITS) - 1),
                l if l < lap => 0,
                // Reused for a later pass: this bucket's time is gone; skip it.
                _ => BUCKET_NS,
            };
            let begin = from.max(bucket_start + booked);
            if begin >= bucket_start + BUCKET_NS {
                break None;
            }
            let take = need.min(bucket_start + BUCKET_NS - begin);
            let new = lap << OFF_BITS | (begin + take - bucket_start);
            match word.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break Some((begin, take)),
                Err(seen) => cur = seen,
            }
        };
        match taken {
            Some((begin, take)) => {
                start.get_or_insert(begin);
                need -= take;
                from = begin + take;
                if need == 0 {
                    return (start.unwrap_or(begin), from);
                }
            }
            None => from = bucket_start + BUCKET_NS,
        }
    }
}

/// The end of the latest booking in a calendar (0 if it has none).
fn calendar_end(ring: &[AtomicU64]) -> u64 {
    let n = ring.len() as u64;
    ring.iter()
        .enumerate()
        .map(|(i, w)| {
            let w = w.load(Ordering::Acquire);
            let booked = w & ((1 << OFF_BITS) - 1);
            if booked == 0 {
                0
            } else {
                ((w >> OFF_BITS) * n + i as u64) * BUCKET_NS + booked
            }
        })
        .max()
        .unwrap_or(0)
}

/// Take a resource for `service` ns no earlier than `at`: returns the start, which is
/// `max(at, free)` where `free` is when the resource's earlier reservations end; the
/// resource is then free at start + service. One CAS loop, FIFO in reservation order.
pub fn reserve(word: &AtomicU64, at: u64, service: u64) -> u64 {
    let mut free = word.load(Ordering::Relaxed);
    loop {
        let start = free.max(at);
        match word.compare_exchange_weak(free, start + service, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => return start,
            Err(now) => free = now,
        }
    }
}

/// The address slot of the 8-byte word at `addr` of MR `rkey` (Fibonacci hashing).
pub fn addr_slot(rkey: u32, addr: u64) -> usize {
    let h = ((addr >> 3) ^ (u64::from(rkey) << 40)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 52) as usize % ADDR_SLOTS
}

/// Nanoseconds on `CLOCK_MONOTONIC`: one clock for all processes of the host.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Busy-wait until `CLOCK_MONOTONIC` reaches `until_ns` (a doorbell's CPU time).
pub fn spin_until(until_ns: u64) {
    while now_ns() < until_ns {
        std::hint::spin_loop();
    }
}

// Request and response sizes beyond the payload: RETH (16 B) on READ/WRITE requests,
// AtomicETH (28 B) on atomic requests, AtomicAckETH (8 B with the old value) and AETH (4 B)
// on responses (InfiniBand Architecture Specification, vol. 1, 9.2 and 9.3).
const RETH: u64 = 16;
const ATOMIC_ETH: u64 = 28;
const AETH: u64 = 4;

impl TimingModel {
    /// The model `spec` names: `none` (or empty) for none, a built-in profile (`cx5`,
    /// `cx6`, `rxe`, `cx3-scaled`), or the path of a TOML file with [`ModelParams`].
    ///
    /// Errors: an unknown name, an unreadable or malformed file, a parameter out of range.
    pub fn load(spec: &str) -> Result<Option<Self>, ModelError> {
        let err = |what: String| ModelError {
            spec: spec.into(),
            what,
        };
        let spec_t = spec.trim();
        if spec_t.is_empty() || spec_t == "none" {
            return Ok(None);
        }
        let (text, origin) = match BUILTIN.iter().find(|(n, _)| *n == spec_t) {
            Some((n, t)) => (t.to_string(), n.to_string()),
            None if spec_t.ends_with(".toml") || Path::new(spec_t).exists() => (
                std::fs::read_to_string(spec_t)
                    .map_err(|e| err(format!("cannot read the file: {e}")))?,
                spec_t.to_string(),
            ),
            None => {
                return Err(err(format!(
                    "not a built-in profile ({BUILTIN_NAMES}) nor a .toml file"
                )))
            }
        };
        let params: ModelParams = toml::from_str(&text).map_err(|e| err(e.to_string()))?;
        Self::new(params, origin).map(Some).map_err(err)
    }

    /// The model `$RRPC_MODEL` names (none when unset). Errors: as [`TimingModel::load`].
    pub fn from_env() -> Result<Option<Self>, ModelError> {
        Self::load(&std::env::var("RRPC_MODEL").unwrap_or_default())
    }

    /// The model `spec` names, else the one `$RRPC_MODEL` names (none when both are
    /// unset), as binaries choose it. Errors: as [`TimingModel::load`].
    pub fn load_or_env(spec: Option<&str>) -> Result<Option<Self>, ModelError> {
        match spec {
            Some(spec) => Self::load(spec),
            None => Self::from_env(),
        }
    }

    /// A model from parameters; `origin` says where they came from. Errors: a rate or
    /// size that is not positive and finite.
    pub fn new(params: ModelParams, origin: String) -> Result<Self, String> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(format!("{name} must be positive, is {v}"))
            }
        };
        let gbps = positive("link.line_rate_gbps", params.link.line_rate_gbps)?;
        let mops = positive("nic.msg_rate_mops", params.nic.msg_rate_mops)?;
        let host = positive("atomic.host_mops", params.atomic.host_mops)?;
        let dm = positive("atomic.dm_mops", params.atomic.dm_mops)?;
        positive("link.mtu_bytes", params.link.mtu_bytes as f64)?;
        Ok(Self {
            // 8 bits over `gbps` Gbit/s = 8000 / gbps ps per byte.
            ps_per_byte: (8000.0 / gbps).round() as u64,
            wr_ns: (1000.0 / mops).round() as u64,
            atomic_host_ns: (1000.0 / host).round() as u64,
            atomic_dm_ns: (1000.0 / dm).round() as u64,
            params,
            origin,
        })
    }

    /// The parameters.
    pub fn params(&self) -> &ModelParams {
        &self.params
    }

    /// CPU time of one doorbell, ns.
    pub fn doorbell_ns(&self) -> u64 {
        self.params.nic.doorbell_ns
    }

    /// One line with the name and every parameter, for benchmark headers.
    pub fn describe(&self) -> String {
        let p = &self.params;
        let from = if self.origin == p.name {
            String::new()
        } else {
            format!(" from {}", self.origin)
        };
        format!(
            "{}{from}: one-way {} ns, {} Gb/s, MTU {} B (+{} B/packet), {} Mops/NIC, doorbell {} ns, \
             atomics {} Mops host / {} Mops device memory, same address {} ns host / {} ns device memory",
            p.name,
            p.link.one_way_ns,
            p.link.line_rate_gbps,
            p.link.mtu_bytes,
            p.link.packet_overhead_bytes,
            p.nic.msg_rate_mops,
            p.nic.doorbell_ns,
            p.atomic.host_mops,
            p.atomic.dm_mops,
            p.atomic.same_addr_host_ns,
            p.atomic.same_addr_dm_ns
        )
    }

    /// Bytes on the wire for a message of `payload` bytes plus `extra` header bytes in its
    /// first packet: payload split into MTU-sized packets, each with the packet overhead.
    pub fn wire_bytes(&self, payload: u64, extra: u64) -> u64 {
        let packets = payload.div_ceil(self.params.link.mtu_bytes).max(1);
        payload + extra + packets * self.params.link.packet_overhead_bytes
    }

    /// Time `bytes` take on the line, ns (rounded up).
    pub fn line_ns(&self, bytes: u64) -> u64 {
        (bytes * self.ps_per_byte).div_ceil(1000)
    }

    /// Plan a WR posted at `posted_ns` (its doorbell already paid) from the NIC `req` to the
    /// NIC `resp`: reserves the resources it takes and returns when it executes and when it
    /// completes. `not_before` holds RC ordering: the plan's execution and completion are
    /// no earlier than the previous WR's on the same QP (`(exec, complete)`).
    pub fn plan(
        &self,
        op: ModelOp,
        posted_ns: u64,
        req: Nic<'_>,
        resp: Nic<'_>,
        not_before: (u64, u64),
    ) -> Plan {
        let one_way = self.params.link.one_way_ns;
        let (req_bytes, resp_bytes) = match op {
            ModelOp::Read(n) => (self.wire_bytes(0, RETH), self.wire_bytes(n, AETH)),
            ModelOp::Write(n) => (self.wire_bytes(n, RETH), self.wire_bytes(0, AETH)),
            ModelOp::Atomic { .. } => {
                (self.wire_bytes(0, ATOMIC_ETH), self.wire_bytes(0, AETH + 8))
            }
        };
        let now = posted_ns;
        // 1, 2: requester processing unit, then its line out.
        let (_, proc) = req.take(C_PROC, posted_ns, self.wr_ns, now);
        let out_ns = self.line_ns(req_bytes);
        let (sent, _) = req.take(C_LINE_OUT, proc, out_ns, now);
        // 3: the wire; the responder's line in is busy for the same bytes from the first
        // bit's arrival (cut-through: one flow pays the serialization once).
        let first_bit = sent + one_way;
        let (_, arrived) = resp.take(C_LINE_IN, first_bit, out_ns, now);
        // 4: responder processing unit; atomics also take the atomic unit and the address.
        let (_, mut exec) = resp.take(C_PROC, arrived, self.wr_ns, now);
        if let ModelOp::Atomic { dm, slot } = op {
            let (unit, hold) = if dm {
                (self.atomic_dm_ns, self.params.atomic.same_addr_dm_ns)
            } else {
                (self.atomic_host_ns, self.params.atomic.same_addr_host_ns)
            };
            let (_, u) = resp.take(C_ATOMIC, exec, unit, now);
            exec = reserve(&resp.words[W_SLOTS + slot % ADDR_SLOTS], u, hold) + hold;
        }
        let exec = exec.max(not_before.0);
        // 5: the response over the responder's line out and the wire; the requester's line
        // in as in 3.
        let back_ns = self.line_ns(resp_bytes);
        let (resp_sent, _) = resp.take(C_LINE_OUT, exec, back_ns, now);
        let (_, back) = req.take(C_LINE_IN, resp_sent + one_way, back_ns, now);
        Plan {
            exec_ns: exec,
            complete_ns: back.max(not_before.1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> ModelParams {
        ModelParams {
            name: "test".into(),
            description: String::new(),
            link: LinkParams {
                one_way_ns: 1000,
                line_rate_gbps: 100.0,
                mtu_bytes: 4096,
                packet_overhead_bytes: 58,
            },
            nic: NicParams {
                msg_rate_mops: 100.0,
                doorbell_ns: 200,
            },
            atomic: AtomicParams {
                host_mops: 2.0,
                dm_mops: 100.0,
                same_addr_host_ns: 800,
                same_addr_dm_ns: 10,
            },
        }
    }

    fn model() -> TimingModel {
        TimingModel::new(params(), "test".into()).unwrap()
    }

    fn nic() -> Vec<AtomicU64> {
        (0..NIC_WORDS).map(|_| AtomicU64::new(0)).collect()
    }

    /// `op` posted at 0 between two idle NICs.
    fn plan_idle(m: &TimingModel, op: ModelOp) -> Plan {
        let (a, b) = (nic(), nic());
        m.plan(op, 0, Nic::new(&a), Nic::new(&b), (0, 0))
    }

    #[test]
    fn reserve_is_fifo_and_never_starts_early() {
        let w = AtomicU64::new(0);
        assert_eq!(reserve(&w, 100, 10), 100);
        assert_eq!(reserve(&w, 100, 10), 110, "queued behind the first");
        assert_eq!(reserve(&w, 50, 10), 120, "an earlier wish waits its turn");
        assert_eq!(
            reserve(&w, 1000, 10),
            1000,
            "an idle resource starts at once"
        );
        assert_eq!(w.load(Ordering::Relaxed), 1010);
    }

    /// A calendar of 64 buckets and its far word.
    struct Cal(Vec<AtomicU64>, AtomicU64);
    impl Cal {
        fn book(&self, at: u64, service: u64, now: u64) -> (u64, u64) {
            reserve_span(&self.0, &self.1, at, service, now)
        }
    }
    fn ring() -> Cal {
        Cal(
            (0..64).map(|_| AtomicU64::new(0)).collect(),
            AtomicU64::new(0),
        )
    }

    #[test]
    fn a_calendar_is_fifo_within_a_bucket() {
        let r = ring();
        assert_eq!(r.book(100, 10, 0), (100, 110));
        assert_eq!(r.book(100, 10, 0), (110, 120), "queued behind the first");
        assert_eq!(r.book(50, 10, 0), (120, 130), "same bucket: waits its turn");
        assert_eq!(r.book(1000, 10, 0), (1000, 1010), "idle: at once");
    }

    /// The convoy a single "next free" word makes: a booking one wire ahead (a
    /// responder's unit for a request that arrives 1 us later) must not delay a WR that
    /// needs the unit now, yet the bucket it booked stays booked.
    #[test]
    fn a_later_booking_does_not_hold_back_an_earlier_one() {
        let r = ring();
        assert_eq!(r.book(1000, 30, 0), (1000, 1030));
        assert_eq!(r.book(0, 30, 0), (0, 30), "not behind the 1 us booking");
        assert_eq!(r.book(1000, 30, 0), (1030, 1060));
    }

    #[test]
    fn a_long_service_fills_buckets_in_turn_and_keeps_the_rate() {
        let r = ring();
        // 1000 ns from 0: four buckets (256 ns each) and a part of the fifth.
        assert_eq!(r.book(0, 1000, 0), (0, 1000));
        // The next one queues behind it, wherever its wish falls inside.
        assert_eq!(r.book(300, 100, 0), (1000, 1100));
        // Out-of-order wishes still cannot book more than a bucket's time per bucket:
        // 100 WRs of 20 ns, half wished at 0 and half at 1 us, end by 2000 + 100 x 20.
        let r = ring();
        let ends: Vec<u64> = (0..100)
            .map(|i| r.book(if i % 2 == 0 { 1000 } else { 0 }, 20, 0).1)
            .collect();
        let busy: u64 = 100 * 20;
        assert!(
            *ends.iter().max().unwrap() <= 1000 + busy + BUCKET_NS,
            "{ends:?}"
        );
        assert!(*ends.iter().max().unwrap() >= busy, "the rate holds");
    }

    #[test]
    fn bookings_past_the_horizon_queue_on_the_far_word_and_an_old_lap_is_void() {
        let r = ring();
        let span = 64 * BUCKET_NS;
        // Past `now` plus 64 buckets: on the far word, one after another.
        assert_eq!(r.book(span + 5, 10, 0), (span + 5, span + 15));
        assert_eq!(r.book(span + 5, 10, 0), (span + 15, span + 25));
        assert!(r.0.iter().all(|w| w.load(Ordering::Relaxed) == 0));
        // A long service runs through the calendar and on past it: it keeps the rate.
        let long = ring();
        assert_eq!(long.book(0, 2 * span, 0), (0, 2 * span));
        assert_eq!(long.book(0, 100, 0), (2 * span, 2 * span + 100));
        // A bucket booked one lap ago is free in this lap.
        assert_eq!(r.book(0, 100, 0), (0, 100));
        assert_eq!(r.book(span, 100, span), (span, span + 100));
        // And the old lap's time, now reused, is skipped rather than double-booked.
        assert_eq!(r.book(0, 10, 0), (BUCKET_NS, BUCKET_NS + 10));
    }

    /// Eight 1 MiB READs in flight on `cx3-scaled`'s 1.75 Gb/s line (4.8 ms each, as a
    /// recovery's scan posts them) queue on the responder's line out one after another:
    /// the last completes no sooner than eight line times after the first byte left.
    #[test]
    fn a_slow_line_keeps_its_rate_for_a_long_backlog() {
        let m = TimingModel::load("cx3-scaled").unwrap().unwrap();
        let (a, b) = (nic(), nic());
        let line = m.line_ns(m.wire_bytes(1 << 20, 4));
        assert!(line > 4_000_000, "{line} ns per MiB");
        // Every one of the eight is planned (and books the line), in order.
        let plans: Vec<Plan> = (0..8)
            .map(|_| {
                m.plan(
                    ModelOp::Read(1 << 20),
                    0,
                    Nic::new(&a),
                    Nic::new(&b),
                    (0, 0),
                )
            })
            .collect();
        let last = plans[7];
        assert!(
            last.complete_ns >= 8 * line,
            "{} < 8 x {line}",
            last.complete_ns
        );
    }

    /// Two NICs sending to each other (two nodes of a run, or loopback): the responder's
    /// processing of a request booked a wire ahead must not delay what the same NIC posts
    /// now as requester. With one "next free" word per unit the second plan waited 1 us.
    #[test]
    fn a_nic_serving_a_request_still_posts_at_once() {
        let m = model();
        let (a, b) = (nic(), nic());
        let first = m.plan(ModelOp::Read(8), 0, Nic::new(&a), Nic::new(&b), (0, 0));
        let back = m.plan(ModelOp::Read(8), 0, Nic::new(&b), Nic::new(&a), (0, 0));
        let idle = plan_idle(&m, ModelOp::Read(8));
        assert_eq!(first, idle);
        assert_eq!(
            back, idle,
            "b's booking at +1 us does not hold back b's own post"
        );
    }

    #[test]
    fn wire_bytes_and_line_time() {
        let m = model();
        // 100 Gb/s: 80 ps per byte.
        assert_eq!(m.line_ns(1000), 80);
        assert_eq!(m.line_ns(1), 1, "rounded up");
        assert_eq!(
            m.wire_bytes(0, 16),
            16 + 58,
            "an empty message is one packet"
        );
        assert_eq!(m.wire_bytes(4096, 0), 4096 + 58);
        assert_eq!(m.wire_bytes(4097, 0), 4097 + 2 * 58);
    }

    #[test]
    fn an_idle_write_takes_one_round_trip_plus_its_bytes() {
        let m = model();
        let p = plan_idle(&m, ModelOp::Write(64));
        let req = m.line_ns(64 + 16 + 58);
        let ack = m.line_ns(4 + 58);
        // Requester WR (10 ns), the wire, the bytes once (cut-through: the last bit
        // arrives one line time after the first), responder WR (10 ns); the ACK back.
        assert_eq!(p.exec_ns, 10 + 1000 + req + 10);
        assert_eq!(p.complete_ns, p.exec_ns + 1000 + ack);
    }

    #[test]
    fn a_read_pays_its_bytes_on_the_way_back() {
        let m = model();
        let small = plan_idle(&m, ModelOp::Read(8));
        let big = plan_idle(&m, ModelOp::Read(1 << 20));
        assert_eq!(small.exec_ns, big.exec_ns, "the request is the same size");
        let extra = big.complete_ns - small.complete_ns;
        let data = m.line_ns(m.wire_bytes(1 << 20, 4)) - m.line_ns(m.wire_bytes(8, 4));
        assert_eq!(extra, data, "1 MiB over 100 Gb/s, once");
    }

    #[test]
    fn the_message_rate_caps_a_nic() {
        let m = model();
        let (a, b) = (nic(), nic());
        let plans: Vec<_> = (0..1000)
            .map(|_| m.plan(ModelOp::Write(8), 0, Nic::new(&a), Nic::new(&b), (0, 0)))
            .collect();
        let span = plans[999].exec_ns - plans[0].exec_ns;
        // 100 Mops: 10 ns per WR; 999 WRs after the first.
        assert_eq!(span, 999 * 10);
    }

    #[test]
    fn atomics_to_one_address_serialize_and_device_memory_is_faster() {
        let m = model();
        let run = |dm: bool, same: bool| {
            let (a, b) = (nic(), nic());
            let plans: Vec<_> = (0..100)
                .map(|i| {
                    let slot = if same { 7 } else { addr_slot(1, 8 * i) };
                    m.plan(
                        ModelOp::Atomic { dm, slot },
                        0,
                        Nic::new(&a),
                        Nic::new(&b),
                        (0, 0),
                    )
                })
                .collect();
            plans[99].exec_ns - plans[0].exec_ns
        };
        // Host memory, one address: 800 ns apart. Many addresses: the atomic unit, 2 Mops.
        assert_eq!(run(false, true), 99 * 800);
        assert_eq!(run(false, false), 99 * 500);
        // Device memory: 100 Mops unit, 10 ns per address.
        assert_eq!(run(true, true), 99 * 10);
        assert!(run(true, false) <= 99 * 10);
    }

    /// The atomic unit and the address slots are the responder's: FAAs that two
    /// requesters (two NICs, so two QPs of two nodes, or of two processes mapping their
    /// NIC files) post at the same instant to one word of the target queue at the target
    /// one behind the other, while the requesters' own atomic state is never touched.
    /// Different words serialize only on the target's atomic unit.
    #[test]
    fn atomics_from_different_requesters_queue_at_the_responder() {
        let m = model();
        let run = |same: bool| {
            let (a, b, target) = (nic(), nic(), nic());
            let mut execs: Vec<u64> = (0..100u64)
                .map(|i| {
                    // Alternate requesters; one word, or a word per FAA.
                    let req = if i % 2 == 0 { &a } else { &b };
                    let slot = if same { 7 } else { addr_slot(1, 8 * i) };
                    m.plan(
                        ModelOp::Atomic { dm: false, slot },
                        0,
                        Nic::new(req),
                        Nic::new(&target),
                        (0, 0),
                    )
                    .exec_ns
                })
                .collect();
            for req in [&a, &b] {
                assert!(
                    req[..W_SLOTS + ADDR_SLOTS]
                        .iter()
                        .chain(&req[C_ATOMIC..])
                        .all(|w| w.load(Ordering::Relaxed) == 0),
                    "a requester's atomic unit and slots stay idle"
                );
            }
            execs.sort_unstable();
            // Two requesters posting at once: one of each pair waits for the other.
            assert!(execs.windows(2).all(|w| w[1] > w[0]), "no two at once");
            execs[99] - execs[0]
        };
        // One word: the 800 ns address hold, whichever NIC the FAA came from.
        assert_eq!(run(true), 99 * 800);
        // A word each: only the target's atomic unit (2 Mops, 500 ns), not the address.
        assert_eq!(run(false), 99 * 500);
        // Two targets, one requester: each target's unit and word are its own.
        let (a, t1, t2) = (nic(), nic(), nic());
        let op = ModelOp::Atomic { dm: false, slot: 7 };
        let p1 = m.plan(op, 0, Nic::new(&a), Nic::new(&t1), (0, 0));
        let p2 = m.plan(op, 0, Nic::new(&a), Nic::new(&t2), (0, 0));
        assert!(
            p2.exec_ns < p1.exec_ns + 500,
            "another target's word does not wait for this one's: {p1:?} {p2:?}"
        );
    }

    #[test]
    fn rc_order_holds_on_one_qp() {
        let m = model();
        let (a, b) = (nic(), nic());
        let big = m.plan(
            ModelOp::Read(1 << 20),
            0,
            Nic::new(&a),
            Nic::new(&b),
            (0, 0),
        );
        let small = m.plan(
            ModelOp::Write(8),
            0,
            Nic::new(&a),
            Nic::new(&b),
            (big.exec_ns, big.complete_ns),
        );
        assert!(small.exec_ns >= big.exec_ns);
        assert!(small.complete_ns >= big.complete_ns, "completions in order");
    }

    /// `cx3-scaled` is Lotus's ConnectX-3 (56 Gb/s, 35 Mops WRITE, 2.5 Mops CAS) with
    /// every rate divided by one k and the latencies of `cx5`.
    #[test]
    fn the_scaled_profile_divides_every_rate_by_one_k_and_keeps_latencies() {
        let m = TimingModel::load("cx3-scaled").unwrap().unwrap();
        let cx5 = TimingModel::load("cx5").unwrap().unwrap();
        let (p, c) = (m.params(), cx5.params());
        let k = 35.0 / p.nic.msg_rate_mops;
        assert!(k >= 8.0, "scaled down, k = {k}");
        let same = |a: f64, b: f64| (a - b).abs() < 1e-9 * b;
        assert!(
            same(p.atomic.host_mops * k, 2.5),
            "CAS: {}",
            p.atomic.host_mops
        );
        assert!(
            same(p.link.line_rate_gbps * k, 56.0),
            "{}",
            p.link.line_rate_gbps
        );
        assert!(
            same(p.atomic.dm_mops * k, c.atomic.dm_mops),
            "{}",
            p.atomic.dm_mops
        );
        assert_eq!(p.link.one_way_ns, c.link.one_way_ns);
        assert_eq!(p.nic.doorbell_ns, c.nic.doorbell_ns);
        assert_eq!(p.atomic.same_addr_host_ns, c.atomic.same_addr_host_ns);
        assert_eq!(p.atomic.same_addr_dm_ns, c.atomic.same_addr_dm_ns);
        // The atomic unit is the slowest resource: 1 / (2.5 Mops / k) per CAS.
        assert_eq!(m.atomic_host_ns, (400.0 * k).round() as u64);
        assert!(m.describe().contains("cx3-scaled"));
    }

    #[test]
    fn profiles_load_and_bad_ones_say_why() {
        for name in ["cx5", "cx6", "rxe", "cx3-scaled"] {
            let m = TimingModel::load(name).unwrap().unwrap();
            assert_eq!(m.params().name, name);
            assert!(m.describe().starts_with(name));
        }
        assert!(TimingModel::load("none").unwrap().is_none());
        assert!(TimingModel::load("").unwrap().is_none());
        let e = TimingModel::load("cx7").unwrap_err();
        assert!(e.to_string().contains("not a built-in profile"), "{e}");
        let e = TimingModel::load("/nonexistent/x.toml").unwrap_err();
        assert!(e.to_string().contains("cannot read"), "{e}");
        let mut p = params();
        p.nic.msg_rate_mops = 0.0;
        assert!(TimingModel::new(p, "t".into())
            .unwrap_err()
            .contains("msg_rate_mops"));
        let dir = std::env::temp_dir().join(format!("rrpc-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("bad.toml");
        std::fs::write(&f, "name = \"x\"\n[link]\none_way_ns = -1\n").unwrap();
        let e = TimingModel::load(f.to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("bad.toml"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
