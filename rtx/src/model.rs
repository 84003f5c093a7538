//! A stateless model checker for the protocol: actors (owners, repairers, later rTXs) run
//! the real protocol code over an in-memory region whose every one-sided operation is a
//! scheduling point; the explorer replays every schedule with at most `bound` preemptions
//! (switching away from an actor that could go on), depth first, and checks an invariant
//! at the end of each. Each one-sided operation is atomic here, including multi-word
//! READs (on RDMA only 8-byte words are; the log's crc covers torn entry reads).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use crate::mem::{LocalMem, Mem, MemError};

/// The scheduler's shared state: who may run its next operation, who is waiting.
#[derive(Debug, Default)]
pub(crate) struct Sched {
    granted: Cell<Option<usize>>,
    waiting: RefCell<Vec<bool>>,
}

/// Actor `actor`'s view of the region: each operation waits for the scheduler's grant.
#[derive(Clone, Debug)]
pub(crate) struct Gated {
    pub(crate) mem: LocalMem,
    sched: Rc<Sched>,
    actor: usize,
}

impl Gated {
    pub(crate) fn new(mem: LocalMem, sched: &Rc<Sched>, actor: usize) -> Self {
        Self {
            mem,
            sched: sched.clone(),
            actor,
        }
    }

    fn gate(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |_| {
            if self.sched.granted.get() == Some(self.actor) {
                self.sched.granted.set(None);
                self.sched.waiting.borrow_mut()[self.actor] = false;
                Poll::Ready(())
            } else {
                self.sched.waiting.borrow_mut()[self.actor] = true;
                Poll::Pending
            }
        })
    }
}

impl Mem for Gated {
    async fn read(&self, off: u64, len: usize) -> Result<Vec<u8>, MemError> {
        self.gate().await;
        self.mem.read_now(off, len)
    }
    async fn write(&self, off: u64, data: &[u8]) -> Result<(), MemError> {
        self.gate().await;
        self.mem.write_now(off, data)
    }
    async fn cas(&self, off: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        self.gate().await;
        self.mem.cas_now(off, expected, new)
    }
}

/// An actor: the protocol code one client runs.
pub(crate) type Actor = Pin<Box<dyn Future<Output = ()>>>;
/// The end-of-run invariant; `Err` describes the violation.
pub(crate) type Check = Box<dyn FnOnce() -> Result<(), String>>;

/// Builds one run's actors (each given its actor index) and invariant, from scratch.
pub(crate) trait Model {
    fn build(&self, sched: &Rc<Sched>) -> (Vec<Actor>, Check);
}

impl<F: Fn(&Rc<Sched>) -> (Vec<Actor>, Check)> Model for F {
    fn build(&self, sched: &Rc<Sched>) -> (Vec<Actor>, Check) {
        self(sched)
    }
}

struct Step {
    runnable: Vec<usize>,
    chosen: usize,
    current: Option<usize>,
    preemptions_before: usize,
}

const MAX_STEPS: usize = 10_000;

