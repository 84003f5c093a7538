//! One rTX client: a coroutine's rTX ID, its log slot, lease issuer and allocator
//! (Transactional Indexes on Disaggregated Memory with Repairable Transaction, 4.4; the
//! paper gives one ID and log per CN thread, here one per coroutine, since coroutines of a
//! thread run rTXs concurrently).

use crate::alloc::Allocator;
use crate::error::RtxError;
use crate::layout::Layout;
use crate::lease::{Clock, LeaseConfig, LeaseIssuer};
use crate::mem::Mem;

/// Protocol parameters of a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Lease lengths (DRIFT and per-object estimates).
    pub lease: LeaseConfig,
    /// Repair lease in ms given by the CAS into DOING or a takeover; `None` uses the
    /// rTX's own lease length (inferred: the paper gives no value).
    pub repair_lease_ms: Option<u64>,
    /// How often, in ms, a repairer re-reads the log header while re-executing a
    /// TryCommit, stopping if the log is DONE or reused (4.4, dptr version wrap-around).
    /// Default 1.
    pub check_interval_ms: u64,
    /// Opt1 (4.5): a single-object write set writes no log. Default on.
    pub opt1: bool,
    /// Data pointers remembered per object, at most this many (0: none). A read of an
    /// object whose data pointer the client remembers issues the data READ beside the
    /// TXObj READ, in the same round, and keeps it when the TXObj still points there
    /// ([`crate::Tx::read`]); default 65,536.
    pub dptr_hints: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            lease: LeaseConfig::default(),
            repair_lease_ms: None,
            check_interval_ms: 1,
            opt1: true,
            dptr_hints: 1 << 16,
        }
    }
}

/// Counters of one client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// rTXs committed.
    pub commits: u64,
    /// rTXs aborted.
    pub aborts: u64,
    /// Log WRITEs (Opt1 commits make none).
    pub log_writes: u64,
    /// Repairs of other rTXs that changed something on the MN.
    pub repairs: u64,
    /// Reads whose data READ went out beside the TXObj READ at a remembered data
    /// pointer that was still current: one round instead of two.
    pub hint_hits: u64,
    /// Such reads whose TXObj had moved on: the data READ is repeated at the current
    /// pointer (two rounds, one READ wasted).
    pub hint_misses: u64,
    /// First reads that met a live holder's lock and took the object's committed value
    /// instead of aborting ([`crate::Tx::read`]).
    pub reads_under_lock: u64,
    /// Opt1 commits of one object read and written, which need no validation round.
    pub validations_skipped: u64,
    /// TXObj READs made waiting for a live holder's lock before an update's read
    /// ([`crate::Tx::read_for_update`]).
    pub lock_polls: u64,
}

/// A client: owns rTX ID `id` (log slot `id`), its leases and its allocator. Used by one
/// coroutine at a time; [`Client::begin`] starts an rTX, [`Client::repair`] repairs
/// another, [`Client::recover`] restarts.
#[derive(Debug)]
pub struct Client<C> {
    pub(crate) id: u16,
    pub(crate) layout: Layout,
    pub(crate) clock: C,
    pub(crate) cfg: Config,
    pub(crate) issuer: LeaseIssuer,
    pub(crate) alloc: Allocator,
    pub(crate) owners: Option<Vec<u64>>,
    /// The identity of this ID's last logged rTX if it may not have reached DONE (an
    /// I/O error interrupted it); finished before the slot is reused.
    pub(crate) unfinished: Option<u64>,
    pub(crate) stats: Stats,
    /// The last data pointer seen or installed per object (TXObj address), at most
    /// [`Config::dptr_hints`] of them (cleared when full).
    pub(crate) hints: std::collections::HashMap<u64, u64>,
    /// Where this client's commits stop as if it crashed (tests; `fault-injection`).
    #[cfg(any(test, feature = "fault-injection"))]
    pub(crate) crash: Option<crate::fault::CrashPoint>,
    /// Called at the crash point before the commit stops (a process-level test ends or
    /// stops its process there).
    #[cfg(any(test, feature = "fault-injection"))]
    pub(crate) crash_hook: Option<crate::fault::CrashHook>,
    /// The crash point fires only in rTXs that write a log (not Opt1's single writes).
    #[cfg(any(test, feature = "fault-injection"))]
    pub(crate) crash_logged_only: bool,
    /// Planted bug: this client's repairs leave a DOING log alone.
    #[cfg(any(test, feature = "fault-injection"))]
    pub(crate) planted_ignore_doing: bool,
    /// Planted bug: this client's repairs release a DOING rTX's locks without TryCommit.
    #[cfg(any(test, feature = "fault-injection"))]
    pub(crate) planted_naive_repair: bool,
}

