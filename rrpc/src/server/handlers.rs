//! The registry of RPC handlers by id: plain (synchronous) handlers, async handlers that
//! may await calls and one-sided operations on their server thread's runtime, and
//! sorted-batch handlers (Scythe, 4.4, Fig. 16).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::wire::{IdHash, MsgKind};
use crate::NodeId;

/// Who sent a request: the node and incarnation its connection authenticated at setup
/// (the Rocket offer's, on the control plane), never anything in the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Caller {
    /// The requester's node id.
    pub node: NodeId,
    /// The requester's incarnation of that id (0 from a requester that sends none).
    pub incarnation: u64,
}

impl Caller {
    /// The caller of a request run outside a connection ([`Handlers::call`]).
    pub const UNKNOWN: Caller = Caller {
        node: NodeId::MAX,
        incarnation: 0,
    };
}

/// A request handler that is told its caller ([`Handlers::register_with_caller`]).
pub type CallerHandler =
    Arc<dyn Fn(Caller, &[u8], &mut Vec<u8>) -> Result<(), String> + Send + Sync>;

/// A request handler: reads the request payload, appends the response payload to `out`.
/// An `Err` is sent back to the caller as [`crate::runtime::CallError::Remote`].
pub type Handler = Arc<dyn Fn(&[u8], &mut Vec<u8>) -> Result<(), String> + Send + Sync>;

/// The future an async handler returns: runs on its server thread's executor (it need
/// not be `Send`) and resolves to the response payload or an error message.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, String>>>>;

/// An async handler: called on a server thread with the request payload.
pub type AsyncHandler = Arc<dyn Fn(Vec<u8>) -> HandlerFuture + Send + Sync>;

/// An async handler that is told its caller ([`Handlers::register_async_with_caller`]).
pub type AsyncCallerHandler = Arc<dyn Fn(Caller, Vec<u8>) -> HandlerFuture + Send + Sync>;

/// One request of a sorted batch.
#[derive(Clone, Copy, Debug)]
pub struct BatchReq<'a> {
    /// Object key the request is sorted by first.
    pub key: u64,
    /// Timestamp it is sorted by second.
    pub ts: u64,
    /// The request payload.
    pub payload: &'a [u8],
    /// Who sent it.
    pub caller: Caller,
}

/// Extracts `(key, timestamp)` from a request payload; `None` rejects it as malformed.
pub type KeyFn = Arc<dyn Fn(&[u8]) -> Option<(u64, u64)> + Send + Sync>;
/// Handles a batch of requests sorted by (key, timestamp): pushes one result per
/// request, in the order given.
pub type BatchFn = Arc<dyn Fn(&[BatchReq<'_>], &mut Vec<Result<Vec<u8>, String>>) + Send + Sync>;

/// A handler id registered twice on one [`Handlers`] ([`Handlers::try_register`]; the
/// `register*` methods panic with this text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "handler id {id} registered twice on one node (one handler per id; Handlers::remove \
     replaces on purpose{})",
    ids::owner(*id).map(|o| format!("; ids {}..={} belong to {}", o.first, o.last, o.owner)).unwrap_or_default()
)]
#[non_exhaustive]
pub struct DuplicateId {
    /// The id.
    pub id: u16,
}

