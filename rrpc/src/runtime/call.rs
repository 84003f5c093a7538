//! One RPC call on the caller's side (Scythe's RRPC, 4.6), as
//! its steps:
//!
//! 1. `CallPlan::new`: the reply mode by size and the size limits; no I/O.
//! 2. `ThreadCtx::send_request`, polling `Sending`: wait for the call's turn at the
//!    request ring's credit (`TicketQueue`), take the buffers the server will touch
//!    (`CallBufs`), encode the prefixes and header (`RequestPrefix`), push the request
//!    and open the call in the call table. Each wait ends at the call's deadline
//!    (`CallDeadline`); a ring that refuses for good is `push_error`.
//! 3. `CallWait`: wait for the reply. Dropped first, it abandons the call: a buffer the
//!    server may still touch is kept as a zombie and the call is cancelled at the server.
//! 4. `decode_reply` (run by the polling round on each response message) and
//!    `ThreadCtx::finish_call`: check a zero-copy reply's length and generation
//!    (`zero_copy_fits`, `zero_copy_payload`) or READ a READ-mode reply and check its
//!    generation words (`read_reply_payload`), then hand out the payload.
//!
//! A call that goes out at once reads no clock and makes no timer: its deadline is set
//! by the next expiry scan (see `CallTable::open`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::calls::{Held, Reply};
use super::{CallError, CallOpts, Inner, RegBuf, ReplyMode, RuntimeConfig, ThreadCtx};
use crate::arena::Chunk;
use crate::exec;
use crate::fabric::{MemoryRegion, RemoteAddr, WrOpcode};
use crate::rocket::{MsgHeader, RocketError};
use crate::wire::{FetchPrefix, MsgKind, ReadReply, ZeroCopyPrefix};
use crate::NodeId;

impl ThreadCtx {
    /// Call handler `handler` on `node` with `req` in [`ReplyMode::Auto`] with the
    /// default deadline; resolves to the reply payload. See [`ThreadCtx::call_with`].
    pub async fn call(&self, node: NodeId, handler: u16, req: &[u8]) -> Result<Vec<u8>, CallError> {
        self.call_with(node, handler, req, CallOpts::default())
            .await
    }

    /// Call handler `handler` on `node` with `req`; the reply travels as `opts.mode`
    /// says. A request that fits a bucket with its mode's prefix (`bucket_size - 32`
    /// bytes) rides in the request Rocket; a larger one (up to
    /// [`RuntimeConfig::max_transfer`]) is sent by reference and READ by the server.
    ///
    /// Errors: [`CallError::TooLarge`] for a request or zero-copy buffer above
    /// `max_transfer`; [`CallError::Timeout`] after the deadline;
    /// [`CallError::PeerGone`]; [`CallError::Remote`] when the handler failed or its
    /// reply is too large for the mode (never truncated); [`CallError::Fetch`] when the
    /// READ of a READ-mode reply failed; [`CallError::Expired`] when that buffer was
    /// expired or reused first.
    pub async fn call_with(
        &self,
        node: NodeId,
        handler: u16,
        req: &[u8],
        opts: CallOpts,
    ) -> Result<Vec<u8>, CallError> {
        let plan = CallPlan::new(&opts, &self.cfg, req.len())?;
        self.revive(node);
        let id = self
            .send_request(node, handler, req, plan)
            .await
            .map_err(|e| *e)?;
        let (reply, held) = CallWait {
            ctx: self,
            id,
            node,
            done: false,
        }
        .await;
        // An inline reply (every small call) is done: its buffers go back as `held`
        // drops, with no `finish_call` state to build and move.
        match reply {
            Reply::Inline(r) => {
                drop(held);
                return Ok(r);
            }
            Reply::Failed(e) => {
                drop(held);
                return Err(*e);
            }
            _ => {}
        }
        self.finish_call(node, handler, id, reply, held).await
    }

    /// Call handler `handler` on `node` with `req` and get the reply in a registered
    /// buffer ([`RegBuf`]) rather than a `Vec`: the call runs in
    /// [`ReplyMode::ZeroCopy`] with room for `reply_len` bytes, so the server WRITEs the
    /// reply straight into the buffer returned (checked by its generation word in place,
    /// never copied); a reply the server sent another way (inline) is copied into a
    /// fresh buffer. Errors: those of [`ThreadCtx::call_with`], and
    /// [`CallError::NoBuffer`] when that fresh buffer cannot be had.
    pub async fn call_into(
        &self,
        node: NodeId,
        handler: u16,
        req: &[u8],
        reply_len: usize,
    ) -> Result<RegBuf, CallError> {
        let opts = CallOpts {
            mode: ReplyMode::ZeroCopy,
            reply_len: Some(reply_len),
            ..CallOpts::default()
        };
        let plan = CallPlan::new(&opts, &self.cfg, req.len())?;
        self.revive(node);
        let id = self
            .send_request(node, handler, req, plan)
            .await
            .map_err(|e| *e)?;
        let (reply, held) = CallWait {
            ctx: self,
            id,
            node,
            done: false,
        }
        .await;
        let Held { zc, req } = held;
        drop(req);
        match (reply, zc) {
            (Reply::ZeroCopy(len), Some(c)) => self.zero_copy_in_place(node, handler, id, len, c),
            (reply, zc) => {
                drop(zc);
                let v = self
                    .finish_call(node, handler, id, reply, Held::default())
                    .await?;
                let mut buf = self
                    .alloc_buf(v.len())
                    .map_err(|_| CallError::NoBuffer { len: v.len() })?;
                buf.write(0, &v);
                Ok(buf)
            }
        }
    }

