//! The credit queue: calls that found their request ring full (or others already
//! waiting) wait here and push first come, first served. Plain state, no I/O: the call
//! path asks for its turn, the polling round wakes the queue when credit returns.

use std::task::Waker;

/// A first-come, first-served queue of coroutines waiting for ring credit.
#[derive(Default)]
pub(super) struct TicketQueue {
    /// The next ticket to hand out.
    next: u64,
    /// The ticket allowed to push now.
    head: u64,
    /// Wakers of the waiting tickets, and tickets whose calls gave up (skipped).
    waiting: std::collections::BTreeMap<u64, Option<Waker>>,
}

impl TicketQueue {
    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
    pub(super) fn take(&mut self, w: &Waker) -> u64 {
        let t = self.next;
        self.next += 1;
        self.waiting.insert(t, Some(w.clone()));
        t
    }
    pub(super) fn wait(&mut self, t: u64, w: &Waker) {
        if let Some(slot) = self.waiting.get_mut(&t) {
            *slot = Some(w.clone());
        }
    }
    /// Ticket `t` is done (pushed, or gave up): the head moves past finished tickets,
    /// and a new head is woken to try (the ring may have room left).
    pub(super) fn done(&mut self, t: u64) {
        self.waiting.remove(&t);
        let old = self.head;
        while self.head < self.next && !self.waiting.contains_key(&self.head) {
            self.head += 1;
        }
        if self.head != old {
            if let Some(Some(w)) = self.waiting.get_mut(&self.head).map(Option::take) {
                w.wake();
            }
        }
    }
    /// Wake every waiter, in ticket order (the executor polls them in that order).
    pub(super) fn wake_all(&mut self) {
        for w in self.waiting.values_mut() {
            if let Some(w) = w.take() {
                w.wake();
            }
        }
    }

    /// The call holding `*ticket` (`None`: no ticket yet) asks to push now: true if it
    /// may (no one is waiting, or its ticket is the head). A call arriving while others
    /// wait takes a ticket; a call that must wait has `w` registered to be woken when its
    /// turn comes.
    pub(super) fn my_turn(&mut self, ticket: &mut Option<u64>, w: &Waker) -> bool {
        if ticket.is_none() && !self.is_empty() {
            *ticket = Some(self.take(w));
        }
        match *ticket {
            Some(t) if t != self.head => {
                self.wait(t, w);
                false
            }
            _ => true,
        }
    }

    /// The call holding `*ticket` pushed or gave up: its ticket, if any, is done.
    pub(super) fn leave(&mut self, ticket: &mut Option<u64>) {
        if let Some(t) = ticket.take() {
            self.done(t);
        }
    }

    /// The call holding `*ticket` found the ring full: wait for credit with a ticket.
    pub(super) fn wait_for_credit(&mut self, ticket: &mut Option<u64>, w: &Waker) {
        match *ticket {
            Some(t) => self.wait(t, w),
            None => *ticket = Some(self.take(w)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TicketQueue;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn credit_queue_serves_in_order_and_skips_calls_that_gave_up() {
        let mut q = TicketQueue::default();
        let c: Vec<Arc<Count>> = (0..3)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        let w: Vec<Waker> = c.iter().map(|c| Waker::from(c.clone())).collect();
        let t: Vec<u64> = w.iter().map(|w| q.take(w)).collect();
        assert_eq!(q.head, t[0]);
        // The second gives up first: the head stays on the first.
        q.done(t[1]);
        assert_eq!(q.head, t[0]);
        // The first pushes: the head skips the second and wakes the third.
        q.done(t[0]);
        assert_eq!(q.head, t[2]);
        assert_eq!(c[2].0.load(Ordering::Relaxed), 1);
        q.done(t[2]);
        assert!(q.is_empty());
        // An empty queue hands the next ticket the head at once.
        let t3 = q.take(&w[0]);
        assert_eq!(q.head, t3);
        q.wait(t3, &w[1]);
        q.wake_all();
        assert_eq!(c[1].0.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_call_waits_its_turn_and_gives_it_back() {
        let mut q = TicketQueue::default();
        let c: Vec<Arc<Count>> = (0..2)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        let w: Vec<Waker> = c.iter().map(|c| Waker::from(c.clone())).collect();
        // Nobody waits: the call goes at once, without a ticket.
        let (mut a, mut b) = (None, None);
        assert!(q.my_turn(&mut a, &w[0]));
        assert_eq!(a, None);
        // The ring is full: `a` waits for credit with a ticket (the head).
        q.wait_for_credit(&mut a, &w[0]);
        assert!(a.is_some());
        // `b` arrives meanwhile: it takes the next ticket and waits behind `a`.
        assert!(!q.my_turn(&mut b, &w[1]));
        assert!(b.is_some());
        assert!(q.my_turn(&mut a, &w[0]), "the head may push");
        // `a` pushes: `b` becomes the head and is woken.
        q.leave(&mut a);
        assert_eq!(a, None);
        assert_eq!(c[1].0.load(Ordering::Relaxed), 1);
        assert!(q.my_turn(&mut b, &w[1]));
        q.leave(&mut b);
        assert!(q.is_empty());
        q.leave(&mut b);
        assert!(q.is_empty(), "leaving without a ticket is a no-op");
    }
}
