//! One end of a Rocket pair, the same for callers and servers (Scythe
//! Scythe, 4.6 (3), Fig. 21): it sends on a ring in the peer's memory
//! (through a staging copy here) and receives on a ring in this process's memory that
//! the peer writes.
//!
//! A `Channel` owns everything that happens between "a message is pushed" and "its
//! bucket has landed": the open bucket and sealing (msg batching), the order of a
//! flush's WRs (doorbell batching: a round's data WRITEs, then its buckets, then the
//! credit return, as one list), credits in both directions, a backlog for messages
//! that find the ring full, and the replay of lists that a failed QP flushed. The caller
//! (`crate::runtime`) and the server (`crate::server`) each hold one per Rocket pair
//! and differ only in what they put in it.
//!
//! The protocol part is sans-IO: `Channel::plan` produces the list to post as
//! `Item`s, `Channel::failed` takes back what a failed list carried, and the ring
//! memories are any `RingMem`; the unit tests below run two channels against each
//! other over heap memory, with torn, duplicated and lost WRITEs. `post_items` is
//! the I/O edge that turns items into verbs WRs on a shared QP.
//!
//! **Zero-copy data and its Done message travel in one ordered list.** A server's reply
//! WRITE into the caller's buffer (`DataWrite`) is queued with the message that tells
//! the caller it is there. At plan time the Done message is pushed into the ring and the
//! WRITE is placed ahead of every bucket of the list; RC executes a QP's WRs in order,
//! so the caller sees Done only after the data landed, with no completion round trip in
//! between. A replay after a failed QP posts the WRITE again only while its Done bucket
//! has not been consumed: once the caller consumed Done, the caller may already have
//! reused the buffer, and the data is known to have landed.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::arena::Chunk;
use crate::fabric::{MemoryRegion, MrDesc, RemoteAddr, SendWr, WrOpcode};
use crate::mem::RingMem;
use crate::rocket::{
    BucketSpan, MsgHeader, RocketConfig, RocketError, RocketReceiver, RocketSender,
};
use crate::straw::{Mailbox, SharedQp};
use crate::wire::Batching;

/// Return credits after a quarter of the ring has been consumed (and at least every
/// bucket for tiny rings), so the sender rarely stalls and credit WRITEs stay rare.
pub(crate) fn credit_every(cfg: &RocketConfig) -> u64 {
    (cfg.buckets as u64 / 4).max(1)
}

/// A WRITE of reply data from a registered local buffer into the peer's memory, sent
/// ahead of the message `done` that announces it (zero-copy replies). Owns its buffer:
/// dropping it (once the data landed, or will never be sent) returns the chunk.
#[derive(Debug)]
pub(crate) struct DataWrite {
    /// The local buffer (a chunk of the sender's arena) and the bytes to send from it.
    pub chunk: Chunk,
    /// Bytes to WRITE from the start of `chunk`.
    pub len: usize,
    /// Where the bytes go.
    pub remote: RemoteAddr,
    /// The message announcing the data, pushed into the ring at plan time.
    pub done: MsgHeader,
    /// Payload of `done` (its length fields).
    pub done_payload: [u8; 16],
    /// Bucket number that carries `done`, once pushed.
    pub done_seq: Option<u64>,
}

/// One WR of a planned list, in posting order. Owns the buffers its WR uses, so a
/// posted list's record keeps them until the list completes.
#[derive(Debug)]
pub(crate) enum Item {
    /// A data WRITE (see [`DataWrite`]).
    Data(DataWrite),
    /// A sealed bucket: staging bytes `offset..offset+len` to the same place of the
    /// peer's ring.
    Span(BucketSpan),
    /// The credit return: this many buckets of the receive ring consumed.
    Credit(u64),
    /// A one-sided READ riding along with the list (a server fetching a request sent
    /// by reference); READs are idempotent, so a failed one is simply posted again.
    Read(ReadFetch),
}

/// A one-sided READ of `len` bytes at `remote` into `chunk` of the reader's arena;
/// `tag` tells its owner what it was for. Owns `chunk` until the READ completed (or
/// will never be posted).
#[derive(Debug)]
pub(crate) struct ReadFetch {
    /// Local buffer.
    pub chunk: Chunk,
    /// Bytes.
    pub len: usize,
    /// Where to read.
    pub remote: RemoteAddr,
    /// Owner's tag.
    pub tag: u64,
}

