//! One server thread: its Rocket pairs, reply buffers, in-flight async handlers and
//! fetches, and the polling round (see the module docs of [`crate::server`]).

use crate::NodeId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::handlers::{BatchReq, Caller, Entry, Handlers};
use super::mode::{parse_request, route, Route};
use super::{ServerStraw, StrawMap};
use crate::arena::{Arena, Chunk};
use crate::channel::{post_items, Channel, ChannelSetup, DataWrite, Item, Lists, ReadFetch};
use crate::exec;
use crate::fabric::{MemoryRegion, RemoteAddr, SendWr, WcStatus};
use crate::rocket::{decode_batch, MsgHeader};
use crate::straw::Mailbox;
use crate::wire::{FetchPrefix, IdHash, MsgKind, ReadReply, ReplyMode, ZeroCopyPrefix, IDLE_SPINS};

/// How long a Rocket may find none of its straw's QPs usable before it is dropped (the
/// requester reconnects a failed QP within milliseconds; a dead one never does).
const STUCK_LIMIT: Duration = Duration::from_secs(2);

/// Commands from the control plane to a server thread.
pub(crate) enum Cmd {
    Add(Box<NewConn>),
    Close(u64),
    /// Drop the Rockets of this caller, unanswered ([`super::RpcServer::fence`]).
    Fence(Caller),
}

/// The server end of one Rocket pair.
pub(crate) struct ServerConn {
    /// Stable id: indices shift when dead channels are removed.
    id: u64,
    straw: Arc<ServerStraw>,
    peer: NodeId,
    /// Who the Rocket's requester authenticated as at setup.
    caller: Caller,
    chan: Channel,
    /// The requester's [`ReplyMode::Auto`] threshold, bytes.
    mode_threshold: usize,
    /// Since when no QP of the straw was usable while work waited.
    stuck_since: Option<Instant>,
    dead: bool,
}

/// A Rocket pair accepted by the control plane on its way to its server thread, which
/// starts its channel (a started channel owns chunks of that thread's arena).
pub(crate) struct NewConn {
    id: u64,
    straw: Arc<ServerStraw>,
    caller: Caller,
    chan: ChannelSetup,
    mode_threshold: usize,
}

impl NewConn {
    pub(crate) fn new(
        id: u64,
        straw: Arc<ServerStraw>,
        caller: Caller,
        chan: ChannelSetup,
        mode_threshold: usize,
    ) -> Self {
        Self {
            id,
            straw,
            caller,
            chan,
            mode_threshold,
        }
    }

    /// The server end, run on the calling (server) thread.
    fn start(self) -> ServerConn {
        ServerConn {
            id: self.id,
            straw: self.straw,
            peer: self.caller.node,
            caller: self.caller,
            chan: self.chan.start(),
            mode_threshold: self.mode_threshold,
            stuck_since: None,
            dead: false,
        }
    }
}

/// A request whose answer is not decided in the round that received it: an async
/// handler's, a sorted batch's, or one whose payload is still being fetched.
#[derive(Clone, Debug)]
struct Pending {
    conn: u64,
    hdr: MsgHeader,
    mode: ReplyMode,
    /// The mode's prefix (zero-copy target).
    prefix: Vec<u8>,
}

/// A request's identity on a server thread: (Rocket id, call id).
type Tag = (u64, u64);
/// A later answer: the request it answers and the handler's result.
type Answer = (Tag, Result<Vec<u8>, String>);

/// A request handed to the sorted-batch hub.
pub(crate) struct SortedReq {
    worker: usize,
    key: u64,
    ts: u64,
    id: u16,
    /// The handler's sort group ([`Handlers::register_sorted_in`]).
    group: u16,
    tag: (u64, u64),
    payload: Vec<u8>,
    caller: Caller,
}

/// Requests of sorted-batch handlers from all server threads, combined by whichever
/// thread gets to them first (flat combining): a batch holds everything received since
/// the previous one, sorted by (key, timestamp), and its results go back to each
/// request's thread.
pub(crate) struct SortedHub {
    pending: Mutex<Vec<SortedReq>>,
    any: AtomicBool,
    combine: Mutex<()>,
    /// Per thread: ((conn, call), result) of its requests.
    outbox: Vec<Mutex<Vec<Answer>>>,
    mail: Vec<AtomicBool>,
}