impl<C: Clock> Client<C> {
    /// A client for rTX ID `id` whose allocator runs at `incarnation` (1..=255). A
    /// restarted client uses a new incarnation and calls [`Client::recover`] first.
    pub fn new(layout: Layout, id: u16, incarnation: u8, clock: C, cfg: Config) -> Self {
        assert!(
            id < layout.ids,
            "rTX ID {id} past the layout's {}",
            layout.ids
        );
        Self {
            id,
            layout,
            clock,
            cfg,
            issuer: LeaseIssuer::new(),
            alloc: Allocator::new(layout, id, incarnation),
            owners: None,
            unfinished: None,
            stats: Stats::default(),
            hints: std::collections::HashMap::new(),
            #[cfg(any(test, feature = "fault-injection"))]
            crash: None,
            #[cfg(any(test, feature = "fault-injection"))]
            crash_hook: None,
            #[cfg(any(test, feature = "fault-injection"))]
            crash_logged_only: false,
            #[cfg(any(test, feature = "fault-injection"))]
            planted_ignore_doing: false,
            #[cfg(any(test, feature = "fault-injection"))]
            planted_naive_repair: false,
        }
    }

    /// This client's rTX ID.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The allocator (for tests and loaders).
    pub fn allocator(&mut self) -> &mut Allocator {
        &mut self.alloc
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The data pointer last seen or installed for the object at `mptr`, if remembered.
    pub(crate) fn hint(&self, mptr: u64) -> Option<u64> {
        self.hints.get(&mptr).copied()
    }

    /// Remember `dptr` as the object's data pointer (a bounded map: cleared when full;
    /// a stale entry costs one wasted READ, never a wrong value).
    pub(crate) fn remember(&mut self, mptr: u64, dptr: u64) {
        if self.cfg.dptr_hints == 0 {
            return;
        }
        if self.hints.len() >= self.cfg.dptr_hints && !self.hints.contains_key(&mptr) {
            self.hints.clear();
        }
        self.hints.insert(mptr, dptr);
    }

    pub(crate) fn repair_lease_ms(&self, lease_len_ms: u64) -> u64 {
        self.cfg.repair_lease_ms.unwrap_or(lease_len_ms)
    }

    /// Take a data block, refilling from the MN's bitmap when the local cache is empty.
    pub(crate) async fn take_block<M: Mem>(&mut self, mem: &M) -> Result<u64, RtxError> {
        if let Some(b) = self.alloc.take(self.clock.now_ms()) {
            return Ok(b);
        }
        self.alloc.refill(mem).await?;
        let raw = mem
            .read(
                self.layout.owners_base(),
                (self.layout.chunks() * 8) as usize,
            )
            .await?;
        self.owners = Some(
            raw.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        );
        Ok(self
            .alloc
            .take(self.clock.now_ms())
            .expect("refill added blocks"))
    }

    /// Stop here with [`crate::mem::MemError::Crashed`] if a crash was planted at step
    /// `p` ("log", "locks", "doing", "install") of an rTX that writes a log (`logged`) or
    /// of any rTX, as planted; a no-op in builds without tests or `fault-injection`.
    pub(crate) fn crash_at(&self, _p: &'static str, _logged: bool) -> Result<(), RtxError> {
        #[cfg(any(test, feature = "fault-injection"))]
        if let Some(at) = self.crash {
            if at.step() == _p && (_logged || !self.crash_logged_only) {
                if self.crash_hook.is_some_and(|hook| hook(at, self.id)) {
                    return Ok(());
                }
                return Err(RtxError::Mem(crate::mem::MemError::Crashed));
            }
        }
        Ok(())
    }
}

/// The fault switches of process-level tests (see [`crate::fault`]).
impl<C: Clock> Client<C> {
    /// Arm a crash at `at` in this client's next rTX that writes a log (two or more
    /// objects written: a B-link split, a RACE rehash; Opt1's single-object writes pass
    /// through), calling `hook` there. Stays armed: `hook` decides what a second hit does.
    ///
    /// Errors: [`crate::fault::NotEnabled`] in a build without the `fault-injection` feature.
    pub fn arm_crash(
        &mut self,
        at: crate::fault::CrashPoint,
        hook: crate::fault::CrashHook,
    ) -> Result<(), crate::fault::NotEnabled> {
        #[cfg(feature = "fault-injection")]
        {
            self.crash = Some(at);
            self.crash_hook = Some(hook);
            self.crash_logged_only = true;
            Ok(())
        }
        #[cfg(not(feature = "fault-injection"))]
        {
            let _ = (at, hook);
            Err(crate::fault::NotEnabled)
        }
    }

    /// Plant `p` in this client's repairs.
    ///
    /// Errors: [`crate::fault::NotEnabled`] in a build without the `fault-injection` feature.
    pub fn plant(&mut self, p: crate::fault::Plant) -> Result<(), crate::fault::NotEnabled> {
        #[cfg(feature = "fault-injection")]
        {
            match p {
                crate::fault::Plant::NaiveRepair => self.planted_naive_repair = true,
                crate::fault::Plant::IgnoreDoing => self.planted_ignore_doing = true,
            }
            Ok(())
        }
        #[cfg(not(feature = "fault-injection"))]
        {
            let _ = p;
            Err(crate::fault::NotEnabled)
        }
    }
}

#[cfg(test)]
pub(crate) use crate::fault::CrashPoint;