    /// The zero-copy reply of `len` bytes in target `c`, as a [`RegBuf`] over it, once
    /// its generation word (just past the reply) is the call's `id`. Errors as
    /// [`ThreadCtx::take_zero_copy`].
    fn zero_copy_in_place(
        &self,
        node: NodeId,
        handler: u16,
        id: u64,
        len: usize,
        c: Chunk,
    ) -> Result<RegBuf, CallError> {
        if !zero_copy_fits(len, c.bytes()) {
            return Err(CallError::Protocol {
                node,
                what: "zero-copy reply overruns the buffer",
            });
        }
        let mut inner = self.inner.borrow_mut();
        let mut gen = [0u8; 8];
        inner.arena.mr().read(c.off() + len, &mut gen);
        if u64::from_le_bytes(gen) != id {
            inner.stats.expired_replies += 1;
            return Err(CallError::Expired { node, handler });
        }
        Ok(RegBuf::from_chunk(c, len, inner.arena.mr_shared()))
    }

    /// Push the request of a call planned as `plan` once the ring has credit for it and
    /// the arena has its buffers, and open the call; resolves to its id. Errors:
    /// [`CallError::NotConnected`], [`CallError::PeerGone`], [`CallError::Timeout`]
    /// (no credit or buffers before the deadline), and those of [`push_error`]; boxed,
    /// so that the result of every call's send fits two registers (a 48-byte result
    /// written and read back through the stack cost a store-forwarding stall per call).
    fn send_request<'a>(
        &'a self,
        node: NodeId,
        handler: u16,
        req: &'a [u8],
        plan: CallPlan,
    ) -> Sending<'a> {
        // A plain fn returning the future, not an `async fn`: the state is built once in
        // place, not stored as arguments and copied into a local (a stall per call).
        Sending {
            ctx: self,
            node,
            handler,
            req,
            plan,
            ticket: None,
            deadline: CallDeadline::new(plan.after),
            bufs: CallBufs::default(),
            stalled: false,
        }
    }

    /// Turn a call's reply into its payload: copy a zero-copy reply out of the call's
    /// buffer (checking its generation), or READ a READ-mode reply (checking the
    /// server buffer's generation) and release it.
    async fn finish_call(
        &self,
        node: NodeId,
        handler: u16,
        id: u64,
        reply: Reply,
        held: Held,
    ) -> Result<Vec<u8>, CallError> {
        // The server is done with the request buffer; a zero-copy target not written
        // through (an error reply) is free too.
        let Held { zc, req } = held;
        drop(req);
        let zc = if matches!(reply, Reply::ZeroCopy(_)) {
            zc
        } else {
            drop(zc);
            None
        };
        match reply {
            Reply::Inline(r) => Ok(r),
            Reply::Failed(e) => Err(*e),
            Reply::ZeroCopy(len) => self.take_zero_copy(node, handler, id, len, zc),
            Reply::Read(r) => self.fetch_read_reply(node, handler, r).await,
        }
    }

    /// The zero-copy reply of `len` bytes in the call's target `zc`. Errors:
    /// [`CallError::Protocol`] without a target or for a length that overruns it;
    /// [`CallError::Expired`] when the target's generation is not the call's id.
    fn take_zero_copy(
        &self,
        node: NodeId,
        handler: u16,
        id: u64,
        len: usize,
        zc: Option<Chunk>,
    ) -> Result<Vec<u8>, CallError> {
        let Some(c) = zc else {
            return Err(CallError::Protocol {
                node,
                what: "zero-copy reply to a call without a buffer",
            });
        };
        if !zero_copy_fits(len, c.bytes()) {
            return Err(CallError::Protocol {
                node,
                what: "zero-copy reply overruns the buffer",
            });
        }
        let mut inner = self.inner.borrow_mut();
        let mut out = vec![0u8; len + 8];
        inner.arena.mr().read(c.off(), &mut out);
        zero_copy_payload(out, len, id).ok_or_else(|| {
            inner.stats.expired_replies += 1;
            CallError::Expired { node, handler }
        })
    }

    /// READ the reply `r` describes from the server's buffer, release the buffer, and
    /// check its generation words. Errors: [`CallError::TooLarge`] past
    /// [`RuntimeConfig::max_transfer`]; [`CallError::Fetch`]; [`CallError::Expired`].
    async fn fetch_read_reply(
        &self,
        node: NodeId,
        handler: u16,
        r: ReadReply,
    ) -> Result<Vec<u8>, CallError> {
        let remote = RemoteAddr {
            addr: r.addr,
            rkey: r.rkey,
        };
        let max = self.cfg.max_transfer;
        let len = r.len as usize;
        if len > max {
            self.queue_control(node, MsgKind::Release, r.handle);
            return Err(CallError::TooLarge { len, max });
        }
        let data = self
            .one_sided_up_to(node, WrOpcode::Read, remote, len + 16, None, max + 16)
            .await;
        self.queue_control(node, MsgKind::Release, r.handle);
        let data = data.map_err(CallError::Fetch)?;
        read_reply_payload(data, len, r.handle).ok_or_else(|| {
            self.inner.borrow_mut().stats.expired_replies += 1;
            CallError::Expired { node, handler }
        })
    }
}