fn run_once(model: &dyn Model, prefix: &[usize]) -> (Vec<Step>, Result<(), String>) {
    let sched = Rc::new(Sched::default());
    let (actors, check) = model.build(&sched);
    *sched.waiting.borrow_mut() = vec![false; actors.len()];
    let mut live: Vec<Option<Actor>> = actors.into_iter().map(Some).collect();
    let mut cx = Context::from_waker(Waker::noop());
    for a in live.iter_mut() {
        if a.as_mut().expect("live").as_mut().poll(&mut cx).is_ready() {
            *a = None;
        }
    }
    let mut trace = Vec::new();
    let (mut current, mut pre) = (None, 0);
    loop {
        let waiting = sched.waiting.borrow().clone();
        let runnable: Vec<usize> = (0..live.len())
            .filter(|&i| live[i].is_some() && waiting[i])
            .collect();
        if runnable.is_empty() {
            assert!(
                live.iter().all(Option::is_none),
                "an actor waits on something other than memory"
            );
            break;
        }
        assert!(
            trace.len() < MAX_STEPS,
            "no end after {MAX_STEPS} operations"
        );
        let chosen = match prefix.get(trace.len()) {
            Some(&c) => c,
            None => current
                .filter(|c| runnable.contains(c))
                .unwrap_or(runnable[0]),
        };
        assert!(runnable.contains(&chosen), "replay diverged");
        trace.push(Step {
            runnable: runnable.clone(),
            chosen,
            current,
            preemptions_before: pre,
        });
        if current.is_some_and(|c| c != chosen && runnable.contains(&c)) {
            pre += 1;
        }
        sched.granted.set(Some(chosen));
        let a = live[chosen].as_mut().expect("runnable actors are live");
        if a.as_mut().poll(&mut cx).is_ready() {
            live[chosen] = None;
        }
        assert_eq!(
            sched.granted.get(),
            None,
            "actor {chosen} did not take its grant"
        );
        current = Some(chosen);
    }
    (trace, check())
}

/// A violation found: the schedule (actor per operation) and what broke.
#[derive(Debug)]
pub(crate) struct Violation {
    pub(crate) schedule: Vec<usize>,
    pub(crate) what: String,
}

/// Explore every schedule with at most `bound` preemptions. Returns the number of runs,
/// or the first violation.
pub(crate) fn explore(model: &dyn Model, bound: usize) -> Result<usize, Violation> {
    let mut stack: Vec<Vec<usize>> = vec![Vec::new()];
    let mut runs = 0;
    while let Some(prefix) = stack.pop() {
        let (trace, res) = run_once(model, &prefix);
        runs += 1;
        let choices: Vec<usize> = trace.iter().map(|s| s.chosen).collect();
        if let Err(what) = res {
            return Err(Violation {
                schedule: choices,
                what,
            });
        }
        for i in prefix.len()..trace.len() {
            let s = &trace[i];
            for &alt in &s.runnable {
                if alt == s.chosen {
                    continue;
                }
                let cost = usize::from(
                    s.current
                        .is_some_and(|c| c != alt && s.runnable.contains(&c)),
                );
                if s.preemptions_before + cost <= bound {
                    let mut p = choices[..i].to_vec();
                    p.push(alt);
                    stack.push(p);
                }
            }
        }
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The explorer itself must find a classic lost update (read, then blind write).
    #[test]
    fn explorer_finds_a_lost_update() {
        let model = |sched: &Rc<Sched>| -> (Vec<Actor>, Check) {
            let mem = LocalMem::new(8);
            let actors: Vec<Actor> = (0..2)
                .map(|i| {
                    let g = Gated::new(mem.clone(), sched, i);
                    Box::pin(async move {
                        let v = g.read_u64(0).await.unwrap();
                        g.write(0, &(v + 1).to_le_bytes()).await.unwrap();
                    }) as Actor
                })
                .collect();
            let check: Check = Box::new(move || match mem.word(0) {
                2 => Ok(()),
                v => Err(format!("counter {v}")),
            });
            (actors, check)
        };
        let v = explore(&model, 1).expect_err("lost update");
        assert_eq!(v.what, "counter 1");
        // With CAS retries instead it holds.
        let model = |sched: &Rc<Sched>| -> (Vec<Actor>, Check) {
            let mem = LocalMem::new(8);
            let actors: Vec<Actor> = (0..2)
                .map(|i| {
                    let g = Gated::new(mem.clone(), sched, i);
                    Box::pin(async move {
                        loop {
                            let v = g.read_u64(0).await.unwrap();
                            if g.cas(0, v, v + 1).await.unwrap() == v {
                                break;
                            }
                        }
                    }) as Actor
                })
                .collect();
            let check: Check = Box::new(move || match mem.word(0) {
                2 => Ok(()),
                v => Err(format!("counter {v}")),
            });
            (actors, check)
        };
        assert!(explore(&model, 2).unwrap() > 3);
    }
}