/// One end of a Rocket pair. `M` is the memory the rings live in: registered regions in
/// the runtime and the server, heap memory in tests.
pub(crate) struct Channel<M: RingMem = MemoryRegion> {
    cfg: RocketConfig,
    batching: Batching,
    tx: RocketSender,
    /// This end's copy of the peer's ring (the source of bucket WRITEs).
    staging: M,
    rx: RocketReceiver,
    /// The ring the peer writes into.
    ring: M,
    /// Word 0: credits of `tx`, written by the peer. Word 1: source of the credit WRITE.
    words: M,
    /// The peer's ring.
    peer_ring: MrDesc,
    /// The peer's word 0.
    peer_credit: RemoteAddr,
    credit_every: u64,
    /// Sealed buckets to post, replays first.
    spans: VecDeque<BucketSpan>,
    /// Data WRITEs whose Done is not in the ring yet.
    data_new: VecDeque<DataWrite>,
    /// Data WRITEs whose Done is in the ring, to post (replays first).
    data_ready: VecDeque<DataWrite>,
    /// READs to post with the next list.
    reads: VecDeque<ReadFetch>,
    force_credit: bool,
    /// Messages that found the ring full, in order (nothing is lost).
    backlog: VecDeque<(MsgHeader, Vec<u8>)>,
    /// The highest bucket a failed list gave back (a replay), if any.
    replay_upto: Option<u64>,
    /// Replayed buckets whose WRITE is posted and not yet completed: the sender must
    /// not reuse their slots while the NIC may still read their staging bytes (the
    /// receiver may have consumed them already, from the first WRITE).
    replays_in_flight: std::collections::BTreeSet<u64>,
    /// Lists outstanding on `qp`, and the QP they are on.
    pub(crate) lists: usize,
    pub(crate) qp: Option<Arc<SharedQp>>,
    /// Posts on a usable QP since the straw last chose one (see [`Channel::take_qp`]).
    kept: u32,
}

/// How many times in a row an idle channel keeps its usable QP before it asks the straw
/// again: a re-pick costs the straw's lock and two reference counts, more than the rest
/// of a small RPC's post, and the straw's balance only shifts when threads come and go.
const REPICK_EVERY: u32 = 64;

/// A [`Channel`] checked and not yet started: it holds no arena chunk yet, so (unlike a
/// channel, whose queues own chunks of one thread's arena) it can move to the thread that
/// will run it ([`ChannelSetup::start`]).
pub(crate) struct ChannelSetup<M: RingMem = MemoryRegion> {
    cfg: RocketConfig,
    batching: Batching,
    tx: RocketSender,
    staging: M,
    rx: RocketReceiver,
    ring: M,
    words: M,
    peer_ring: MrDesc,
    peer_credit: RemoteAddr,
}

impl<M: RingMem> ChannelSetup<M> {
    /// A channel sending into `peer_ring` (through `staging`, which must have the ring's
    /// size) and receiving on `ring`; `words` holds 16 bytes (see [`Channel`]'s field
    /// docs). Errors: a bad geometry; memory smaller than the geometry.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cfg: RocketConfig,
        batching: Batching,
        staging: M,
        ring: M,
        words: M,
        peer_ring: MrDesc,
        peer_credit: RemoteAddr,
    ) -> Result<Self, RocketError> {
        let need = cfg.ring_bytes();
        for m in [&staging, &ring] {
            if m.len() < need {
                return Err(RocketError::StagingTooSmall {
                    have: m.len(),
                    need,
                });
            }
        }
        if words.len() < 16 {
            return Err(RocketError::StagingTooSmall {
                have: words.len(),
                need: 16,
            });
        }
        Ok(Self {
            cfg,
            batching,
            tx: RocketSender::new(cfg)?,
            staging,
            rx: RocketReceiver::new(cfg)?,
            ring,
            words,
            peer_ring,
            peer_credit,
        })
    }

    /// The channel, run on the calling thread.
    pub(crate) fn start(self) -> Channel<M> {
        let Self {
            cfg,
            batching,
            tx,
            staging,
            rx,
            ring,
            words,
            peer_ring,
            peer_credit,
        } = self;
        Channel {
            cfg,
            batching,
            tx,
            staging,
            rx,
            ring,
            words,
            peer_ring,
            peer_credit,
            credit_every: credit_every(&cfg),
            spans: VecDeque::new(),
            data_new: VecDeque::new(),
            data_ready: VecDeque::new(),
            reads: VecDeque::new(),
            force_credit: false,
            backlog: VecDeque::new(),
            replay_upto: None,
            replays_in_flight: std::collections::BTreeSet::new(),
            lists: 0,
            qp: None,
            kept: 0,
        }
    }
}