/// What a call sends and how its reply travels, decided before any I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CallPlan {
    /// The mode the request names ([`ReplyMode::Auto`]: the server picks by size).
    pub mode: ReplyMode,
    /// Capacity of the zero-copy target, bytes (0 unless `mode` is zero-copy).
    pub zc_len: usize,
    /// The call's timeout.
    pub after: Duration,
}

impl CallPlan {
    /// The plan of a call with `opts` and a request of `req_len` bytes: an explicit
    /// zero-copy call gets a target of `opts.reply_len` (default `max_transfer`); an
    /// `Auto` call whose expected reply exceeds `mode_threshold` becomes zero-copy.
    /// Errors: [`CallError::TooLarge`] for a target, then a request, above
    /// `max_transfer`.
    pub(super) fn new(
        opts: &CallOpts,
        cfg: &RuntimeConfig,
        req_len: usize,
    ) -> Result<Self, CallError> {
        let max = cfg.max_transfer;
        let (mode, zc_len) = match opts.mode {
            ReplyMode::ZeroCopy => (ReplyMode::ZeroCopy, opts.reply_len.unwrap_or(max)),
            ReplyMode::Auto => match opts.reply_len {
                Some(n) if n > cfg.mode_threshold => (ReplyMode::ZeroCopy, n),
                _ => (ReplyMode::Auto, 0),
            },
            m => (m, 0),
        };
        if zc_len > max {
            return Err(CallError::TooLarge { len: zc_len, max });
        }
        if req_len > max {
            return Err(CallError::TooLarge { len: req_len, max });
        }
        Ok(Self {
            mode,
            zc_len,
            after: opts.timeout.unwrap_or(cfg.call_timeout),
        })
    }

    /// Bytes of the zero-copy target (the reply plus its 8-byte generation trailer), if
    /// the call has one.
    pub(super) fn zero_copy_target_bytes(&self) -> Option<usize> {
        (self.mode == ReplyMode::ZeroCopy).then_some(self.zc_len + 8)
    }
}

/// Whether a request of `req_len` bytes goes by reference (the server READs it from the
/// caller's buffer): when it and its mode's prefix exceed `inline_max`, a bucket's
/// payload.
pub(super) fn sent_by_reference(req_len: usize, mode: ReplyMode, inline_max: usize) -> bool {
    req_len + mode.prefix_bytes() > inline_max
}

/// The buffers of a call the server may touch: the zero-copy target and the buffer of a
/// request sent by reference. Taken one by one as the arena has room and kept across
/// waits; dropped (freed) if the call fails before its request goes out.
#[derive(Debug, Default)]
pub(super) struct CallBufs {
    zc: Option<Chunk>,
    req: Option<Chunk>,
}

impl CallBufs {
    /// Take from `alloc` what is missing of `need` (bytes of the zero-copy target, of the
    /// request buffer; `None`: not needed). True once every needed buffer is held.
    pub(super) fn fill(
        &mut self,
        need: [Option<usize>; 2],
        mut alloc: impl FnMut(usize) -> Option<Chunk>,
    ) -> bool {
        let [zc, req] = need;
        // One by one, not by iterating over arrays of both: most calls need neither, and
        // an array built and read back costs a store-forwarding stall per call.
        Self::fill_one(&mut self.zc, zc, &mut alloc)
            && Self::fill_one(&mut self.req, req, &mut alloc)
    }

    /// Fill `slot` with `alloc(need)` if it is empty and `need` is some; true unless
    /// the allocation failed.
    fn fill_one(
        slot: &mut Option<Chunk>,
        need: Option<usize>,
        alloc: &mut impl FnMut(usize) -> Option<Chunk>,
    ) -> bool {
        match (&slot, need) {
            (None, Some(n)) => match alloc(n.max(1)) {
                Some(c) => {
                    *slot = Some(c);
                    true
                }
                None => false,
            },
            _ => true,
        }
    }

    /// True when no buffer is held (nor needed: checked after [`CallBufs::fill`]).
    pub(super) fn is_empty(&self) -> bool {
        self.zc.is_none() && self.req.is_none()
    }

    /// The buffers, handed to the call table with the opened call.
    pub(super) fn into_held(self) -> Held {
        Held {
            zc: self.zc,
            req: self.req,
        }
    }
}

/// The prefixes a request carries before its body, in order: the zero-copy target, then
/// where the server READs a request sent by reference; and the header flags that say so.
pub(super) struct RequestPrefix {
    bytes: [u8; ZeroCopyPrefix::BYTES + FetchPrefix::BYTES],
    len: usize,
    flags: u8,
}

impl RequestPrefix {
    /// The prefix of a request in `mode` with zero-copy target `zc` and, for a request
    /// sent by reference, `fetch`.
    pub(super) fn new(
        mode: ReplyMode,
        zc: Option<ZeroCopyPrefix>,
        fetch: Option<FetchPrefix>,
    ) -> Self {
        let mut p = Self {
            bytes: [0; ZeroCopyPrefix::BYTES + FetchPrefix::BYTES],
            len: 0,
            flags: mode as u8,
        };
        if let Some(z) = zc {
            p.bytes[..ZeroCopyPrefix::BYTES].copy_from_slice(&z.to_bytes());
            p.len = ZeroCopyPrefix::BYTES;
        }
        if let Some(f) = fetch {
            p.bytes[p.len..p.len + FetchPrefix::BYTES].copy_from_slice(&f.to_bytes());
            p.len += FetchPrefix::BYTES;
            p.flags |= FetchPrefix::FLAG;
        }
        p
    }

