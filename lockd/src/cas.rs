//! The CAS spinlock baseline as a plain state machine, without any fabric: the lock of
//! FORD (Zhang et al., "FORD: Fast One-sided RDMA-based Distributed Transactions for
//! Disaggregated Persistent Memory", FAST'22: lock by one-sided CAS, unlock by one-sided
//! WRITE) and of FaRM's commit-phase locking (Dragojevic et al., NSDI'14).
//!
//! One 8-byte word per lock: [`FREE`] (0) when free, else the holder's id, which is never
//! zero ([`HolderId`]: the client's node id in the upper 32 bits, so a holder is
//! identifiable from the word alone). Acquire is one one-sided CAS `0 -> id`; a CAS that
//! returns anything else failed, and the client retries after a randomized exponential
//! backoff ([`crate::backoff`]). There is no queue and no refusal: a waiter only ever
//! retries, so the lock is not fair: a client that releases and locks again usually beats
//! the waiters sitting out their backoff, and can keep the lock for many rounds in a row.
//!
//! Release ([`Release`]) is one one-sided WRITE of 0 by default, as FORD does. Why a
//! WRITE is safe against concurrent CAS attempts: while we hold the lock the word holds our
//! id, which is nonzero, so every other client's CAS compares against 0 and fails, and an
//! RDMA CAS whose compare fails does not modify its target (InfiniBand spec, Compare & Swap:
//! the swap value is written only when the compare matches). Our WRITE is thus the only
//! modification of the word while we hold it and nothing can overwrite it with a stale
//! value; a CAS executed after it sees 0 and is simply the next acquisition. An aligned
//! 8-byte WRITE is one PCIe write on an RNIC and one aligned word on the shm fabric, so a
//! CAS never sees half of it. This relies on the RNIC not writing back the old value on a
//! failed compare (no RNIC we know of does; the IB spec only promises atomicity among
//! atomics). [`Release::Cas`] (CAS `id -> 0`) avoids relying on that, and checks that the
//! releaser really held the lock, for one atomic (the NIC's serialized atomic unit) instead
//! of a WRITE per release.

use std::time::Duration;

use crate::backoff::{Backoff, BackoffState};

/// The lock word of a free lock.
pub const FREE: u64 = 0;
/// Bytes per CAS lock in a word table: the one 8-byte word.
pub const CAS_STRIDE: u64 = 8;

/// A holder id as stored in a held lock's word: `node << 32 | client << 16 | seq`. `seq` is
/// never 0, so the id is never [`FREE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HolderId(u64);

impl HolderId {
    /// The id of acquisition `seq` (nonzero) by client `client` of node `node`.
    /// Panics if `seq == 0`.
    pub fn new(node: u32, client: u16, seq: u16) -> Self {
        assert_ne!(seq, 0, "a holder sequence number is nonzero");
        Self(u64::from(node) << 32 | u64::from(client) << 16 | u64::from(seq))
    }

    /// Decode a lock word; `None` for [`FREE`].
    pub fn from_word(w: u64) -> Option<Self> {
        (w != FREE).then_some(Self(w))
    }

    /// The word a lock held by this id contains.
    pub fn word(self) -> u64 {
        self.0
    }

    /// The holder's node id.
    pub fn node(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The holder's client number on its node.
    pub fn client(self) -> u16 {
        (self.0 >> 16) as u16
    }

    /// The acquisition's sequence number within its client.
    pub fn seq(self) -> u16 {
        self.0 as u16
    }
}

/// Hands out [`HolderId`]s for one client: sequence numbers 1, 2, ..., 65535, 1, ...
/// (an id is reused only after 65535 later acquisitions of the same client).
#[derive(Clone, Debug)]
pub struct IdSource {
    node: u32,
    client: u16,
    seq: u16,
}

impl IdSource {
    /// Ids for client `client` of node `node`.
    pub fn new(node: u32, client: u16) -> Self {
        Self {
            node,
            client,
            seq: 0,
        }
    }

    /// The next id.
    pub fn next_id(&mut self) -> HolderId {
        self.seq = self.seq.checked_add(1).unwrap_or(1);
        HolderId::new(self.node, self.client, self.seq)
    }
}

/// How a CAS lock is released (`write` or `cas` in configs).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Release {
    /// One-sided WRITE of [`FREE`] (FORD); see the module docs for why it is safe.
    #[default]
    Write,
    /// One-sided CAS `id -> FREE`; the returned word must be our id.
    Cas,
}

/// What to do after one acquire CAS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The CAS swapped: we hold the lock.
    Acquired,
    /// Another holder (`holder`) has the lock: CAS again after `after`.
    Retry {
        /// The holder the CAS saw.
        holder: HolderId,
        /// Backoff delay before the next CAS.
        after: Duration,
    },
}

/// Why an acquire or release contradicts the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CasViolation {
    /// The acquire CAS found our own id: we already hold it, or ids collided.
    #[error("lock word already holds our id {0:#x}")]
    AlreadyHeld(u64),
    /// A CAS release found another word than our id: we did not hold the lock.
    #[error("release of {ours:#x} found word {found:#x}")]
    NotHolder {
        /// Our id.
        ours: u64,
        /// The word found.
        found: u64,
    },
}

