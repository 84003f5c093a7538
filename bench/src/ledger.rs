//! A compute node's accounting of its commits that survives `kill -9`: one slot per
//! coordinator coroutine in a shared-memory file, updated with plain stores as the
//! coroutine runs, read by `txn-bench` after the process died. With the commit-log notes
//! that recovery reports ([`txn::recovery::RecoveryReport::forward_notes`]), it gives the
//! exact net money (SmallBank) of a dead life, including the commit it was in the middle
//! of and that recovery finished for it; its streamed counters end at its last batch.
//!
//! Slot layout (8-byte words): `pending | current | id0 total0 commits0 | id1 total1
//! commits1`. Before each attempt the coroutine stores its id in `pending`; after a
//! commit it writes the record the `current` word does not point at, then flips
//! `current`. A process killed between any two stores leaves a consistent slot: the
//! current record counts every commit but perhaps the pending one, which counts iff
//! recovery rolled its log forward and the current record is not already its.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::MmapMut;

/// Words per slot.
const SLOT_WORDS: usize = 8;
const PENDING: usize = 0;
const CURRENT: usize = 1;
const REC: [usize; 2] = [2, 5];

/// The shared-memory file of one compute-node life.
#[derive(Debug)]
pub struct Ledger {
    map: MmapMut,
    path: PathBuf,
    slots: usize,
}

impl Ledger {
    /// Where the ledger of compute node `node`'s life `incarnation` in `cluster` lives.
    pub fn path(cluster: &str, node: u32, incarnation: u32) -> PathBuf {
        PathBuf::from(format!(
            "/dev/shm/rrpc-ledger-{cluster}-{node}-{incarnation}"
        ))
    }

    /// Create (or truncate) the ledger at `path` with `slots` zeroed slots.
    ///
    /// Errors: the file cannot be created, sized or mapped.
    pub fn create(path: &Path, slots: usize) -> std::io::Result<Arc<Self>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        f.set_len((slots.max(1) * SLOT_WORDS * 8) as u64)?;
        // SAFETY: the file is ours (just created) and sized; other processes only read
        // it after this one exited.
        let map = unsafe { MmapMut::map_mut(&f)? };
        Ok(Arc::new(Self {
            map,
            path: path.to_path_buf(),
            slots,
        }))
    }

    fn word(&self, slot: usize, w: usize) -> &AtomicU64 {
        assert!(
            slot < self.slots && w < SLOT_WORDS,
            "ledger slot {slot} word {w}"
        );
        let off = (slot * SLOT_WORDS + w) * 8;
        let p = self.map[off..off + 8].as_ptr() as *const AtomicU64;
        // SAFETY: in bounds (checked), 8-byte aligned (the map is page-aligned and
        // offsets are multiples of 8), and the map lives as long as `self`; every
        // access goes through atomics.
        unsafe { &*p }
    }

    /// Slot `i` for one coroutine.
    pub fn slot(self: &Arc<Self>, i: usize) -> LedgerSlot {
        assert!(i < self.slots, "ledger slot {i} of {}", self.slots);
        LedgerSlot {
            ledger: self.clone(),
            i,
        }
    }

    /// Read the ledger at `path` (of a process that exited).
    ///
    /// Errors: the file cannot be read.
    pub fn read(path: &Path) -> std::io::Result<Vec<SlotState>> {
        Ok(Self::parse(&std::fs::read(path)?))
    }

    /// The slots of a ledger file's bytes `b` (read here or on another host); a
    /// trailing partial slot is ignored.
    pub fn parse(b: &[u8]) -> Vec<SlotState> {
        let w = |s: usize, i: usize| {
            let o = (s * SLOT_WORDS + i) * 8;
            u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
        };
        (0..b.len() / (SLOT_WORDS * 8))
            .map(|s| {
                let r = REC[(w(s, CURRENT) & 1) as usize];
                SlotState {
                    pending: w(s, PENDING),
                    id: w(s, r),
                    total: w(s, r + 1) as i64,
                    commits: w(s, r + 2),
                }
            })
            .collect()
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One coroutine's slot.
#[derive(Debug)]
pub struct LedgerSlot {
    ledger: Arc<Ledger>,
    i: usize,
}

impl LedgerSlot {
    /// An attempt with transaction id `id` starts.
    pub fn begin(&self, id: u64) {
        self.ledger
            .word(self.i, PENDING)
            .store(id, Ordering::Release);
    }

    /// Attempt `id` committed with net `net`.
    pub fn committed(&self, id: u64, net: i64) {
        let l = &self.ledger;
        let cur = l.word(self.i, CURRENT).load(Ordering::Relaxed) & 1;
        let (old, new) = (REC[cur as usize], REC[(cur ^ 1) as usize]);
        let total = l.word(self.i, old + 1).load(Ordering::Relaxed) as i64 + net;
        let commits = l.word(self.i, old + 2).load(Ordering::Relaxed) + 1;
        l.word(self.i, new).store(id, Ordering::Relaxed);
        l.word(self.i, new + 1)
            .store(total as u64, Ordering::Relaxed);
        l.word(self.i, new + 2).store(commits, Ordering::Release);
        l.word(self.i, CURRENT).store(cur ^ 1, Ordering::Release);
    }
}

/// A slot as read after the process died.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotState {
    /// The last attempt started.
    pub pending: u64,
    /// The last commit counted.
    pub id: u64,
    /// Net of the commits counted.
    pub total: i64,
    /// Commits counted.
    pub commits: u64,
}

/// The exact net and commits of a dead life's slots, given the `(id, note)` of every
/// commit log recovery rolled forward: a slot's pending attempt counts when its log was
/// rolled forward and it is not the slot's last counted commit already.
pub fn settle(slots: &[SlotState], forward: &[(u64, i64)]) -> (i64, u64) {
    let mut net = 0;
    let mut commits = 0;
    for s in slots {
        net += s.total;
        commits += s.commits;
        if s.pending != 0 && s.pending != s.id {
            if let Some(&(_, note)) = forward.iter().find(|&&(id, _)| id == s.pending) {
                net += note;
                commits += 1;
            }
        }
    }
    (net, commits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_counts_its_commits_and_a_forward_pending_one_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ledger");
        let l = Ledger::create(&p, 2).unwrap();
        let s = l.slot(0);
        s.begin(11);
        s.committed(11, 5);
        s.begin(12);
        s.committed(12, -2);
        s.begin(13); // in flight at the death
        let t = l.slot(1);
        t.begin(21); // in flight, rolled back
        let got = Ledger::read(&p).unwrap();
        assert_eq!(got[0].total, 3);
        assert_eq!(got[0].commits, 2);
        // 13 rolled forward with note 7; 21 rolled back; 12's stale log forward too.
        let fwd = [(13, 7), (12, -2)];
        assert_eq!(settle(&got, &fwd), (10, 3));
        // Without 13 rolled forward, only what was counted.
        assert_eq!(settle(&got, &[(12, -2)]), (3, 2));
        // Once counted, a forward log of the same id is not counted again.
        s.committed(13, 7);
        let got = Ledger::read(&p).unwrap();
        assert_eq!(settle(&got, &fwd), (10, 3));
    }
}