impl<M: RingMem> Channel<M> {
    /// [`ChannelSetup::new`], started on the calling thread. Errors as there.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cfg: RocketConfig,
        batching: Batching,
        staging: M,
        ring: M,
        words: M,
        peer_ring: MrDesc,
        peer_credit: RemoteAddr,
    ) -> Result<Self, RocketError> {
        Ok(ChannelSetup::new(cfg, batching, staging, ring, words, peer_ring, peer_credit)?.start())
    }

    /// Take the QP to post this channel's next lists on out of `self.qp`; the caller puts
    /// it back (`self.qp = Some(qp)`) once it has posted. Returns it and whether it differs
    /// from the previous one, or `None` (then `self.qp` is untouched) when nothing can be
    /// posted: lists are outstanding on a broken QP (they stay on theirs, for RC order)
    /// or `pick` found no usable QP.
    ///
    /// With lists outstanding the channel stays on its QP. Idle, it keeps a usable QP for
    /// [`REPICK_EVERY`] posts and otherwise asks `pick` (the straw's load-balancing
    /// choice, RdmaStraw: Scythe, 4.6) with the current QP.
    pub(crate) fn take_qp(
        &mut self,
        pick: impl FnOnce(Option<&Arc<SharedQp>>) -> Option<Arc<SharedQp>>,
    ) -> Option<(Arc<SharedQp>, bool)> {
        if self.lists > 0 {
            return match &self.qp {
                Some(q) if !q.is_broken() => self.qp.take().map(|q| (q, false)),
                _ => None,
            };
        }
        if let Some(q) = &self.qp {
            if q.usable() && self.kept < REPICK_EVERY {
                self.kept += 1;
                return self.qp.take().map(|q| (q, false));
            }
        }
        let q = pick(self.qp.as_ref())?;
        self.kept = 0;
        let switched = self.qp.take().is_some_and(|old| !Arc::ptr_eq(&old, &q));
        Some((q, switched))
    }

    /// Geometry of both rings.
    pub(crate) fn config(&self) -> RocketConfig {
        self.cfg
    }

    /// Batching of this direction.
    pub(crate) fn batching(&self) -> Batching {
        self.batching
    }

    /// Largest payload of one message in bytes (`bucket_size - 32`).
    pub(crate) fn max_payload(&self) -> usize {
        self.tx.max_payload()
    }

    /// Take the credit the peer wrote into word 0; returns whether it freed buckets. A
    /// word that runs ahead of what was posted is corrupt and ignored (the error says
    /// so).
    pub(crate) fn take_credit(&mut self) -> Result<bool, RocketError> {
        let before = self.tx.consumed();
        self.tx.on_credit(stable_word(&self.words, 0))?;
        Ok(self.tx.consumed() > before)
    }

    /// Append one message made of `parts`; sealed at once without msg batching. Errors
    /// (nothing written): [`RocketError::RingFull`] until credit arrives (the caller
    /// waits), [`RocketError::TooLarge`].
    pub(crate) fn push(&mut self, hdr: MsgHeader, parts: &[&[u8]]) -> Result<(), RocketError> {
        self.tx.push_parts(&self.staging, hdr, parts)?;
        if !self.batching.msg() {
            self.tx.seal(&self.staging);
        }
        Ok(())
    }

    /// Append one message, or queue it behind earlier ones when the ring is full (the
    /// server's way: it must not lose a response and cannot wait). Errors: the payload
    /// is larger than a bucket holds.
    pub(crate) fn push_or_queue(
        &mut self,
        hdr: MsgHeader,
        payload: &[u8],
    ) -> Result<(), RocketError> {
        if self.backlog.is_empty() {
            match self.push(hdr, &[payload]) {
                Err(RocketError::RingFull) => {}
                r => return r,
            }
        } else if payload.len() > self.max_payload() {
            return Err(RocketError::TooLarge {
                len: payload.len(),
                max: self.max_payload(),
            });
        }
        self.backlog.push_back((hdr, payload.to_vec()));
        Ok(())
    }

    /// Messages waiting for ring space.
    pub(crate) fn backlogged(&self) -> usize {
        self.backlog.len()
    }

    /// Move backlogged messages into the ring while it has room.
    pub(crate) fn drain_backlog(&mut self) {
        while let Some((h, p)) = self.backlog.pop_front() {
            if self.push(h, &[&p]).is_err() {
                self.backlog.push_front((h, p));
                break;
            }
        }
    }

    /// Queue a one-sided READ to post with the next list.
    pub(crate) fn push_read(&mut self, r: ReadFetch) {
        self.reads.push_back(r);
    }

    /// Queue a data WRITE and its Done message (see the module docs).
    pub(crate) fn push_data(&mut self, d: DataWrite) {
        self.data_new.push_back(d);
    }

    /// Receive the next complete bucket's messages into `out` (cleared first by the
    /// caller). Returns whether one arrived. Errors: the ring is corrupt.
    pub(crate) fn poll(&mut self, out: &mut Vec<u8>) -> Result<bool, RocketError> {
        self.rx.poll(&self.ring, out)
    }

    /// Whether anything waits to be posted, or a credit return is due (a quarter of the
    /// receive ring consumed since the last one; noted here so it goes out even when
    /// nothing else does).
    pub(crate) fn has_work(&mut self) -> bool {
        if self.rx.credit_due(self.credit_every).is_some() {
            self.force_credit = true;
        }
        !self.spans.is_empty()
            || !self.data_new.is_empty()
            || !self.data_ready.is_empty()
            || !self.reads.is_empty()
            || self.force_credit
            || self.tx.has_open()
            || self.tx.sealed() > self.tx.posted()
    }

    /// Plan the list to post now, in posting order: data WRITEs (each Done pushed into
    /// the ring first), the sealed buckets (replays first; ones the peer has consumed
    /// are dropped), then the credit return if a quarter of the receive ring has been
    /// consumed since the last one (or a replay asks for it). Data WRITEs that need no
    /// (re)post because their Done was consumed are dropped, returning their buffers.
    pub(crate) fn plan(&mut self, items: &mut Vec<Item>) {
        self.plan_with(items, true);
    }

    /// Whether a bucket filled up (a message did not fit behind it, so it was sealed)
    /// and has not been planned yet: posting it now loses no message batching, since
    /// nothing more can join it.
    pub(crate) fn has_full_bucket(&self) -> bool {
        self.tx.sealed() > self.tx.posted()
    }

    /// [`Channel::plan`] without sealing the open bucket: only buckets that are already
    /// sealed (full) go out, with the reads and the credit due; the open bucket keeps
    /// collecting messages for a later plan. A server answering a round's requests bucket
    /// by bucket uses it so that a reply bucket is posted when it is full, not once per
    /// request bucket: with requests of more than half a bucket every request bucket
    /// holds one message, and a post per request bucket is a doorbell per reply (msg
    /// batching lost, doorbell batching too). With data WRITEs waiting (their Done
    /// messages must ride in the same list) this is [`Channel::plan`].
    pub(crate) fn plan_full(&mut self, items: &mut Vec<Item>) {
        let seal_open = !self.data_new.is_empty();
        self.plan_with(items, seal_open);
    }

    fn plan_with(&mut self, items: &mut Vec<Item>, seal_open: bool) {
        let consumed = self.tx.consumed();
        // Replays whose Done the peer consumed: the data landed (RC order) and the
        // buffer on the peer may be in use again.
        self.data_ready
            .retain(|d| d.done_seq.is_none_or(|s| s >= consumed));
        while let Some(d) = self.data_new.front_mut() {
            if !self.backlog.is_empty() {
                break; // Done messages go behind the backlog, in order
            }
            match self
                .tx
                .push_parts(&self.staging, d.done, &[&d.done_payload[..]])
            {
                Ok(()) => {}
                Err(_) => break, // ring full: next round
            }
            // The message is in the open bucket, number `sealed`.
            d.done_seq = Some(self.tx.sealed());
            if !self.batching.msg() {
                self.tx.seal(&self.staging);
            }
            let d = self.data_new.pop_front().expect("front");
            self.data_ready.push_back(d);
        }
        if seal_open {
            self.tx.seal(&self.staging);
        }
        self.tx.take_ready_deque(&mut self.spans);
        if self.rx.credit_due(self.credit_every).is_some() {
            self.force_credit = true;
        }
        items.extend(self.reads.drain(..).map(Item::Read));
        items.extend(self.data_ready.drain(..).map(Item::Data));
        for s in self.spans.drain(..) {
            // A replayed bucket the peer has consumed needs no WRITE.
            if s.seq >= consumed {
                items.push(Item::Span(s));
            }
        }
        if std::mem::take(&mut self.force_credit) {
            items.push(Item::Credit(self.rx.consumed()));
        }
    }

    /// Take back planned items that were not posted (the send queue was full), in order:
    /// they go first next time.
    pub(crate) fn unposted(&mut self, items: impl DoubleEndedIterator<Item = Item>) {
        self.requeue(items);
    }

    /// Note planned items as posted (in a list now outstanding).
    pub(crate) fn posted(&mut self, items: &[Item]) {
        let Some(upto) = self.replay_upto else {
            return;
        };
        let before = self.replays_in_flight.len();
        for it in items {
            if let Item::Span(s) = it {
                if s.seq <= upto {
                    self.replays_in_flight.insert(s.seq);
                }
            }
        }
        if self.replays_in_flight.len() != before {
            self.tx
                .set_write_floor(self.replays_in_flight.first().copied());
        }
    }

    /// A list posted with `items` completed (or failed): its WRITEs read no more
    /// staging bytes. Returns whether that freed a slot held back for a replay (callers
    /// waiting for ring space should look again).
    pub(crate) fn list_done(&mut self, items: &[Item]) -> bool {
        if self.replays_in_flight.is_empty() {
            return false;
        }
        let before = self.replays_in_flight.first().copied();
        for it in items {
            if let Item::Span(s) = it {
                self.replays_in_flight.remove(&s.seq);
            }
        }
        let after = self.replays_in_flight.first().copied();
        self.tx.set_write_floor(after);
        after != before
    }

    /// Take back what a failed list carried (its QP was flushed): everything is posted
    /// again, in the original order, ahead of anything newer. Call
    /// [`Channel::list_done`] for it first.
    pub(crate) fn failed(&mut self, items: impl DoubleEndedIterator<Item = Item>) {
        let items: Vec<Item> = items.collect();
        for it in &items {
            if let Item::Span(s) = it {
                self.replay_upto = Some(self.replay_upto.map_or(s.seq, |u| u.max(s.seq)));
            }
        }
        self.requeue(items.into_iter());
    }

    fn requeue(&mut self, items: impl DoubleEndedIterator<Item = Item>) {
        // Between plans `spans` and `data_ready` hold only items taken back. Several lists
        // fail together (a QP error flushes all of them) and come back oldest first, so
        // each goes in by bucket number rather than simply in front, which would post
        // the newest list's buckets first.
        for it in items.rev() {
            match it {
                Item::Data(d) => {
                    let at = self.data_ready.partition_point(|q| q.done_seq < d.done_seq);
                    self.data_ready.insert(at, d);
                }
                Item::Span(s) => {
                    let at = self.spans.partition_point(|q| q.seq < s.seq);
                    self.spans.insert(at, s);
                }
                Item::Credit(_) => self.force_credit = true,
                Item::Read(r) => self.reads.push_front(r),
            }
        }
    }

    /// The verbs WR of a planned item; `data` is the memory data WRITEs come from.
    pub(crate) fn wr(&self, it: &Item, data: Option<&MemoryRegion>) -> SendWr
    where
        M: AsSge,
    {
        match it {
            Item::Data(d) => SendWr {
                wr_id: 0,
                opcode: WrOpcode::Write,
                sge: data
                    .expect("data WRITEs need their arena")
                    .sge(d.chunk.off(), d.len),
                remote: d.remote,
                signaled: false,
                inline: false,
            },
            Item::Span(s) => SendWr {
                wr_id: 0,
                opcode: WrOpcode::Write,
                sge: self.staging.sge_of(s.offset, s.len),
                remote: self.peer_ring.at(s.offset as u64),
                signaled: false,
                inline: false,
            },
            Item::Read(r) => SendWr {
                wr_id: 0,
                opcode: WrOpcode::Read,
                sge: data
                    .expect("READs need their arena")
                    .sge(r.chunk.off(), r.len),
                remote: r.remote,
                signaled: false,
                inline: false,
            },
            Item::Credit(c) => {
                self.words.store_u64(8, *c);
                SendWr {
                    wr_id: 0,
                    opcode: WrOpcode::Write,
                    sge: self.words.sge_of(8, 8),
                    remote: self.peer_credit,
                    signaled: false,
                    inline: true,
                }
            }
        }
    }
}