/// Handler ids reserved for this project's services, in one place. Each service's id
/// constants are checked against its range at compile time (`lockd::wire`,
/// `lockd::table_wire`, `lockd::load`, `tso::proxy`); applications take ids from
/// [`FIRST_APP_ID`](ids::FIRST_APP_ID) up, and an embedder that runs, say, a lock service and its own
/// service on one node only has to stay out of these ranges.
pub mod ids {
    /// A range of handler ids, `first..=last`, reserved for `owner`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct IdRange {
        /// The first id of the range.
        pub first: u16,
        /// The last id of the range (inclusive).
        pub last: u16,
        /// Who uses it.
        pub owner: &'static str,
    }

    impl IdRange {
        /// Whether `id` lies in the range (usable in `const` assertions).
        pub const fn contains(&self, id: u16) -> bool {
            self.first <= id && id <= self.last
        }
    }

    /// The lock service, `lockd::wire`: Lock 1, release-node 2, abandon 3, lock-and-read
    /// 4.
    pub const LOCKD: IdRange = IdRange {
        first: 1,
        last: 19,
        owner: "the lock service (lockd::wire)",
    };
    /// Lotus lock tables, `lockd::table_wire` and `lockd::load`: 20 to 25.
    pub const LOCK_TABLES: IdRange = IdRange {
        first: 20,
        last: 39,
        owner: "Lotus lock tables (lockd::table_wire, lockd::load)",
    };
    /// Benchmarks and transaction services (`tso-bench`'s RPC oracle: 40).
    pub const BENCH_TXN: IdRange = IdRange {
        first: 40,
        last: 59,
        owner: "benchmarks and transaction services",
    };
    /// The timestamp oracle and its proxies (`tso::proxy`: range 60).
    pub const TSO: IdRange = IdRange {
        first: 60,
        last: 99,
        owner: "the timestamp oracle and its proxies (tso::proxy)",
    };
    /// Every reserved range, in id order.
    pub const RESERVED: [IdRange; 4] = [LOCKD, LOCK_TABLES, BENCH_TXN, TSO];
    /// The first handler id left to applications; every id from it up is free.
    pub const FIRST_APP_ID: u16 = 100;

    /// The reserved range `id` lies in, if any.
    pub fn owner(id: u16) -> Option<IdRange> {
        RESERVED.into_iter().find(|r| r.contains(id))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn ranges_are_ordered_disjoint_and_end_below_the_app_ids() {
            for w in RESERVED.windows(2) {
                assert!(w[0].first <= w[0].last && w[0].last < w[1].first, "{w:?}");
            }
            assert_eq!(RESERVED[RESERVED.len() - 1].last + 1, FIRST_APP_ID);
            assert_eq!(owner(60).map(|r| r.first), Some(60));
            assert_eq!(owner(FIRST_APP_ID), None);
            assert_eq!(owner(0), None);
        }
    }
}

/// What is registered under one id.
#[derive(Clone)]
pub(crate) enum Entry {
    Sync(Handler),
    SyncCaller(CallerHandler),
    Async(AsyncHandler),
    AsyncCaller(AsyncCallerHandler),
    /// The key, the batch body, and the sort group: requests of every sorted handler
    /// of one group are ordered together.
    Sorted(KeyFn, BatchFn, u16),
}

/// Handlers by id: one handler per id on a node. Registering an id twice is a bug of
/// the program that does it (two services embedded in one node that chose the same id,
/// say): the `register*` methods panic at setup, naming the id, rather than leaving one
/// of them silently unreachable, and [`Handlers::try_register`] (and
/// `try_register_typed`) return [`DuplicateId`] instead. [`Handlers::contains`] asks
/// first, [`Handlers::remove`] replaces on purpose.
///
/// The ids this project's services use are reserved in [`ids`] (stay clear of them when
/// embedding one); applications use ids from [`ids::FIRST_APP_ID`] (100) up.
#[derive(Clone, Default)]
pub struct Handlers {
    map: HashMap<u16, Entry, IdHash>,
}

impl Handlers {
    /// The first handler id left to applications ([`ids::FIRST_APP_ID`]).
    pub const FIRST_APP_ID: u16 = ids::FIRST_APP_ID;

    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether handler `id` is registered.
    pub fn contains(&self, id: u16) -> bool {
        self.map.contains_key(&id)
    }

    /// Unregister handler `id` (so that it can be registered anew); returns whether it
    /// was registered.
    pub fn remove(&mut self, id: u16) -> bool {
        self.map.remove(&id).is_some()
    }

    /// Put `e` under `id`, or refuse if `id` is taken.
    fn try_insert(&mut self, id: u16, e: Entry) -> Result<&mut Self, DuplicateId> {
        if self.map.contains_key(&id) {
            return Err(DuplicateId { id });
        }
        self.map.insert(id, e);
        Ok(self)
    }

    /// Put `e` under `id`. Panics if `id` is taken (the type's docs).
    fn insert(&mut self, id: u16, e: Entry) -> &mut Self {
        match self.try_insert(id, e) {
            Ok(s) => s,
            Err(e) => panic!("rrpc: {e}"),
        }
    }

    /// Register `f` as handler `id` like [`Handlers::register`], but return
    /// [`DuplicateId`] (registering nothing) if `id` is taken.
    pub fn try_register(
        &mut self,
        id: u16,
        f: impl Fn(&[u8], &mut Vec<u8>) -> Result<(), String> + Send + Sync + 'static,
    ) -> Result<&mut Self, DuplicateId> {
        self.try_insert(id, Entry::Sync(Arc::new(f)))
    }

