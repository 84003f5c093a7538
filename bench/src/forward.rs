//! `--routing forward`: Lotus's hybrid routing (Lotus 4.3) with the hop paid. A
//! coordinator that draws a read-write transaction whose first record's lock shard
//! another compute node owns sends the transaction's input to that node by RPC
//! ([`FORWARD_HANDLER`], served beside the node's lock table) and waits for its end; the
//! home node runs it on coordinator coroutines of its own that serve its [`Inbox`], and
//! counts it (commit, latency from its arrival there, the paper's measure, and the
//! history). The sender counts the forwarded transaction apart, with its latency from
//! generation (the hop and the queue included).
//!
//! Home coroutines are separate from the drawing ones: a drawing coroutine waits for
//! its forwarded transaction, and if every coroutine of both nodes waited so, nobody
//! would serve the inboxes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The forwarding RPC (the first application id, served on the compute node's lock
/// service: [`lockd::embed::LockService::start_with`]). Request: the transaction's input
/// as JSON; reply: [`Outcome`] as one byte.
pub const FORWARD_HANDLER: u16 = rrpc::server::Handlers::FIRST_APP_ID;

/// How long a forwarded transaction may wait for its home node before the forwarding
/// call gives up (a home node that stopped serving: the run is ending, or it died). The
/// sender's call waits a little longer, so the home node's answer decides.
pub const FORWARD_WAIT: Duration = Duration::from_secs(10);

/// How a forwarded transaction ended at its home node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Committed (or rolled back by its own logic: final either way).
    Done = 1,
    /// Not run: the home node's run ended first.
    Stopped = 2,
    /// The home node could not decode it, or it failed there (the home node reports
    /// the failure).
    Failed = 3,
}

impl Outcome {
    /// The reply byte's meaning. Errors: an unknown byte.
    pub fn from_byte(b: u8) -> Result<Self, String> {
        match b {
            1 => Ok(Self::Done),
            2 => Ok(Self::Stopped),
            3 => Ok(Self::Failed),
            _ => Err(format!("unknown forwarding outcome {b}")),
        }
    }
}

/// A transaction forwarded to this compute node, waiting for a home coroutine.
pub struct Forwarded {
    /// Its input, as the sender serialized it (JSON).
    pub input: Vec<u8>,
    /// When it arrived here.
    pub arrived: quanta::Instant,
    reply: Arc<Mutex<Option<Outcome>>>,
}

impl Forwarded {
    /// Answer the sender.
    pub fn finish(self, outcome: Outcome) {
        *self.reply.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
    }
}

/// The transactions forwarded to this compute node, shared by its RPC threads (which
/// push) and its home coroutines (which pop).
#[derive(Default)]
pub struct Inbox {
    q: Mutex<VecDeque<Forwarded>>,
    stopped: AtomicBool,
}

impl Inbox {
    /// The next forwarded transaction, if any.
    pub fn pop(&self) -> Option<Forwarded> {
        self.q.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
    }

    fn push(&self, f: Forwarded) {
        self.q
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(f);
    }

    /// Whether the run is over here ([`Self::stop`]).
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// The run is over: answer every waiting transaction [`Outcome::Stopped`], and
    /// every later one at once.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        while let Some(f) = self.pop() {
            f.finish(Outcome::Stopped);
        }
    }

    /// Register [`FORWARD_HANDLER`] on `handlers`: each request is queued here and
    /// answered when a home coroutine finished it (or the run stopped, or
    /// [`FORWARD_WAIT`] passed).
    pub fn register(self: &Arc<Self>, handlers: &mut rrpc::server::Handlers) {
        let inbox = self.clone();
        handlers.register_async(FORWARD_HANDLER, move |input: Vec<u8>| {
            let inbox = inbox.clone();
            async move {
                if inbox.stopped.load(Ordering::SeqCst) {
                    return Ok(vec![Outcome::Stopped as u8]);
                }
                let reply = Arc::new(Mutex::new(None));
                inbox.push(Forwarded {
                    input,
                    arrived: quanta::Instant::now(),
                    reply: reply.clone(),
                });
                let ctx = rrpc::runtime::ThreadCtx::current()
                    .ok_or_else(|| "forwarding: no runtime on the server thread".to_string())?;
                let t0 = std::time::Instant::now();
                loop {
                    if let Some(o) = *reply.lock().unwrap_or_else(|e| e.into_inner()) {
                        return Ok(vec![o as u8]);
                    }
                    if inbox.stopped.load(Ordering::SeqCst) {
                        return Ok(vec![Outcome::Stopped as u8]);
                    }
                    if t0.elapsed() > FORWARD_WAIT {
                        return Err(format!(
                            "forwarding: no home coroutine took the transaction within {FORWARD_WAIT:?}"
                        ));
                    }
                    ctx.sleep(Duration::from_micros(5)).await;
                }
            }
        });
    }
}

/// What a coordinator thread's coroutines forward with: the route (who owns which
/// shard), this node's inbox (home coroutines pop it), and how to reach each other
/// compute node's forwarding RPC (its node id, connected on the thread's context).
#[derive(Clone)]
pub struct ForwardPlan {
    /// Which compute node owns each record's shard.
    pub route: crate::routing::SharedRoute,
    /// This compute node's inbox.
    pub inbox: Arc<Inbox>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_round_trip_and_a_stopped_inbox_answers_at_once() {
        for o in [Outcome::Done, Outcome::Stopped, Outcome::Failed] {
            assert_eq!(Outcome::from_byte(o as u8), Ok(o));
        }
        assert!(Outcome::from_byte(0).is_err());
        let inbox = Inbox::default();
        let reply = Arc::new(Mutex::new(None));
        inbox.push(Forwarded {
            input: b"{}".to_vec(),
            arrived: quanta::Instant::now(),
            reply: reply.clone(),
        });
        inbox.stop();
        assert_eq!(*reply.lock().unwrap(), Some(Outcome::Stopped));
        assert!(inbox.pop().is_none());
    }
}