impl SortedHub {
    pub(crate) fn new(threads: usize) -> Self {
        Self {
            pending: Mutex::new(Vec::new()),
            any: AtomicBool::new(false),
            combine: Mutex::new(()),
            outbox: (0..threads).map(|_| Mutex::new(Vec::new())).collect(),
            mail: (0..threads).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    fn submit(&self, reqs: &mut Vec<SortedReq>) {
        if reqs.is_empty() {
            return;
        }
        lock(&self.pending).append(reqs);
        self.any.store(true, Ordering::Release);
    }

    /// Run the sorted handlers over everything pending, unless another thread is at it.
    fn combine(&self, handlers: &Handlers) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let Ok(_g) = self.combine.try_lock() else {
            return;
        };
        let mut reqs = {
            let mut p = lock(&self.pending);
            self.any.store(false, Ordering::Release);
            std::mem::take(&mut *p)
        };
        // By sort group, then (key, timestamp); stable, so equal pairs keep arrival
        // order. Each run of one handler's requests is a batch.
        reqs.sort_by_key(|r| (r.group, r.key, r.ts));
        let mut results = Vec::new();
        let mut start = 0;
        while start < reqs.len() {
            let id = reqs[start].id;
            let end = start + reqs[start..].iter().take_while(|r| r.id == id).count();
            let group = &reqs[start..end];
            let batch: Vec<BatchReq<'_>> = group
                .iter()
                .map(|r| BatchReq {
                    key: r.key,
                    ts: r.ts,
                    payload: &r.payload,
                    caller: r.caller,
                })
                .collect();
            results.clear();
            let ok = match handlers.get(id) {
                Some(Entry::Sorted(_, f, _)) => {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        f(&batch, &mut results)
                    }))
                    .is_ok()
                }
                _ => false,
            };
            for (j, r) in group.iter().enumerate() {
                let res = match results.get_mut(j) {
                    Some(x) if ok => std::mem::replace(x, Ok(Vec::new())),
                    _ if !ok => Err(format!("handler {id} panicked")),
                    _ => Err(format!("sorted-batch handler {id} returned no result")),
                };
                lock(&self.outbox[r.worker]).push((r.tag, res));
                self.mail[r.worker].store(true, Ordering::Release);
            }
            start = end;
        }
    }

    fn take(&self, worker: usize, out: &mut Vec<Answer>) {
        // A load first: nearly every round finds no mail, and a swap would take the
        // line (shared with the other threads' flags) exclusive each time.
        let mail = &self.mail[worker];
        if mail.load(Ordering::Relaxed) && mail.swap(false, Ordering::Acquire) {
            out.append(&mut lock(&self.outbox[worker]));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What one posted list carried.
struct Rec {
    conn: u64,
    items: Vec<Item>,
}

/// An async handler's future, polled inside `catch_unwind`: a panic ends it with
/// `Err(())` instead of unwinding through the server thread's executor (which would end
/// the thread, and with it every connection assigned to it).
struct CatchUnwind<F> {
    fut: F,
}

impl<F: std::future::Future + Unpin> std::future::Future for CatchUnwind<F> {
    type Output = Result<F::Output, ()>;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let fut = &mut self.fut;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            std::pin::Pin::new(fut).poll(cx)
        })) {
            Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(_) => std::task::Poll::Ready(Err(())),
        }
    }
}

/// Results of async handlers, pushed by their coroutines: ((conn, call), result).
type Finished = Rc<RefCell<Vec<Answer>>>;

/// A server thread's state.
pub(crate) struct Worker {
    index: usize,
    handlers: Handlers,
    arena: Arena,
    /// Largest READ-mode or zero-copy reply, or fetched request, in bytes.
    max_reply: usize,
    read_hold: Duration,
    /// RPC+READ reply buffers by handle (their generation), with their expiry.
    holds: HashMap<u64, (Chunk, Instant), IdHash>,
    /// The earliest expiry in `holds`.
    next_expiry: Option<Instant>,
    next_handle: u64,
    mailbox: Arc<Mailbox>,
    lists: Lists<Rec>,
    straws: StrawMap,
    hub: Arc<SortedHub>,
    rx: Receiver<Cmd>,
    conns: Vec<ServerConn>,
    /// Requests answered later, by (conn, call id), and whether the caller cancelled.
    pending: HashMap<(u64, u64), (Pending, bool)>,
    /// Fetches of requests sent by reference, by tag: the call and the request's length
    /// (the READ's item owns the buffer).
    fetches: HashMap<u64, ((u64, u64), usize)>,
    next_tag: u64,
    finished: Finished,
    sorted_out: Vec<SortedReq>,
    sorted_in: Vec<Answer>,
    // Scratch.
    batch: Vec<u8>,
    out: Vec<u8>,
    done: Vec<crate::straw::ListDone>,
    wrs: Vec<SendWr>,
    items: Vec<Item>,
}