    /// The prefix bytes.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// The header of a request in `mode` with no prefix (no zero-copy target, not sent
    /// by reference): what [`RequestPrefix::header`] gives for `new(mode, None, None)`.
    pub(super) fn bare_header(mode: ReplyMode, handler: u16, call_id: u64) -> MsgHeader {
        MsgHeader {
            len: 0,
            handler,
            kind: MsgKind::Request as u8,
            flags: mode as u8,
            call_id,
        }
    }

    /// The request's header (its length is filled in by the ring).
    pub(super) fn header(&self, handler: u16, call_id: u64) -> MsgHeader {
        MsgHeader {
            len: 0,
            handler,
            kind: MsgKind::Request as u8,
            flags: self.flags,
            call_id,
        }
    }
}

/// The error of a request the ring refused for good: a full ring (the caller pushes it
/// only once the deadline passed) is [`CallError::Timeout`], a request too large for a
/// bucket [`CallError::TooLarge`], anything else [`CallError::Protocol`].
pub(super) fn push_error(e: RocketError, node: NodeId, handler: u16, after: Duration) -> CallError {
    match e {
        RocketError::RingFull => CallError::Timeout {
            node,
            handler,
            after,
        },
        RocketError::TooLarge { len, max } => CallError::TooLarge { len, max },
        _ => CallError::Protocol {
            node,
            what: "request ring refused the message",
        },
    }
}

/// A call's deadline while it waits to go out (for credit or buffers). The timer is
/// made, and the clock read, only by a call that has to wait: a call that goes out at
/// once costs no timer and no clock read.
pub(super) struct CallDeadline {
    after: Duration,
    timer: Option<exec::Sleep>,
}

impl CallDeadline {
    /// A deadline `after` past the first wait.
    pub(super) fn new(after: Duration) -> Self {
        Self { after, timer: None }
    }

    /// Whether the deadline has passed, on `exec`'s clock; if not, `cx` is woken at it.
    /// The first call starts the timer.
    pub(super) fn expired(&mut self, exec: &exec::Handle, cx: &mut Context<'_>) -> bool {
        let after = self.after;
        let t = self.timer.get_or_insert_with(|| {
            exec.sleep_until(super::calls::deadline_after(exec.now(), after))
        });
        Pin::new(t).poll(cx).is_ready()
    }

    /// The deadline, if a wait started it (a call that waited keeps it once open).
    pub(super) fn started(&self) -> Option<Instant> {
        self.timer.as_ref().map(exec::Sleep::deadline)
    }
}

/// The index of `node`'s connection in `inner` if a call can go out on it. Errors:
/// [`CallError::NotConnected`] (no connection, or one without RPC);
/// [`CallError::PeerGone`] (broken); boxed, as the send step's.
fn call_conn(inner: &Inner, node: NodeId) -> Result<usize, Box<CallError>> {
    let Some(&ci) = inner.by_node.get(&node) else {
        return Err(Box::new(CallError::NotConnected { node }));
    };
    let conn = &inner.conns[ci];
    if let Some(why) = &conn.broken {
        return Err(Box::new(CallError::PeerGone {
            node,
            why: why.clone(),
        }));
    }
    if conn.rpc.is_none() {
        return Err(Box::new(CallError::NotConnected { node }));
    }
    Ok(ci)
}

/// A call on its way out ([`ThreadCtx::send_request`]). Dropped while it waits, it
/// gives its credit ticket back (and its buffers, as they drop).
struct Sending<'a> {
    ctx: &'a ThreadCtx,
    node: NodeId,
    handler: u16,
    req: &'a [u8],
    plan: CallPlan,
    /// Its ticket of the credit queue, once it had to wait for credit.
    ticket: Option<u64>,
    deadline: CallDeadline,
    bufs: CallBufs,
    /// Stalled on credit once already (counted once; the request buffer is written).
    stalled: bool,
}

impl<'a> Sending<'a> {
    /// The request's prefix and inline body, once its buffers are held (`mr` is their
    /// arena's). A request sent by reference is written into its buffer here, once: a
    /// call that stalled on credit wrote it already.
    fn encode(&self, mr: &MemoryRegion) -> (RequestPrefix, &'a [u8]) {
        let addr = |c: &Chunk| mr.addr() + c.off() as u64;
        let zc = self.bufs.zc.as_ref().map(|c| ZeroCopyPrefix {
            addr: addr(c),
            rkey: mr.rkey(),
            capacity: self.plan.zc_len as u32,
        });
        let by_ref = self.bufs.req.as_ref().map(|c| {
            if !self.stalled {
                mr.write(c.off(), self.req);
            }
            FetchPrefix {
                addr: addr(c),
                rkey: mr.rkey(),
                len: self.req.len() as u32,
            }
        });
        let body = if by_ref.is_some() { &[][..] } else { self.req };
        (RequestPrefix::new(self.plan.mode, zc, by_ref), body)
    }