/// Memory a WR can name as its local buffer.
pub(crate) trait AsSge {
    /// The scatter/gather element of bytes `off..off+len`.
    fn sge_of(&self, off: usize, len: usize) -> crate::fabric::Sge;
}

impl AsSge for MemoryRegion {
    fn sge_of(&self, off: usize, len: usize) -> crate::fabric::Sge {
        self.sge(off, len)
    }
}

/// Read an 8-byte word a NIC writes, until two reads agree: Soft-RoCE places data with
/// `memcpy`, so a word can be seen half written for a moment. Used for credit words.
pub(crate) fn stable_word(mem: &impl RingMem, off: usize) -> u64 {
    let mut a = mem.load_u64(off);
    loop {
        let b = mem.load_u64(off);
        if a == b {
            return a;
        }
        a = b;
    }
}

/// Token table for posted lists: a list's token indexes the record of what it carried,
/// so its completion (delivered to a [`Mailbox`] as `(token, status)`) can finish or
/// replay it. Records and their item vectors are reused.
pub(crate) struct Lists<R> {
    recs: Vec<Option<R>>,
    free: Vec<usize>,
    /// Emptied item vectors, reused (no allocation per posted list).
    pub(crate) pool: Vec<Vec<Item>>,
}

impl<R> Default for Lists<R> {
    fn default() -> Self {
        Self {
            recs: Vec::new(),
            free: Vec::new(),
            pool: Vec::new(),
        }
    }
}