impl Worker {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        index: usize,
        handlers: Handlers,
        arena: Arena,
        max_reply: usize,
        read_hold: Duration,
        straws: StrawMap,
        hub: Arc<SortedHub>,
        rx: Receiver<Cmd>,
    ) -> Self {
        Self {
            index,
            handlers,
            arena,
            max_reply,
            read_hold,
            holds: HashMap::default(),
            next_expiry: None,
            next_handle: 1,
            mailbox: Mailbox::new(),
            lists: Lists::default(),
            straws,
            hub,
            rx,
            conns: Vec::new(),
            pending: HashMap::new(),
            fetches: HashMap::new(),
            next_tag: 1,
            finished: Rc::new(RefCell::new(Vec::new())),
            sorted_out: Vec::new(),
            sorted_in: Vec::new(),
            batch: Vec::with_capacity(4096),
            out: Vec::with_capacity(4096),
            done: Vec::new(),
            wrs: Vec::new(),
            items: Vec::new(),
        }
    }

    /// Serve until `stop`: the thread's executor runs the async handlers' coroutines,
    /// and each round this worker's I/O and `extra` (the node's runtime).
    pub(crate) fn run(
        mut self,
        handle: exec::Handle,
        mut extra: Option<Box<dyn FnMut() -> bool>>,
        idle_sleep: Duration,
        stop: &AtomicBool,
    ) {
        let mut ex = exec::Executor::new(handle.clone());
        ex.set_idle_sleep(idle_sleep);
        let mut rounds = 0u64;
        let mut idle = 0u32;
        let mut io = || {
            rounds = rounds.wrapping_add(1);
            let mut work = self.round(rounds, &handle);
            if let Some(x) = extra.as_mut() {
                work |= x();
            }
            if work {
                idle = 0;
            } else {
                idle = idle.saturating_add(1);
                if idle > IDLE_SPINS && idle.is_multiple_of(1024) {
                    // Idle: look at the QPs in use now and then, so a requester that
                    // died is noticed (the QP's state probe) and its Rockets dropped.
                    self.check_requesters();
                }
            }
            work
        };
        let mut n = 0u32;
        ex.run_until(&mut io, &mut || {
            n = n.wrapping_add(1);
            n.is_multiple_of(64) && stop.load(Ordering::Relaxed)
        });
        drop(ex);
        for c in self.conns.drain(..) {
            c.straw.rockets.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// One polling round. Returns whether anything happened.
    fn round(&mut self, rounds: u64, handle: &exec::Handle) -> bool {
        // Commands (new or closed Rockets) are rare: look every 64 rounds.
        if rounds.is_multiple_of(64) {
            while let Ok(cmd) = self.rx.try_recv() {
                match cmd {
                    Cmd::Add(c) => {
                        tracing::debug!(peer = %c.caller.node, "Rocket accepted");
                        self.conns.push(c.start());
                    }
                    Cmd::Fence(caller) => {
                        for c in self.conns.iter_mut().filter(|c| c.caller == caller) {
                            tracing::info!(peer = %c.peer, incarnation = caller.incarnation, "Rocket of a fenced caller dropped");
                            c.dead = true;
                        }
                    }
                    Cmd::Close(id) => {
                        if let Some(c) = self.conns.iter_mut().find(|c| c.id == id) {
                            tracing::debug!(peer = %c.peer, "Rocket closed by its requester");
                            c.dead = true;
                        }
                    }
                }
            }
            // Requesters that vanished without closing are noticed here too.
            if rounds.is_multiple_of(1 << 16) {
                self.check_requesters();
            }
        }
        let mut work = false;
        // Phase 1: requests.
        for ci in 0..self.conns.len() {
            if self.conns[ci].dead {
                continue;
            }
            let c = &mut self.conns[ci];
            work |= c.chan.take_credit().unwrap_or(false);
            if c.chan.backlogged() > 0 {
                c.chan.drain_backlog();
            }
            // At most one ring's worth per round, so one client cannot starve others.
            for _ in 0..c.chan.config().buckets {
                let c = &mut self.conns[ci];
                if c.chan.backlogged() > 0 {
                    break; // back-pressure: stop consuming until responses fit
                }
                self.batch.clear();
                match c.chan.poll(&mut self.batch) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        tracing::warn!(peer = %c.peer, error = %e, "corrupt request ring; dropping Rocket");
                        c.dead = true;
                        break;
                    }
                }
                work = true;
                let batch = std::mem::take(&mut self.batch);
                for m in decode_batch(&batch) {
                    let Ok((hdr, payload)) = m else {
                        tracing::warn!(peer = %self.conns[ci].peer, "corrupt request batch");
                        self.conns[ci].dead = true;
                        break;
                    };
                    self.on_message(ci, hdr, payload, handle);
                }
                self.batch = batch;
                // With message batching, post a reply bucket as soon as it is full rather
                // than at the round's end: the requester starts on these replies while
                // this thread works through the rest of the ring, so the two pipeline
                // instead of trading a ring's worth back and forth (small-RPC throughput
                // on two cores +20% over round-end posting). Only full buckets go early:
                // posting after every request bucket, as this did before, is a doorbell
                // per reply once requests exceed half a bucket (one per bucket), which
                // made combined batching slower than doorbell-only from 256 B requests
                // up (rrpc-bench batching). Without msg batching a bucket is one message,
                // and doorbell batching means one list for the round.
                let c = &mut self.conns[ci];
                if !c.dead && c.chan.batching().msg() && c.chan.has_full_bucket() {
                    self.flush_with(ci, false);
                }
            }
        }
        // Answers that came in from coroutines and the sorted hub.
        let fin = std::mem::take(&mut *self.finished.borrow_mut());
        for (tag, res) in fin {
            work = true;
            self.answer(tag, res);
        }
        // Phase 2: sorted batches (Scythe 4.4, Fig. 16), across the server's threads.
        self.hub.submit(&mut self.sorted_out);
        self.hub.combine(&self.handlers);
        let mut sorted = std::mem::take(&mut self.sorted_in);
        self.hub.take(self.index, &mut sorted);
        for (tag, res) in sorted.drain(..) {
            work = true;
            self.answer(tag, res);
        }
        self.sorted_in = sorted;
        // READ-mode buffers past their hold, on the round's clock.
        if self.next_expiry.is_some_and(|t| t <= handle.now()) {
            let now = handle.now();
            let mr = self.arena.mr();
            let mut next = None::<Instant>;
            self.holds.retain(|_, (chunk, until)| {
                if *until <= now {
                    clear_read_generation(mr, chunk);
                    false
                } else {
                    next = Some(next.map_or(*until, |n| n.min(*until)));
                    true
                }
            });
            self.next_expiry = next;
        }
        // Phase 3: flush.
        for ci in 0..self.conns.len() {
            if self.conns[ci].dead || !self.conns[ci].chan.has_work() {
                continue;
            }
            work = true;
            self.flush(ci);
        }
        // Completions: this thread's own polls deliver them directly, in each QP's
        // order; the mailbox holds those other threads' polls completed.
        self.done.clear();
        for c in &self.conns {
            if let Some(q) = &c.chan.qp {
                if c.chan.lists > 0 {
                    q.poll_into(&self.mailbox, &mut self.done);
                }
            }
        }
        self.mailbox.drain(&mut self.done);
        for k in 0..self.done.len() {
            work = true;
            let crate::straw::ListDone { token, status, .. } = self.done[k];
            let Some(mut rec) = self.lists.take(token) else {
                continue;
            };
            let Some(ci) = self.conns.iter().position(|c| c.id == rec.conn) else {
                // The Rocket is gone: only the buffers are left to free (as the items
                // drop).
                for it in rec.items.drain(..) {
                    if let Item::Read(r) = it {
                        self.drop_fetch(r.tag);
                    }
                }
                self.lists.pool.push(rec.items);
                continue;
            };
            self.conns[ci].chan.lists -= 1;
            // (A freed replay slot lets the backlog drain, which it tries every round.)
            self.conns[ci].chan.list_done(&rec.items);
            if status == WcStatus::Success {
                // Data WRITEs landed: their buffers go back as the items drop.
                for it in rec.items.drain(..) {
                    if let Item::Read(r) = it {
                        self.fetched(r, handle);
                    }
                }
            } else {
                // Replay, oldest first, ahead of anything newer.
                self.conns[ci].chan.failed(rec.items.drain(..));
            }
            self.lists.pool.push(rec.items);
        }
        self.reap();
        work
    }

    /// Handle one message from Rocket `ci`.
    fn on_message(&mut self, ci: usize, hdr: MsgHeader, payload: &[u8], handle: &exec::Handle) {
        let conn = self.conns[ci].id;
        match MsgKind::from_u8(hdr.kind) {
            Some(MsgKind::Release) => {
                if let Some(h) = payload.get(..8) {
                    let h = u64::from_le_bytes(h.try_into().expect("8 bytes"));
                    if let Some((chunk, _)) = self.holds.remove(&h) {
                        clear_read_generation(self.arena.mr(), &chunk);
                    }
                }
            }
            Some(MsgKind::Cancel) => {
                // Only a call not answered yet can be cancelled; an answer already on
                // its way tells the caller as much.
                if let Some((_, cancelled)) = self.pending.get_mut(&(conn, hdr.call_id)) {
                    *cancelled = true;
                }
            }
            Some(MsgKind::Request) => {
                let r = match parse_request(hdr.flags, payload) {
                    Ok(r) => r,
                    Err(e) => {
                        let msg = e.to_string();
                        self.push_msg(ci, reply_hdr(&hdr, MsgKind::Error), msg.as_bytes());
                        return;
                    }
                };
                let p = Pending {
                    conn,
                    hdr,
                    mode: r.mode,
                    prefix: r.prefix.to_vec(),
                };
                match r.fetch {
                    Some(f) => self.start_fetch(ci, p, f),
                    None => self.dispatch(ci, p, r.body, handle),
                }
            }
            _ => tracing::debug!(
                peer = %self.conns[ci].peer,
                kind = hdr.kind,
                "unexpected message"
            ),
        }
    }

    /// Run the handler of request `p` with payload `body`, or queue it for later.
    fn dispatch(&mut self, ci: usize, p: Pending, body: &[u8], handle: &exec::Handle) {
        let tag = (p.conn, p.hdr.call_id);
        let entry = self.handlers.get(p.hdr.handler);
        match entry {
            Some(e @ (Entry::Async(_) | Entry::AsyncCaller(_))) => {
                let id = p.hdr.handler;
                let caller = self.conns[ci].caller;
                let finished = self.finished.clone();
                self.pending.insert(tag, (p, false));
                // Both the call that makes the future and each poll of it may panic: the
                // request fails, the thread keeps serving.
                let fut = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match e {
                    Entry::AsyncCaller(f) => f(caller, body.to_vec()),
                    Entry::Async(f) => f(body.to_vec()),
                    _ => unreachable!("matched above"),
                }));
                handle.spawn(async move {
                    let r = match fut {
                        Ok(fut) => CatchUnwind { fut }.await.unwrap_or_else(|()| {
                            tracing::error!(handler = id, "async RPC handler panicked");
                            Err(format!("handler {id} panicked"))
                        }),
                        Err(_) => {
                            tracing::error!(handler = id, "async RPC handler panicked");
                            Err(format!("handler {id} panicked"))
                        }
                    };
                    finished.borrow_mut().push((tag, r));
                });
            }
            Some(Entry::Sorted(key, _, group)) => {
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| key(body)))
                    .ok()
                    .flatten()
                {
                    Some((k, ts)) => {
                        self.sorted_out.push(SortedReq {
                            worker: self.index,
                            key: k,
                            ts,
                            id: p.hdr.handler,
                            group: *group,
                            tag,
                            payload: body.to_vec(),
                            caller: self.conns[ci].caller,
                        });
                        self.pending.insert(tag, (p, false));
                    }
                    None => {
                        let msg = b"malformed request for a sorted-batch handler";
                        self.push_msg(ci, reply_hdr(&p.hdr, MsgKind::Error), msg);
                    }
                }
            }
            _ => {
                let mut out = std::mem::take(&mut self.out);
                let caller = self.conns[ci].caller;
                let kind = Handlers::run(entry, caller, p.hdr.handler, body, &mut out);
                self.respond(ci, &p, kind, &out);
                self.out = out;
            }
        }
    }

    /// A later answer to request `tag` came (async handler, sorted batch).
    fn answer(&mut self, tag: (u64, u64), res: Result<Vec<u8>, String>) {
        let Some((p, cancelled)) = self.pending.remove(&tag) else {
            return;
        };
        let Some(ci) = self.conns.iter().position(|c| c.id == tag.0 && !c.dead) else {
            return; // the requester left
        };
        if cancelled {
            self.push_msg(ci, reply_hdr(&p.hdr, MsgKind::Cancelled), &[]);
            return;
        }
        match res {
            Ok(v) => self.respond(ci, &p, MsgKind::Response, &v),
            Err(e) => self.respond(ci, &p, MsgKind::Error, e.as_bytes()),
        }
    }

    /// READ a request sent by reference into the arena, then dispatch it.
    fn start_fetch(&mut self, ci: usize, p: Pending, f: FetchPrefix) {
        let len = f.len as usize;
        let chunk = (len <= self.max_reply)
            .then(|| self.arena.alloc(len.max(1)))
            .flatten();
        let Some(chunk) = chunk else {
            let msg = buffer_error(len, self.max_reply, &self.arena);
            self.push_msg(ci, reply_hdr(&p.hdr, MsgKind::Error), msg.as_bytes());
            return;
        };
        let tag = self.next_tag;
        self.next_tag += 1;
        let key = (p.conn, p.hdr.call_id);
        self.fetches.insert(tag, (key, len));
        self.pending.insert(key, (p, false));
        self.conns[ci].chan.push_read(ReadFetch {
            chunk,
            len,
            remote: RemoteAddr {
                addr: f.addr,
                rkey: f.rkey,
            },
            tag,
        });
    }

    /// The READ `r` completed: run its request (its buffer is free once copied out).
    fn fetched(&mut self, r: ReadFetch, handle: &exec::Handle) {
        let Some((key, len)) = self.fetches.remove(&r.tag) else {
            return;
        };
        let mut body = vec![0u8; len];
        self.arena.mr().read(r.chunk.off(), &mut body);
        drop(r);
        let Some((p, cancelled)) = self.pending.remove(&key) else {
            return;
        };
        let Some(ci) = self.conns.iter().position(|c| c.id == key.0 && !c.dead) else {
            return;
        };
        if cancelled {
            self.push_msg(ci, reply_hdr(&p.hdr, MsgKind::Cancelled), &[]);
            return;
        }
        self.dispatch(ci, p, &body, handle);
    }

    fn drop_fetch(&mut self, tag: u64) {
        if let Some((key, _)) = self.fetches.remove(&tag) {
            self.pending.remove(&key);
        }
    }

    /// Queue a response message; a full ring defers it to the backlog (nothing is
    /// lost). A message too large for a bucket is cut (only error texts can be).
    fn push_msg(&mut self, ci: usize, hdr: MsgHeader, payload: &[u8]) {
        let c = &mut self.conns[ci];
        let max = c.chan.max_payload();
        let payload = &payload[..payload.len().min(max)];
        if let Err(e) = c.chan.push_or_queue(hdr, payload) {
            tracing::warn!(peer = %c.peer, error = %e, "response dropped");
        }
    }

    /// Send a handler's result in the mode the request asked for.
    fn respond(&mut self, ci: usize, p: &Pending, kind: MsgKind, out: &[u8]) {
        if kind == MsgKind::Error {
            return self.push_msg(ci, reply_hdr(&p.hdr, MsgKind::Error), out);
        }
        let c = &self.conns[ci];
        let r = route(
            p.mode,
            &p.prefix,
            out.len(),
            c.chan.max_payload(),
            c.mode_threshold,
        );
        match r {
            Err(e) => self.push_msg(
                ci,
                reply_hdr(&p.hdr, MsgKind::Error),
                e.to_string().as_bytes(),
            ),
            Ok(Route::Inline) => self.push_msg(ci, reply_hdr(&p.hdr, MsgKind::Response), out),
            Ok(Route::ZeroCopy(z)) => self.zero_copy(ci, p, z, out),
            Ok(Route::Read) => {
                // [handle | reply | handle]: the handle is the buffer's generation.
                let chunk = (out.len() <= self.max_reply)
                    .then(|| self.arena.alloc(out.len() + 16))
                    .flatten();
                let Some(chunk) = chunk else {
                    let msg = buffer_error(out.len(), self.max_reply, &self.arena);
                    return self.push_msg(ci, reply_hdr(&p.hdr, MsgKind::Error), msg.as_bytes());
                };
                let handle = self.next_handle;
                self.next_handle += 1;
                let mr = self.arena.mr();
                mr.write(chunk.off() + 8, out);
                mr.write(chunk.off() + 8 + out.len(), &handle.to_le_bytes());
                mr.write(chunk.off(), &handle.to_le_bytes());
                let until = Instant::now() + self.read_hold;
                let r = ReadReply {
                    addr: mr.addr() + chunk.off() as u64,
                    rkey: mr.rkey(),
                    len: out.len() as u32,
                    handle,
                };
                self.holds.insert(handle, (chunk, until));
                self.next_expiry = Some(self.next_expiry.map_or(until, |n| n.min(until)));
                self.push_msg(ci, reply_hdr(&p.hdr, MsgKind::ReadReply), &r.to_bytes());
            }
        }
    }

    /// WRITE the reply and its generation (the call id) into the caller's buffer; the
    /// Done message follows in the same ordered list.
    fn zero_copy(&mut self, ci: usize, p: &Pending, z: ZeroCopyPrefix, out: &[u8]) {
        let chunk = (out.len() <= self.max_reply)
            .then(|| self.arena.alloc(out.len() + 8))
            .flatten();
        let Some(chunk) = chunk else {
            let msg = buffer_error(out.len(), self.max_reply, &self.arena);
            return self.push_msg(ci, reply_hdr(&p.hdr, MsgKind::Error), msg.as_bytes());
        };
        let mr = self.arena.mr();
        mr.write(chunk.off(), out);
        mr.write(chunk.off() + out.len(), &p.hdr.call_id.to_le_bytes());
        let mut done_payload = [0u8; 16];
        done_payload[..8].copy_from_slice(&(out.len() as u64).to_le_bytes());
        self.conns[ci].chan.push_data(DataWrite {
            chunk,
            len: out.len() + 8,
            remote: RemoteAddr {
                addr: z.addr,
                rkey: z.rkey,
            },
            done: reply_hdr(&p.hdr, MsgKind::ZeroCopyDone),
            done_payload,
            done_seq: None,
        });
    }

    /// Post Rocket `ci`'s fetch READs, zero-copy WRITEs, response buckets and credit on
    /// its QP.
    fn flush(&mut self, ci: usize) {
        self.flush_with(ci, true);
    }

    /// [`Worker::flush`]; with `seal_open` false only full buckets go (see
    /// [`Channel::plan_full`]).
    fn flush_with(&mut self, ci: usize, seal_open: bool) {
        let c = &mut self.conns[ci];
        let straw = &c.straw;
        let Some((qp, _)) = c.chan.take_qp(|cur| straw.pick(cur)) else {
            if c.chan.lists == 0 {
                c.stuck_since.get_or_insert_with(Instant::now);
            }
            return;
        };
        c.stuck_since = None;
        self.items.clear();
        if seal_open {
            c.chan.plan(&mut self.items);
        } else {
            c.chan.plan_full(&mut self.items);
        }
        if self.items.is_empty() {
            c.chan.qp = Some(qp);
            return;
        }
        let per_list = if c.chan.batching().doorbell() {
            usize::MAX
        } else {
            1
        };
        let conn = c.id;
        post_items(
            &mut c.chan,
            &qp,
            &mut self.items,
            Some(self.arena.mr()),
            per_list,
            &self.mailbox,
            &mut self.lists,
            &mut self.wrs,
            |items| Rec { conn, items },
        );
        c.chan.qp = Some(qp);
    }

    /// Look at the QPs of the requesters' straws (their state probe notices a requester
    /// that died) and start the clock on Rockets left with no usable QP.
    fn check_requesters(&mut self) {
        for c in self.conns.iter_mut() {
            let qps = c
                .straw
                .qps
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            for q in &qps {
                q.poll();
            }
            if qps.iter().any(|q| q.usable()) {
                c.stuck_since = None;
            } else {
                c.stuck_since.get_or_insert_with(Instant::now);
            }
        }
    }

    /// Drop Rockets that are closed or whose requester is gone, once no NIC may still
    /// read their rings.
    fn reap(&mut self) {
        for c in self.conns.iter_mut() {
            if !c.dead && c.stuck_since.is_some_and(|t| t.elapsed() >= STUCK_LIMIT) {
                tracing::debug!(
                    peer = %c.peer,
                    "no usable QP to the requester; dropping Rocket"
                );
                c.dead = true;
            }
        }
        if !self.conns.iter().any(|c| c.dead) {
            return;
        }
        let gone: Vec<u64> = self
            .conns
            .iter()
            .filter(|c| c.dead)
            .map(|c| c.straw.id)
            .collect();
        let mut fetches = Vec::new();
        self.conns.retain_mut(|c| {
            if !c.dead {
                return true;
            }
            // A dead Rocket's rings stay registered until its lists on the shared QP
            // have completed (or failed): a NIC may still be reading them.
            if c.chan.lists > 0 && c.chan.qp.as_ref().is_some_and(|q| !q.is_broken()) {
                return true;
            }
            if let Some(q) = c.chan.qp.take() {
                crate::straw::unbind(&q);
            }
            let mut items = Vec::new();
            c.chan.plan(&mut items);
            // What was never posted: reply data (its buffers go back as the items drop)
            // and fetches of requests.
            for it in items {
                if let Item::Read(r) = it {
                    fetches.push(r.tag);
                }
            }
            c.straw
                .rockets
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            false
        });
        for tag in fetches {
            self.drop_fetch(tag);
        }
        let live: Vec<u64> = self.conns.iter().map(|c| c.id).collect();
        self.pending.retain(|(conn, _), _| live.contains(conn));
        if let Ok(mut m) = self.straws.lock() {
            for s in gone {
                let dead = m.get(&s).is_some_and(|st| {
                    st.qps
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter()
                        .all(|q| q.is_broken())
                });
                if dead && !self.conns.iter().any(|c| c.straw.id == s) {
                    m.remove(&s);
                }
            }
        }
    }
}