    /// Register async handler `id` like [`Handlers::register_async`], but return
    /// [`DuplicateId`] (registering nothing) if `id` is taken.
    pub fn try_register_async<F, Fut>(&mut self, id: u16, f: F) -> Result<&mut Self, DuplicateId>
    where
        F: Fn(Vec<u8>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<u8>, String>> + 'static,
    {
        self.try_insert(id, Entry::Async(Arc::new(move |req| Box::pin(f(req)))))
    }

    /// Register `f` as handler `id`, panicking if `id` is taken (the type's docs). It runs inline in the
    /// server thread's polling round: keep it short and non-blocking.
    pub fn register(
        &mut self,
        id: u16,
        f: impl Fn(&[u8], &mut Vec<u8>) -> Result<(), String> + Send + Sync + 'static,
    ) -> &mut Self {
        self.insert(id, Entry::Sync(Arc::new(f)))
    }

    /// Register `f` as handler `id` like [`Handlers::register`], and tell it each request's [`Caller`]: the node and
    /// incarnation the requester's connection authenticated at setup.
    pub fn register_with_caller(
        &mut self,
        id: u16,
        f: impl Fn(Caller, &[u8], &mut Vec<u8>) -> Result<(), String> + Send + Sync + 'static,
    ) -> &mut Self {
        self.insert(id, Entry::SyncCaller(Arc::new(f)))
    }

    /// Register a sorted-batch handler `id` as [`Handlers::register_sorted`] does; each
    /// request's [`BatchReq::caller`] names who sent it (which every sorted handler
    /// sees; this name says the handler relies on it).
    pub fn register_sorted_with_caller(
        &mut self,
        id: u16,
        key: impl Fn(&[u8]) -> Option<(u64, u64)> + Send + Sync + 'static,
        f: impl Fn(&[BatchReq<'_>], &mut Vec<Result<Vec<u8>, String>>) + Send + Sync + 'static,
    ) -> &mut Self {
        self.register_sorted(id, key, f)
    }

    /// Register an async handler `id` (panicking if `id` is taken). `f` is called on a
    /// server thread with the request payload; the future it returns runs as a
    /// coroutine of that thread's executor and may await RPC calls and one-sided
    /// operations through [`crate::runtime::ThreadCtx::current`] (the server thread's
    /// runtime context, see [`crate::node::Node`]), for example a TSO proxy's FAA on
    /// the oracle. Its requests are answered when their futures end, in any order.
    pub fn register_async<F, Fut>(&mut self, id: u16, f: F) -> &mut Self
    where
        F: Fn(Vec<u8>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<u8>, String>> + 'static,
    {
        self.insert(id, Entry::Async(Arc::new(move |req| Box::pin(f(req)))))
    }

    /// Register an async handler `id` as [`Handlers::register_async`] does, and tell it
    /// each request's [`Caller`].
    pub fn register_async_with_caller<F, Fut>(&mut self, id: u16, f: F) -> &mut Self
    where
        F: Fn(Caller, Vec<u8>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<u8>, String>> + 'static,
    {
        self.insert(
            id,
            Entry::AsyncCaller(Arc::new(move |c, req| Box::pin(f(c, req)))),
        )
    }

    /// Register a sorted-batch handler `id` (Scythe 4.4, Fig. 16): the requests for `id`
    /// that the server's threads received since the batch last ran, from all their
    /// Rockets, are sorted by `key(payload)` = (object key, timestamp) (stable, so equal
    /// pairs keep arrival order) and handed to `f` at once, by one thread at a time.
    /// `f` pushes one result per request in batch order; a missing result fails that
    /// request, a request `key` rejects gets an error reply. Panics if `id` is taken.
    pub fn register_sorted(
        &mut self,
        id: u16,
        key: impl Fn(&[u8]) -> Option<(u64, u64)> + Send + Sync + 'static,
        f: impl Fn(&[BatchReq<'_>], &mut Vec<Result<Vec<u8>, String>>) + Send + Sync + 'static,
    ) -> &mut Self {
        self.register_sorted_in(id, id, key, f)
    }

    /// [`Handlers::register_sorted`] in the sort group `group` (the other registrations
    /// put each handler in a group of its own, its id): the pending requests of every
    /// sorted handler of a group are sorted together by (key, timestamp), and each run
    /// of consecutive requests for one handler goes to it as a batch, so that two
    /// handlers serving one queue (a lock service's Lock RPC and lock-and-read) serve
    /// it in timestamp order across both. Panics if `id` is taken.
    pub fn register_sorted_in(
        &mut self,
        id: u16,
        group: u16,
        key: impl Fn(&[u8]) -> Option<(u64, u64)> + Send + Sync + 'static,
        f: impl Fn(&[BatchReq<'_>], &mut Vec<Result<Vec<u8>, String>>) + Send + Sync + 'static,
    ) -> &mut Self {
        self.insert(id, Entry::Sorted(Arc::new(key), Arc::new(f), group))
    }

    /// Whether some handler is async (its server threads then need a runtime).
    pub fn has_async(&self) -> bool {
        self.map
            .values()
            .any(|e| matches!(e, Entry::Async(_) | Entry::AsyncCaller(_)))
    }

    pub(crate) fn get(&self, id: u16) -> Option<&Entry> {
        self.map.get(&id)
    }

    /// Run plain handler `id` on `req`, replacing `out` with its response payload.
    /// Returns [`MsgKind::Response`] on success; otherwise [`MsgKind::Error`] with a
    /// UTF-8 message in `out`: the handler's own error, "no handler N", or "handler N
    /// panicked" (a panicking handler fails its call, not the thread serving every
    /// connection assigned to it). Async and sorted handlers are not run here.
    pub fn call(&self, id: u16, req: &[u8], out: &mut Vec<u8>) -> MsgKind {
        self.call_as(Caller::UNKNOWN, id, req, out)
    }

    /// [`Handlers::call`] on behalf of `caller`, which handlers registered with
    /// [`Handlers::register_with_caller`] are told.
    pub fn call_as(&self, caller: Caller, id: u16, req: &[u8], out: &mut Vec<u8>) -> MsgKind {
        Self::run(self.map.get(&id), caller, id, req, out)
    }

    /// [`Handlers::call_as`] with handler `id`'s entry looked up already (`entry`; `None`
    /// when there is none): the server's dispatch has it, and a second lookup per
    /// request is a fair share of a small RPC.
    pub(crate) fn run(
        entry: Option<&Entry>,
        caller: Caller,
        id: u16,
        req: &[u8],
        out: &mut Vec<u8>,
    ) -> MsgKind {
        out.clear();
        type Run<'a> = &'a dyn Fn(&[u8], &mut Vec<u8>) -> Result<(), String>;
        let h: Run<'_> = match entry {
            Some(Entry::Sync(h)) => &**h,
            Some(Entry::SyncCaller(h)) => &move |req, out| h(caller, req, out),
            Some(_) => {
                out.extend_from_slice(format!("handler {id} is not a plain handler").as_bytes());
                return MsgKind::Error;
            }
            None => {
                out.extend_from_slice(format!("no handler {id}").as_bytes());
                return MsgKind::Error;
            }
        };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h(req, out))) {
            Ok(Ok(())) => MsgKind::Response,
            Ok(Err(msg)) => {
                out.clear();
                out.extend_from_slice(msg.as_bytes());
                MsgKind::Error
            }
            Err(_) => {
                tracing::error!(handler = id, "RPC handler panicked");
                out.clear();
                out.extend_from_slice(format!("handler {id} panicked").as_bytes());
                MsgKind::Error
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "handler id 7 registered twice")]
    fn an_id_registered_twice_panics_naming_it() {
        let mut h = Handlers::new();
        h.register(7, |_, _| Ok(()));
        h.register_async(7, |_| async { Ok(Vec::new()) });
    }

    #[test]
    fn try_register_refuses_a_taken_id_and_keeps_the_first_handler() {
        let mut h = Handlers::new();
        h.register(21, |_, out| {
            out.push(1);
            Ok(())
        });
        let e = h.try_register(21, |_, _| Ok(())).err().expect("refused");
        assert_eq!(e, DuplicateId { id: 21 });
        assert!(
            e.to_string()
                .contains("ids 20..=39 belong to Lotus lock tables"),
            "{e}"
        );
        assert!(h
            .try_register_async(21, |_| async { Ok(Vec::new()) })
            .is_err());
        let mut out = Vec::new();
        assert_eq!(h.call(21, &[], &mut out), MsgKind::Response);
        assert_eq!(out, [1]);
        assert!(h.try_register(22, |_, _| Ok(())).is_ok());
    }

    #[test]
    fn remove_replaces_on_purpose() {
        let mut h = Handlers::new();
        h.register(7, |_, out| {
            out.push(1);
            Ok(())
        });
        assert!(h.contains(7));
        assert!(h.remove(7));
        assert!(!h.contains(7) && !h.remove(7));
        h.register(7, |_, out| {
            out.push(2);
            Ok(())
        });
        let mut out = Vec::new();
        assert_eq!(h.call(7, &[], &mut out), MsgKind::Response);
        assert_eq!(out, [2]);
    }
}