impl<R> Lists<R> {
    /// A free token.
    pub(crate) fn alloc(&mut self) -> usize {
        match self.free.pop() {
            Some(t) => t,
            None => {
                self.recs.push(None);
                self.recs.len() - 1
            }
        }
    }
    /// Give back a token that was not used.
    pub(crate) fn unused(&mut self, token: usize) {
        self.free.push(token);
    }
    /// Record what the list of `token` carried.
    pub(crate) fn set(&mut self, token: usize, r: R) {
        self.recs[token] = Some(r);
    }
    /// Take the record of a completed list (and free its token).
    pub(crate) fn take(&mut self, token: u64) -> Option<R> {
        let r = self.recs.get_mut(token as usize)?.take()?;
        self.free.push(token as usize);
        Some(r)
    }
    /// The records outstanding.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut R> {
        self.recs.iter_mut().flatten()
    }
}

/// What [`post_items`] did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Posted {
    /// Lists (doorbells) posted.
    pub lists: usize,
    /// WRs posted.
    pub wrs: usize,
    /// Some items waited for send-queue room.
    pub sq_full: bool,
}

/// Post `items` of `chan` on `qp` as lists of `per_list` WRs at most (one doorbell
/// each; `usize::MAX` for doorbell batching), recording each list as `rec(items)` under
/// a token of `lists` whose completion goes to `mailbox`. What does not fit is given
/// back to the channel, in order. `wrs` is scratch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn post_items<R>(
    chan: &mut Channel,
    qp: &SharedQp,
    items: &mut Vec<Item>,
    data: Option<&MemoryRegion>,
    per_list: usize,
    mailbox: &Arc<Mailbox>,
    lists: &mut Lists<R>,
    wrs: &mut Vec<SendWr>,
    mut rec: impl FnMut(Vec<Item>) -> R,
) -> Posted {
    let mut out = Posted::default();
    wrs.clear();
    wrs.extend(items.iter().map(|it| chan.wr(it, data)));
    let mut at = 0;
    let mut taken = 0; // items already moved out of `items`
    while at < wrs.len() {
        let end = at.saturating_add(per_list).min(wrs.len());
        let token = lists.alloc();
        let n = match qp.post(&mut wrs[at..end], mailbox, token as u64) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(error = %e, "post failed; will replay");
                0
            }
        };
        if n == 0 {
            lists.unused(token);
            out.sq_full = true;
            break;
        }
        chan.posted(&items[..n]);
        let mut v = lists.pool.pop().unwrap_or_default();
        v.extend(items.drain(..n));
        taken += n;
        lists.set(token, rec(v));
        chan.lists += 1;
        out.lists += 1;
        out.wrs += n;
        at += n;
    }
    debug_assert_eq!(taken + items.len(), wrs.len());
    if !items.is_empty() {
        chan.unposted(items.drain(..));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::ChunkPool;
    use crate::mem::HeapRing;
    use crate::rocket::decode_batch;

    fn cfg() -> RocketConfig {
        RocketConfig {
            bucket_size: 128,
            buckets: 4,
        }
    }

    fn chan(batching: Batching) -> Channel<HeapRing> {
        let c = cfg();
        Channel::new(
            c,
            batching,
            HeapRing::new(c.ring_bytes()),
            HeapRing::new(c.ring_bytes()),
            HeapRing::new(16),
            MrDesc {
                addr: 0,
                len: c.ring_bytes() as u64,
                rkey: 1,
            },
            RemoteAddr { addr: 0, rkey: 2 },
        )
        .unwrap()
    }

    fn hdr(i: u64) -> MsgHeader {
        MsgHeader {
            len: 0,
            handler: 7,
            kind: 1,
            flags: 0,
            call_id: i,
        }
    }

    /// How a planned item lands at the peer.
    #[derive(Clone, Copy, PartialEq)]
    enum Land {
        Whole,
        /// All but the end label (a WRITE cut short by a failure).
        Torn,
    }

    /// Apply an item from `a` to `b` as the fabric would.
    fn land(a: &Channel<HeapRing>, b: &Channel<HeapRing>, it: &Item, how: Land) {
        match it {
            Item::Span(s) => {
                let mut buf = vec![0u8; s.len - 8];
                a.staging.read(s.offset, &mut buf);
                b.ring.write(s.offset, &buf);
                if how == Land::Whole {
                    let end = s.offset + s.len - 8;
                    b.ring.store_u64(end, a.staging.load_u64(end));
                }
            }
            Item::Credit(c) => b.words.store_u64(0, *c),
            Item::Data(_) | Item::Read(_) => {}
        }
    }

    fn recv(b: &mut Channel<HeapRing>) -> Vec<u64> {
        let mut ids = Vec::new();
        let mut batch = Vec::new();
        loop {
            batch.clear();
            if !b.poll(&mut batch).unwrap() {
                return ids;
            }
            for m in decode_batch(&batch) {
                ids.push(m.unwrap().0.call_id);
            }
        }
    }

    fn plan(c: &mut Channel<HeapRing>) -> Vec<Item> {
        let mut items = Vec::new();
        c.plan(&mut items);
        items
    }

    #[test]
    fn plan_full_posts_only_full_buckets_and_keeps_the_open_one_filling() {
        let (mut a, mut b) = (chan(Batching::Combined), chan(Batching::Combined));
        // 128 B buckets hold two 40 B messages (56 B each behind the labels).
        for i in 0..2 {
            a.push(hdr(i), &[&[0u8; 40][..]]).unwrap();
        }
        assert!(!a.has_full_bucket());
        let mut items = Vec::new();
        a.plan_full(&mut items);
        assert!(items.is_empty(), "a part-full bucket waits");
        // The third message does not fit: the first bucket is full.
        a.push(hdr(2), &[&[0u8; 40][..]]).unwrap();
        assert!(a.has_full_bucket());
        a.plan_full(&mut items);
        assert_eq!(items.len(), 1);
        for it in &items {
            land(&a, &b, it, Land::Whole);
        }
        assert_eq!(recv(&mut b), vec![0, 1]);
        // The fourth joins the third in the open bucket; a full plan seals it.
        a.push(hdr(3), &[&[0u8; 40][..]]).unwrap();
        assert!(!a.has_full_bucket());
        for it in plan(&mut a) {
            land(&a, &b, &it, Land::Whole);
        }
        assert_eq!(recv(&mut b), vec![2, 3]);
    }

    #[test]
    fn messages_flow_and_credit_returns_after_wrap() {
        let (mut a, mut b) = (chan(Batching::Combined), chan(Batching::Combined));
        let mut got = Vec::new();
        let mut next = 0u64;
        // Far more buckets than the ring holds: only credit lets the sender go on. Under
        // Miri 20 rounds (still many laps of the ring) keep the run under a few seconds.
        let rounds = if cfg!(miri) { 20 } else { 200 };
        for _round in 0..rounds {
            a.take_credit().unwrap();
            while a.push(hdr(next), &[&[0u8; 40][..]]).is_ok() {
                next += 1;
            }
            for it in plan(&mut a) {
                land(&a, &b, &it, Land::Whole);
            }
            got.extend(recv(&mut b));
            for it in plan(&mut b) {
                land(&b, &a, &it, Land::Whole);
            }
        }
        assert!(
            next > rounds,
            "the sender stalled for good after {next} messages"
        );
        assert_eq!(got, (0..got.len() as u64).collect::<Vec<_>>());
        assert!(
            got.len() as u64 >= next - 8,
            "at most a ring's worth in flight"
        );
    }

    /// Regression: without msg batching `push` seals the bucket at once, so the only
    /// sign of work is a sealed bucket not yet taken; `has_work` must see it.
    #[test]
    fn has_work_sees_a_bucket_sealed_by_push() {
        for batching in [Batching::None, Batching::Doorbell] {
            let (mut a, mut b) = (chan(batching), chan(batching));
            assert!(!a.has_work(), "{batching:?}: a fresh channel");
            a.push(hdr(0), &[&[1u8; 8][..]]).unwrap();
            assert!(a.has_work(), "{batching:?}: a sealed bucket waits");
            let items = plan(&mut a);
            assert!(
                matches!(items.as_slice(), [Item::Span(_)]),
                "{batching:?}: {items:?}"
            );
            for it in &items {
                land(&a, &b, it, Land::Whole);
            }
            assert_eq!(recv(&mut b), vec![0], "{batching:?}");
            assert!(!a.has_work(), "{batching:?}: all posted");
        }
    }

    #[test]
    fn failed_list_is_replayed_in_order_and_torn_bucket_is_not_delivered() {
        let (mut a, mut b) = (chan(Batching::Combined), chan(Batching::Combined));
        for i in 0..6 {
            a.push(hdr(i), &[&[1u8; 40][..]]).unwrap();
        }
        let first = plan(&mut a);
        assert!(first.len() >= 2, "several buckets: {first:?}");
        // The QP fails after the first bucket landed; the second is torn.
        land(&a, &b, &first[0], Land::Whole);
        land(&a, &b, &first[1], Land::Torn);
        assert_eq!(recv(&mut b), vec![0, 1], "a torn bucket is never delivered");
        a.failed(first.into_iter());
        a.push(hdr(6), &[&[1u8; 40][..]]).unwrap();
        let replay = plan(&mut a);
        for it in &replay {
            land(&a, &b, it, Land::Whole);
        }
        assert_eq!(recv(&mut b), vec![2, 3, 4, 5, 6]);
    }

    #[test]
    fn duplicate_write_of_a_consumed_bucket_is_ignored_and_not_replayed() {
        let (mut a, mut b) = (chan(Batching::Combined), chan(Batching::Combined));
        for i in 0..2 {
            a.push(hdr(i), &[&[1u8; 40][..]]).unwrap();
        }
        let items = plan(&mut a);
        for it in &items {
            land(&a, &b, it, Land::Whole);
        }
        assert_eq!(recv(&mut b), vec![0, 1]);
        // The same WRITE lands again (a list reported failed after it had landed):
        // the receiver zeroed the bucket and expects the next number.
        for it in &items {
            land(&a, &b, it, Land::Whole);
        }
        assert_eq!(recv(&mut b), Vec::<u64>::new());
        // Once the credit says it was consumed, the replay posts nothing for it.
        let credit = plan(&mut b);
        assert!(matches!(credit.as_slice(), [] | [Item::Credit(_)]));
        b.force_credit = true;
        for it in plan(&mut b) {
            land(&b, &a, &it, Land::Whole);
        }
        a.take_credit().unwrap();
        a.failed(items.into_iter());
        assert!(plan(&mut a).is_empty());
    }

    #[test]
    fn a_replay_in_flight_holds_its_slot_after_credit_covers_it() {
        let (mut a, mut b) = (chan(Batching::None), chan(Batching::None));
        for i in 0..4 {
            a.push(hdr(i), &[&[1u8; 40][..]]).unwrap();
        }
        let first = plan(&mut a);
        a.posted(&first);
        for it in &first {
            land(&a, &b, it, Land::Whole);
        }
        assert_eq!(recv(&mut b), vec![0, 1, 2, 3]);
        // The QP fails before A saw the completions or the credit: the list comes back
        // and is posted again, a replay of buckets B already consumed.
        assert!(!a.list_done(&first));
        a.failed(first.into_iter());
        let replay = plan(&mut a);
        assert_eq!(replay.len(), 4);
        a.posted(&replay);
        // Now the credit for all four arrives.
        b.force_credit = true;
        for it in plan(&mut b) {
            land(&b, &a, &it, Land::Whole);
        }
        assert!(a.take_credit().unwrap());
        // Bucket 4 would reuse bucket 0's slot while the replay may still read it.
        assert_eq!(
            a.push(hdr(4), &[&[1u8; 40][..]]),
            Err(RocketError::RingFull)
        );
        assert!(a.list_done(&replay), "the held slot is free again");
        a.push(hdr(4), &[&[1u8; 40][..]]).unwrap();
        let next = plan(&mut a);
        assert!(
            matches!(next.as_slice(), [Item::Span(s)] if s.seq == 4),
            "{next:?}"
        );
    }

    #[test]
    fn backlog_keeps_order_when_the_ring_is_full() {
        let (mut a, mut b) = (chan(Batching::None), chan(Batching::None));
        for i in 0..20 {
            a.push_or_queue(hdr(i), &[0u8; 40]).unwrap();
        }
        assert!(a.backlogged() > 0);
        let mut got = Vec::new();
        for _ in 0..40 {
            a.take_credit().unwrap();
            a.drain_backlog();
            for it in plan(&mut a) {
                land(&a, &b, &it, Land::Whole);
            }
            got.extend(recv(&mut b));
            b.force_credit = true;
            for it in plan(&mut b) {
                land(&b, &a, &it, Land::Whole);
            }
        }
        assert_eq!(got, (0..20).collect::<Vec<_>>());
        assert_eq!(
            a.push_or_queue(hdr(0), &[0u8; 200]).unwrap_err(),
            RocketError::TooLarge { len: 200, max: 96 }
        );
    }

    #[test]
    fn data_goes_before_its_done_and_is_not_replayed_after_done_was_consumed() {
        let (mut a, mut b) = (chan(Batching::Combined), chan(Batching::Combined));
        let pool = ChunkPool::new(4096, 64);
        let d = |i: u64| DataWrite {
            chunk: pool.alloc(8).unwrap(),
            len: 8,
            remote: RemoteAddr { addr: 0, rkey: 9 },
            done: hdr(100 + i),
            done_payload: [0; 16],
            done_seq: None,
        };
        a.push(hdr(1), &[&[0u8; 8][..]]).unwrap();
        a.push_data(d(0));
        a.push_data(d(1));
        let items = plan(&mut a);
        let kinds: Vec<&str> = items
            .iter()
            .map(|i| match i {
                Item::Data(_) => "data",
                Item::Span(_) => "span",
                Item::Credit(_) => "credit",
                Item::Read(_) => "read",
            })
            .collect();
        assert_eq!(kinds, ["data", "data", "span"]);
        for it in &items {
            land(&a, &b, it, Land::Whole);
        }
        assert_eq!(recv(&mut b), vec![1, 100, 101]);
        b.force_credit = true;
        for it in plan(&mut b) {
            land(&b, &a, &it, Land::Whole);
        }
        a.take_credit().unwrap();
        // The list is reported failed after all: nothing is posted again, the buffers
        // are freed.
        assert_eq!(pool.in_use(), 2);
        a.failed(items.into_iter());
        let mut again = Vec::new();
        a.plan(&mut again);
        assert!(again.is_empty(), "{again:?}");
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn lists_failing_together_are_replayed_oldest_first() {
        let mut a = chan(Batching::None);
        a.push(hdr(0), &[&[1u8; 8][..]]).unwrap();
        let l1 = plan(&mut a);
        a.push(hdr(1), &[&[1u8; 8][..]]).unwrap();
        let l2 = plan(&mut a);
        // Both lists were on one QP that failed; their completions arrive in order.
        a.failed(l1.into_iter());
        a.failed(l2.into_iter());
        let seqs: Vec<u64> = plan(&mut a)
            .iter()
            .map(|i| match i {
                Item::Span(s) => s.seq,
                _ => u64::MAX,
            })
            .collect();
        assert_eq!(seqs, vec![0, 1]);
    }
}