/// Clear an expired or released READ-mode buffer's generation word (`mr` is its arena's)
/// before it is dropped and can be reused, so a late READ of it fails its call instead
/// of returning other data.
fn clear_read_generation(mr: &MemoryRegion, chunk: &Chunk) {
    mr.store_u64(chunk.off(), 0);
}

fn reply_hdr(req: &MsgHeader, kind: MsgKind) -> MsgHeader {
    MsgHeader {
        len: 0,
        handler: req.handler,
        kind: kind as u8,
        flags: 0,
        call_id: req.call_id,
    }
}

fn buffer_error(len: usize, max: usize, arena: &Arena) -> String {
    if len > max {
        format!("reply of {len} bytes exceeds the server's {max}-byte limit for READ and zero-copy replies")
    } else {
        format!(
            "server reply buffers exhausted ({} held); retry later",
            arena.in_use()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Requests of two sorted handlers in one group go out in one (key, timestamp)
    /// order, each run of one handler's requests as its batch; a handler in a group
    /// of its own keeps its batch whole.
    #[test]
    fn handlers_of_one_sort_group_are_served_in_one_timestamp_order() {
        type Log = Arc<Mutex<Vec<(u16, Vec<u64>)>>>;
        let log: Log = Arc::default();
        let mut h = Handlers::new();
        let key = |p: &[u8]| Some((0, u64::from_le_bytes(p.try_into().ok()?)));
        for (id, group) in [(1u16, 1u16), (4, 1), (7, 7)] {
            let log = log.clone();
            h.register_sorted_in(id, group, key, move |batch, results| {
                log.lock()
                    .unwrap()
                    .push((id, batch.iter().map(|r| r.ts).collect()));
                results.extend(batch.iter().map(|_| Ok(Vec::new())));
            });
        }
        let hub = SortedHub::new(1);
        let mut reqs: Vec<SortedReq> = [(1u16, 30u64), (4, 10), (7, 5), (1, 20), (4, 40), (7, 1)]
            .into_iter()
            .enumerate()
            .map(|(i, (id, ts))| SortedReq {
                worker: 0,
                key: 0,
                ts,
                id,
                group: if id == 7 { 7 } else { 1 },
                tag: (0, i as u64),
                payload: ts.to_le_bytes().to_vec(),
                caller: Caller::UNKNOWN,
            })
            .collect();
        hub.submit(&mut reqs);
        hub.combine(&h);
        assert_eq!(
            *log.lock().unwrap(),
            [
                (4, vec![10]),
                (1, vec![20, 30]),
                (4, vec![40]),
                (7, vec![1, 5]),
            ]
        );
        let mut answers = Vec::new();
        hub.take(0, &mut answers);
        assert_eq!(answers.len(), 6, "every request answered");
        assert!(answers.iter().all(|(_, r)| r.is_ok()));
    }
}