    /// One try to send the call; see [`ThreadCtx::send_request`].
    fn try_send(&mut self, cx: &mut Context<'_>) -> Poll<Result<u64, Box<CallError>>> {
        let ctx = self.ctx;
        let (node, handler, after) = (self.node, self.handler, self.plan.after);
        let timeout = || {
            Box::new(CallError::Timeout {
                node,
                handler,
                after,
            })
        };
        let mut inner = ctx.inner.borrow_mut();
        let ci = match call_conn(&inner, node) {
            Ok(ci) => ci,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let Inner {
            conns,
            arena,
            calls,
            stats,
            stalled,
            ..
        } = &mut *inner;
        let rpc = conns[ci].rpc.as_mut().expect("checked by call_conn");
        // 1. Its turn at the ring's credit: first come, first served while calls wait.
        if !rpc.credit_q.my_turn(&mut self.ticket, cx.waker()) {
            if self.deadline.expired(&ctx.exec, cx) {
                rpc.credit_q.leave(&mut self.ticket);
                return Poll::Ready(Err(timeout()));
            }
            return Poll::Pending;
        }
        // 2. The buffers the server will touch; none free: wait for in-flight work.
        let fetch = sent_by_reference(self.req.len(), self.plan.mode, rpc.chan.max_payload());
        let need = [
            self.plan.zero_copy_target_bytes(),
            fetch.then_some(self.req.len()),
        ];
        if !self.bufs.fill(need, |n| arena.alloc(n)) {
            if !self.deadline.expired(&ctx.exec, cx) {
                stalled.push(cx.waker().clone());
                return Poll::Pending;
            }
            rpc.credit_q.leave(&mut self.ticket);
            return Poll::Ready(Err(timeout()));
        }
        // 3. The request: prefixes naming the buffers, header.
        let call_id = calls.next_id();
        let pushed = if self.bufs.is_empty() {
            // Most calls: no buffer, so no prefix to build (and move: 48 bytes).
            let hdr = RequestPrefix::bare_header(self.plan.mode, handler, call_id);
            rpc.chan.push(hdr, &[self.req])
        } else {
            let (prefix, body) = self.encode(arena.mr());
            rpc.chan
                .push(prefix.header(handler, call_id), &[prefix.bytes(), body])
        };
        // 4. Push, and open the call: it owns its buffers until its end.
        match pushed {
            Ok(()) => {
                stats.messages += 1;
                stats.bytes += self.req.len() as u64;
                if fetch {
                    stats.fetched_requests += 1;
                }
                let held = std::mem::take(&mut self.bufs).into_held();
                rpc.credit_q.leave(&mut self.ticket);
                let id = calls.open(node, handler, self.deadline.started(), after, held);
                debug_assert_eq!(id, call_id);
                Poll::Ready(Ok(id))
            }
            Err(RocketError::RingFull) if !self.deadline.expired(&ctx.exec, cx) => {
                if !self.stalled {
                    self.stalled = true;
                    stats.credit_stalls += 1;
                }
                rpc.credit_q.wait_for_credit(&mut self.ticket, cx.waker());
                Poll::Pending
            }
            Err(e) => {
                rpc.credit_q.leave(&mut self.ticket);
                Poll::Ready(Err(Box::new(push_error(e, node, handler, after))))
            }
        }
    }
}

impl Future for Sending<'_> {
    type Output = Result<u64, Box<CallError>>;
    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().try_send(cx)
    }
}

impl Drop for Sending<'_> {
    /// Gives the credit ticket back if the call is dropped while waiting, and lets the
    /// next waiter try.
    fn drop(&mut self) {
        let Some(t) = self.ticket.take() else {
            return;
        };
        let mut inner = self.ctx.inner.borrow_mut();
        let inner = &mut *inner;
        if let Some(rpc) = inner
            .by_node
            .get(&self.node)
            .copied()
            .and_then(|ci| inner.conns[ci].rpc.as_mut())
        {
            rpc.credit_q.done(t);
            rpc.credit_q.wake_all();
        }
    }
}

/// Waits for the reply of call `id`. Dropped before it came, it abandons the call.
struct CallWait<'a> {
    ctx: &'a ThreadCtx,
    id: u64,
    node: NodeId,
    done: bool,
}

impl Future for CallWait<'_> {
    type Output = (Reply, Held);
    // Inlined into the caller's future (another crate's, often), so that the reply is
    // not written to and read back from the stack once per frame.
    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let r = self.ctx.inner.borrow_mut().calls.poll(self.id, cx.waker());
        if r.is_ready() {
            self.done = true;
        }
        r
    }
}

impl Drop for CallWait<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut inner = self.ctx.inner.borrow_mut();
        let inner = &mut *inner;
        // Buffers the server is done with are freed when `a` drops.
        let a = inner.calls.abandon(self.id);
        let Some(rpc) = inner
            .by_node
            .get(&self.node)
            .copied()
            .and_then(|ci| inner.conns[ci].rpc.as_mut())
        else {
            return;
        };
        if a.cancel {
            rpc.control.push((MsgKind::Cancel, self.id));
        }
        if let Some(h) = a.release {
            rpc.control.push((MsgKind::Release, h));
        }
    }
}

/// The reply that response-ring message `h` with `payload` from `node` carries for its
/// call, or `None` for a message that answers no call. A malformed reply (a READ
/// descriptor of the wrong size, a zero-copy Done without its length) is the call's
/// [`CallError::Protocol`].
#[inline]
pub(super) fn decode_reply(node: NodeId, h: &MsgHeader, payload: &[u8]) -> Option<Reply> {
    Some(match MsgKind::from_u8(h.kind)? {
        MsgKind::Response => Reply::Inline(payload.to_vec()),
        MsgKind::Error => Reply::Failed(Box::new(CallError::Remote {
            node,
            handler: h.handler,
            msg: String::from_utf8_lossy(payload).into_owned(),
        })),
        MsgKind::Cancelled => Reply::Failed(Box::new(CallError::Protocol {
            node,
            what: "call cancelled",
        })),
        MsgKind::ReadReply => match ReadReply::from_bytes(payload) {
            Some(r) => Reply::Read(r),
            None => Reply::Failed(Box::new(CallError::Protocol {
                node,
                what: "READ reply descriptor of the wrong size",
            })),
        },
        MsgKind::ZeroCopyDone => match payload.get(..8) {
            Some(b) => Reply::ZeroCopy(u64::from_le_bytes(b.try_into().expect("8")) as usize),
            None => Reply::Failed(Box::new(CallError::Protocol {
                node,
                what: "zero-copy reply without a length",
            })),
        },
        _ => return None,
    })
}