/// One acquisition of a CAS lock: its id and its backoff sequence.
#[derive(Clone, Debug)]
pub struct Acquire {
    id: HolderId,
    backoff: BackoffState,
}

impl Acquire {
    /// Start acquiring with holder id `id`; backoff delays follow `policy` from `seed`.
    pub fn new(id: HolderId, policy: Backoff, seed: u64) -> Self {
        Self {
            id,
            backoff: policy.start(seed),
        }
    }

    /// Our holder id.
    pub fn id(&self) -> HolderId {
        self.id
    }

    /// The CAS to issue: `(compare, swap)` = `(FREE, id)`.
    pub fn cas_args(&self) -> (u64, u64) {
        (FREE, self.id.word())
    }

    /// Failed CASes so far.
    pub fn failures(&self) -> u32 {
        self.backoff.failures()
    }

    /// Decide from the word the CAS returned (the old value).
    ///
    /// Errors: [`CasViolation::AlreadyHeld`] if the word is our own id.
    pub fn on_cas(&mut self, old: u64) -> Result<Step, CasViolation> {
        match HolderId::from_word(old) {
            None => Ok(Step::Acquired),
            Some(h) if h == self.id => Err(CasViolation::AlreadyHeld(old)),
            Some(holder) => Ok(Step::Retry {
                holder,
                after: self.backoff.next_delay(),
            }),
        }
    }
}

/// Check the word a [`Release::Cas`] release returned.
///
/// Errors: [`CasViolation::NotHolder`] unless it is `id`.
pub fn check_cas_release(id: HolderId, old: u64) -> Result<(), CasViolation> {
    if old == id.word() {
        Ok(())
    } else {
        Err(CasViolation::NotHolder {
            ours: id.word(),
            found: old,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The one-sided CAS, on a local word.
    fn cas(w: &AtomicU64, (compare, swap): (u64, u64)) -> u64 {
        match w.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
            Ok(v) | Err(v) => v,
        }
    }

    #[test]
    fn holder_ids_are_nonzero_and_identify_the_holder() {
        let id = HolderId::new(7, 3, 9);
        assert_eq!((id.node(), id.client(), id.seq()), (7, 3, 9));
        assert_eq!(HolderId::from_word(id.word()), Some(id));
        assert_eq!(HolderId::from_word(FREE), None);
        let mut ids = IdSource::new(0, 0);
        let first = ids.next_id();
        assert_eq!(first.seq(), 1);
        assert_ne!(first.word(), FREE, "node 0, client 0 still nonzero");
        for _ in 1..u16::MAX {
            assert_ne!(ids.next_id().word(), FREE);
        }
        assert_eq!(ids.next_id(), first, "wraps to 1, skipping 0");
    }

    #[test]
    fn free_word_is_acquired_held_word_retries_never_refused() {
        let w = AtomicU64::new(FREE);
        let mut a = Acquire::new(HolderId::new(1, 0, 1), Backoff::default(), 1);
        let mut b = Acquire::new(HolderId::new(2, 0, 1), Backoff::default(), 2);
        assert_eq!(a.on_cas(cas(&w, a.cas_args())), Ok(Step::Acquired));
        assert_eq!(w.load(Ordering::Relaxed), a.id().word());
        // b retries as long as a holds, with growing (capped) backoff, and never gives up.
        for i in 0..50 {
            match b.on_cas(cas(&w, b.cas_args())).unwrap() {
                Step::Retry { holder, after } => {
                    assert_eq!(holder, a.id());
                    assert!(after <= Backoff::default().ceiling(i));
                }
                Step::Acquired => panic!("acquired a held lock"),
            }
        }
        assert_eq!(b.failures(), 50);
        assert_eq!(
            w.load(Ordering::Relaxed),
            a.id().word(),
            "failed CAS wrote nothing"
        );
        // a releases with a WRITE of 0; b's next CAS succeeds.
        w.store(FREE, Ordering::Release);
        assert_eq!(b.on_cas(cas(&w, b.cas_args())), Ok(Step::Acquired));
        // CAS release checks the holder.
        assert_eq!(
            check_cas_release(a.id(), cas(&w, (a.id().word(), FREE))),
            Err(CasViolation::NotHolder {
                ours: a.id().word(),
                found: b.id().word()
            })
        );
        assert_eq!(w.load(Ordering::Relaxed), b.id().word());
        assert_eq!(
            check_cas_release(b.id(), cas(&w, (b.id().word(), FREE))),
            Ok(())
        );
        assert_eq!(w.load(Ordering::Relaxed), FREE);
    }

    #[test]
    fn own_id_in_the_word_is_a_violation() {
        let id = HolderId::new(1, 2, 3);
        let mut a = Acquire::new(id, Backoff::default(), 0);
        assert_eq!(
            a.on_cas(id.word()),
            Err(CasViolation::AlreadyHeld(id.word()))
        );
    }

    #[test]
    fn backoff_is_reproducible_per_seed() {
        let h = HolderId::new(9, 9, 9).word();
        let delays = |seed| {
            let mut a = Acquire::new(HolderId::new(1, 1, 1), Backoff::default(), seed);
            (0..10)
                .map(|_| match a.on_cas(h).unwrap() {
                    Step::Retry { after, .. } => after,
                    Step::Acquired => unreachable!(),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(delays(5), delays(5));
        assert_ne!(delays(5), delays(6));
    }
}