/// Whether a zero-copy reply of `len` bytes (a length the peer chose) and its 8-byte
/// generation trailer fit a target of `cap` bytes; never overflows.
pub(super) fn zero_copy_fits(len: usize, cap: usize) -> bool {
    len.checked_add(8).is_some_and(|n| n <= cap)
}

/// The reply in `out`, the first `len + 8` bytes of a zero-copy target (the reply, then
/// its generation), if that generation is the call's `id`; `None` when the target was
/// written for another call (or `out` is short).
pub(super) fn zero_copy_payload(mut out: Vec<u8>, len: usize, id: u64) -> Option<Vec<u8>> {
    let gen = out.get(len..len.checked_add(8)?)?;
    if u64::from_le_bytes(gen.try_into().expect("8 bytes")) != id {
        return None;
    }
    out.truncate(len);
    Some(out)
}

/// The reply in `data`, a READ-mode buffer `[handle | len bytes | handle]`, if both of
/// its generation words are `handle`; `None` when the buffer expired or was reused (or
/// `data` is short).
pub(super) fn read_reply_payload(mut data: Vec<u8>, len: usize, handle: u64) -> Option<Vec<u8>> {
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let head = word(data.get(..8)?);
    let end = len.checked_add(16)?;
    let tail = word(data.get(end - 8..end)?);
    if head != handle || tail != handle {
        return None;
    }
    data.truncate(8 + len);
    data.drain(..8);
    Some(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::ChunkPool;
    use std::task::Waker;

    fn cfg() -> RuntimeConfig {
        RuntimeConfig::default()
    }

    #[test]
    fn plan_picks_the_mode_by_size_and_checks_limits() {
        let c = cfg();
        let (th, max) = (c.mode_threshold, c.max_transfer);
        let auto = CallOpts::default();
        let p = CallPlan::new(&auto, &c, 10).unwrap();
        assert_eq!(
            (p.mode, p.zc_len, p.after),
            (ReplyMode::Auto, 0, c.call_timeout)
        );
        assert_eq!(p.zero_copy_target_bytes(), None);
        // Auto with a large expected reply goes zero-copy; a small one stays Auto.
        let big = CallOpts {
            reply_len: Some(th + 1),
            timeout: Some(Duration::from_millis(7)),
            ..CallOpts::default()
        };
        let p = CallPlan::new(&big, &c, 10).unwrap();
        assert_eq!((p.mode, p.zc_len), (ReplyMode::ZeroCopy, th + 1));
        assert_eq!(p.after, Duration::from_millis(7));
        assert_eq!(p.zero_copy_target_bytes(), Some(th + 9));
        let small = CallOpts {
            reply_len: Some(th),
            ..CallOpts::default()
        };
        assert_eq!(CallPlan::new(&small, &c, 10).unwrap().mode, ReplyMode::Auto);
        // Explicit zero-copy without a length takes the largest transfer.
        let zc = CallOpts::mode(ReplyMode::ZeroCopy);
        assert_eq!(CallPlan::new(&zc, &c, 10).unwrap().zc_len, max);
        let read = CallOpts::mode(ReplyMode::Read);
        let p = CallPlan::new(&read, &c, 10).unwrap();
        assert_eq!((p.mode, p.zc_len), (ReplyMode::Read, 0));
        // Limits: the target first, then the request.
        let huge = CallOpts {
            mode: ReplyMode::ZeroCopy,
            reply_len: Some(max + 1),
            ..CallOpts::default()
        };
        assert!(matches!(
            CallPlan::new(&huge, &c, max + 5),
            Err(CallError::TooLarge { len, .. }) if len == max + 1
        ));
        assert!(matches!(
            CallPlan::new(&auto, &c, max + 5),
            Err(CallError::TooLarge { len, .. }) if len == max + 5
        ));
        assert!(CallPlan::new(&auto, &c, max).is_ok());
    }

    #[test]
    fn a_request_goes_by_reference_when_it_and_its_prefix_overflow_a_bucket() {
        assert!(!sent_by_reference(100, ReplyMode::Auto, 100));
        assert!(sent_by_reference(101, ReplyMode::Auto, 100));
        let z = ZeroCopyPrefix::BYTES;
        assert!(!sent_by_reference(100 - z, ReplyMode::ZeroCopy, 100));
        assert!(sent_by_reference(101 - z, ReplyMode::ZeroCopy, 100));
    }

    #[test]
    fn buffers_are_taken_as_room_appears_and_freed_if_the_call_fails() {
        let pool = ChunkPool::new(256, 128);
        let hog = pool.alloc(128).unwrap();
        let mut b = CallBufs::default();
        // The target fits, the request buffer does not (yet): the target is kept.
        assert!(!b.fill([Some(64), Some(128)], |n| pool.alloc(n)));
        assert_eq!(pool.in_use(), 2);
        drop(hog);
        assert!(b.fill([Some(64), Some(128)], |n| pool.alloc(n)));
        assert_eq!(pool.in_use(), 2, "the target was not taken twice");
        // A zero-byte need still takes a buffer; nothing needed takes none.
        let mut e = CallBufs::default();
        assert!(e.fill([None, None], |_| unreachable!()));
        assert!(e.into_held().is_empty());
        let held = b.into_held();
        assert_eq!(held.offsets().0.map(|o| o % 64), Some(0));
        drop(held);
        assert_eq!(pool.in_use(), 0);
        let mut z = CallBufs::default();
        assert!(z.fill([Some(0), None], |n| {
            assert_eq!(n, 1);
            pool.alloc(n)
        }));
        drop(z);
        assert_eq!(
            pool.in_use(),
            0,
            "a failed call's buffers go back as it drops"
        );
    }

    #[test]
    fn the_request_prefix_names_the_target_then_the_request_buffer() {
        let z = ZeroCopyPrefix {
            addr: 0x1000,
            rkey: 7,
            capacity: 64,
        };
        let f = FetchPrefix {
            addr: 0x2000,
            rkey: 7,
            len: 900,
        };
        let p = RequestPrefix::new(ReplyMode::Auto, None, None);
        assert!(p.bytes().is_empty());
        let h = p.header(3, 99);
        assert_eq!(
            (h.handler, h.call_id, h.flags),
            (3, 99, ReplyMode::Auto as u8)
        );
        assert_eq!(h.kind, MsgKind::Request as u8);
        // The prefix-free fast path sends the same header as an empty prefix.
        for m in [
            ReplyMode::Rpc,
            ReplyMode::Auto,
            ReplyMode::Read,
            ReplyMode::ZeroCopy,
        ] {
            let (a, b) = (
                RequestPrefix::new(m, None, None).header(3, 99),
                RequestPrefix::bare_header(m, 3, 99),
            );
            assert_eq!(
                (a.len, a.handler, a.kind, a.flags, a.call_id),
                (b.len, b.handler, b.kind, b.flags, b.call_id)
            );
        }
        let p = RequestPrefix::new(ReplyMode::ZeroCopy, Some(z), Some(f));
        let mut want = z.to_bytes().to_vec();
        want.extend_from_slice(&f.to_bytes());
        assert_eq!(p.bytes(), &want[..]);
        assert_eq!(
            p.header(3, 99).flags,
            ReplyMode::ZeroCopy as u8 | FetchPrefix::FLAG
        );
        let p = RequestPrefix::new(ReplyMode::Read, None, Some(f));
        assert_eq!(p.bytes(), &f.to_bytes()[..]);
    }

    #[test]
    fn push_errors_keep_their_meaning() {
        let (n, after) = (NodeId(2), Duration::from_millis(5));
        assert!(matches!(
            push_error(RocketError::RingFull, n, 4, after),
            CallError::Timeout { handler: 4, .. }
        ));
        assert!(matches!(
            push_error(RocketError::TooLarge { len: 9, max: 8 }, n, 4, after),
            CallError::TooLarge { len: 9, max: 8 }
        ));
        assert!(matches!(
            push_error(
                RocketError::StagingTooSmall { have: 1, need: 2 },
                n,
                4,
                after
            ),
            CallError::Protocol { .. }
        ));
    }

    #[test]
    fn the_deadline_starts_at_the_first_wait_and_wakes_the_call() {
        let exec = exec::Handle::new();
        let mut cx = Context::from_waker(Waker::noop());
        let mut d = CallDeadline::new(Duration::from_secs(3600));
        assert_eq!(d.started(), None, "no clock read before a wait");
        assert!(!d.expired(&exec, &mut cx));
        let at = d.started().expect("started by the wait");
        assert_eq!(at, exec.now() + Duration::from_secs(3600));
        assert_eq!(exec.timers(), 1, "registered to wake the call");
        assert!(!d.expired(&exec, &mut cx));
        assert_eq!(d.started(), Some(at), "the same deadline");
        drop(d);
        assert_eq!(exec.timers(), 0);
        let mut now = CallDeadline::new(Duration::ZERO);
        assert!(now.expired(&exec, &mut cx));
        // A timeout too large for the clock never ends (and does not panic).
        let mut never = CallDeadline::new(Duration::MAX);
        assert!(!never.expired(&exec, &mut cx));
    }

    #[test]
    fn replies_decode_by_kind_and_malformed_ones_fail_their_call() {
        let n = NodeId(1);
        let h = |kind: MsgKind| MsgHeader {
            len: 0,
            handler: 5,
            kind: kind as u8,
            flags: 0,
            call_id: 1,
        };
        assert!(matches!(
            decode_reply(n, &h(MsgKind::Response), b"ok"),
            Some(Reply::Inline(v)) if v == b"ok"
        ));
        assert!(matches!(
            decode_reply(n, &h(MsgKind::Error), b"bad"),
            Some(Reply::Failed(e)) if matches!(&*e, CallError::Remote { handler: 5, msg, .. } if msg == "bad")
        ));
        assert!(matches!(
            decode_reply(n, &h(MsgKind::Cancelled), b""),
            Some(Reply::Failed(e)) if matches!(*e, CallError::Protocol { .. })
        ));
        let r = ReadReply {
            addr: 1,
            rkey: 2,
            len: 3,
            handle: 4,
        };
        assert!(matches!(
            decode_reply(n, &h(MsgKind::ReadReply), &r.to_bytes()),
            Some(Reply::Read(x)) if x == r
        ));
        assert!(matches!(
            decode_reply(n, &h(MsgKind::ReadReply), &[0; 3]),
            Some(Reply::Failed(e)) if matches!(*e, CallError::Protocol { .. })
        ));
        let mut done = [0u8; 16];
        done[..8].copy_from_slice(&42u64.to_le_bytes());
        assert!(matches!(
            decode_reply(n, &h(MsgKind::ZeroCopyDone), &done),
            Some(Reply::ZeroCopy(42))
        ));
        assert!(matches!(
            decode_reply(n, &h(MsgKind::ZeroCopyDone), &[1, 2]),
            Some(Reply::Failed(e)) if matches!(*e, CallError::Protocol { .. })
        ));
        // A peer-chosen length as large as u64 decodes (and is refused by the fit).
        assert!(matches!(
            decode_reply(n, &h(MsgKind::ZeroCopyDone), &u64::MAX.to_le_bytes()),
            Some(Reply::ZeroCopy(l)) if !zero_copy_fits(l, 1 << 20)
        ));
        // Messages that answer no call.
        assert!(decode_reply(n, &h(MsgKind::Request), b"").is_none());
        let mut unknown = h(MsgKind::Response);
        unknown.kind = 0xee;
        assert!(decode_reply(n, &unknown, b"").is_none());
    }

    #[test]
    fn zero_copy_lengths_from_the_peer_never_overflow_and_generations_are_checked() {
        assert!(zero_copy_fits(56, 64));
        assert!(!zero_copy_fits(57, 64));
        assert!(!zero_copy_fits(usize::MAX, 64));
        assert!(!zero_copy_fits(usize::MAX - 7, usize::MAX));
        let mut out = b"hello".to_vec();
        out.extend_from_slice(&9u64.to_le_bytes());
        assert_eq!(
            zero_copy_payload(out.clone(), 5, 9).as_deref(),
            Some(&b"hello"[..])
        );
        assert_eq!(
            zero_copy_payload(out.clone(), 5, 8),
            None,
            "another call's reply"
        );
        assert_eq!(zero_copy_payload(out.clone(), 6, 9), None, "short");
        assert_eq!(zero_copy_payload(out, usize::MAX, 9), None);
    }

    /// A zero-copy reply whose peer-chosen length is near overflow (u32::MAX, u64::MAX
    /// as usize, usize::MAX - 7) fails its call with a protocol error on a real context;
    /// nothing panics and the context keeps working.
    #[test]
    fn a_zero_copy_reply_length_near_overflow_fails_the_call_not_the_thread() {
        use crate::fabric::{Fabric, FabricConfig, FabricKind};
        let cluster = format!("unit-{}-zc-overflow", std::process::id());
        let _g = crate::fabric::shm::ClusterGuard::new(&cluster).unwrap();
        let f = Fabric::open(&FabricConfig::new(FabricKind::Shm, &cluster, NodeId(0))).unwrap();
        let ctx = ThreadCtx::new(f, cfg()).unwrap();
        let node = NodeId(1);
        for len in [
            u32::MAX as usize,
            u64::MAX as usize,
            usize::MAX - 7,
            usize::MAX,
        ] {
            let chunk = ctx.inner.borrow().arena.alloc(64);
            let done = u64::try_from(len).unwrap().to_le_bytes();
            let h = MsgHeader {
                len: 8,
                handler: 3,
                kind: MsgKind::ZeroCopyDone as u8,
                flags: 0,
                call_id: 1,
            };
            let Some(Reply::ZeroCopy(l)) = decode_reply(node, &h, &done) else {
                panic!("a ZeroCopyDone decodes to a zero-copy reply");
            };
            assert!(matches!(
                ctx.take_zero_copy(node, 3, 1, l, chunk),
                Err(CallError::Protocol { .. })
            ));
        }
        // The context still serves a well-formed reply.
        let chunk = ctx.inner.borrow().arena.alloc(64).unwrap();
        let mut body = b"ok".to_vec();
        body.extend_from_slice(&1u64.to_le_bytes());
        ctx.inner.borrow().arena.mr().write(chunk.off(), &body);
        assert_eq!(
            ctx.take_zero_copy(node, 3, 1, 2, Some(chunk)).unwrap(),
            b"ok"
        );
    }

    #[test]
    fn read_replies_need_both_generation_words() {
        let buf = |head: u64, body: &[u8], tail: u64| {
            let mut v = head.to_le_bytes().to_vec();
            v.extend_from_slice(body);
            v.extend_from_slice(&tail.to_le_bytes());
            v
        };
        assert_eq!(
            read_reply_payload(buf(7, b"abc", 7), 3, 7).as_deref(),
            Some(&b"abc"[..])
        );
        assert_eq!(
            read_reply_payload(buf(0, b"abc", 7), 3, 7),
            None,
            "released"
        );
        assert_eq!(read_reply_payload(buf(7, b"abc", 8), 3, 7), None, "reused");
        assert_eq!(
            read_reply_payload(buf(7, b"", 7), 0, 7).as_deref(),
            Some(&b""[..])
        );
        assert_eq!(read_reply_payload(buf(7, b"abc", 7), 4, 7), None, "short");
        assert_eq!(read_reply_payload(vec![0; 16], usize::MAX, 0), None);
    }
}
