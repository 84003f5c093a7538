//! `txn-bench --protocol lotus --cnodes N --reshard-after S`: a resharding move of Lotus
//! 4.3 forced mid-run (the spec's A.9 test 10), driven by txn-bench over the compute
//! nodes' lock services as their resharding loop would drive a decided move
//! ([`lockd::table_service::run_move`]): the source drains the range (new locks on it
//! are refused as `shard-moving`, and the move waits until none is held), then the next
//! map is installed at the destination, the source and the others. The source's version
//! table cache drops the range's entries as the map takes it away
//! ([`lockd::table_service::TableService::set_lost_range_hook`]). Coordinators that
//! still route by the old map are answered `WrongShard` and fetch the new one.
//! `--reshard-back-after S` later moves the same range back from the destination to the
//! source: the source's cache then serves that range again, so an entry it kept across
//! the move (the planted `--plant skip-cache-clear`) would be stale by every write the
//! other node granted meanwhile.
//!
//! A drain that does not end within [`DRAIN_TIMEOUT`] (a lock held across it) is
//! cancelled, as the project's resharding does instead of aborting the holders, and the
//! move is tried again after [`RETRY_GAP`], up to [`ATTEMPTS`] times.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockd::shard::{Move, MoveState};
use rrpc::fabric::Fabric;
use rrpc::runtime::{block_on, ThreadCtx};

/// How long a move waits for the range's locks to be released before it is cancelled
/// (Lotus 4.3's drain wait, 10 ms).
pub const DRAIN_TIMEOUT: Duration = Duration::from_millis(10);

/// How often the drain asks the source how many locks are still held on the range.
pub const DRAIN_POLL: Duration = Duration::from_micros(200);

/// Tries of a cancelled move.
pub const ATTEMPTS: u32 = 20;

/// Gap between two tries of a cancelled move.
pub const RETRY_GAP: Duration = Duration::from_millis(50);

/// A forced move, as the report gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct Resharded {
    /// The compute node the range left.
    pub from: u32,
    /// The compute node it went to.
    pub to: u32,
    /// The shards moved.
    pub range: std::ops::Range<u16>,
    /// Tries, the last one published (earlier ones cancelled).
    pub attempts: u32,
    /// The pause of the published try: from the drain's start to the last map
    /// installed, ms (locks on the range are refused meanwhile).
    pub pause_ms: f64,
    /// The map version published.
    pub version: u64,
}

impl Resharded {
    /// `reshard: shards A..B of compute node X moved to compute node Y ...`.
    pub fn line(&self) -> String {
        format!(
            "reshard: shards {}..{} of compute node {} moved to compute node {}: pause {:.2} ms \
             (drain and map installs; try {} of {}; map version {})",
            self.range.start,
            self.range.end,
            self.from,
            self.to,
            self.pause_ms,
            self.attempts,
            ATTEMPTS,
            self.version
        )
    }
}

/// Move `range` of compute node `from`'s shards (`None`: the first half of them) to
/// `to`, every node of `nodes` reached at its lock service's address in `addrs` (the
/// same order). Runs on a thread context of its own over `fabric`.
///
/// Errors: a node unreachable or refusing a control request; without `range`, `from`
/// owns fewer than two shards; with it, `range` is empty or `from` does not own all of
/// it; every try cancelled.
pub fn force_move(
    fabric: &Fabric,
    nodes: &[u32],
    addrs: &[SocketAddr],
    from: u32,
    to: u32,
    range: Option<std::ops::Range<u16>>,
) -> anyhow::Result<Resharded> {
    let ctx = ThreadCtx::new(fabric.clone(), crate::run_runtime::get())
        .context("resharding: a thread context")?;
    for a in addrs {
        ctx.connect_rpc(*a)
            .with_context(|| format!("resharding: connecting to the lock service at {a}"))?;
    }
    let others: Vec<u32> = nodes
        .iter()
        .copied()
        .filter(|&n| n != from && n != to)
        .collect();
    for attempt in 1..=ATTEMPTS {
        let (c, others, asked) = (ctx.clone(), others.clone(), range.clone());
        let r = block_on(&ctx, async move {
            let map = lockd::table_service::fetch_map(&c, from).await?;
            let mine = map.shards_of(from);
            let range = match asked {
                Some(r) => {
                    if r.is_empty() || !r.clone().all(|s| mine.binary_search(&s).is_ok()) {
                        return Ok::<_, anyhow::Error>(Err(format!(
                            "compute node {from} does not own every shard of {}..{}",
                            r.start, r.end
                        )));
                    }
                    r
                }
                None => {
                    if mine.len() < 2 {
                        return Ok(Err(format!(
                            "compute node {from} owns {} shard(s): nothing to split",
                            mine.len()
                        )));
                    }
                    let lo = mine[0];
                    lo..lo + (mine.len() / 2) as u16
                }
            };
            let t0 = Instant::now();
            let mut mv = Move::new(from, to, range.clone(), map.version(), t0);
            let state =
                lockd::table_service::run_move(&c, &mut mv, &others, DRAIN_POLL, DRAIN_TIMEOUT)
                    .await?;
            let pause = t0.elapsed();
            Ok(Ok((state, range, pause)))
        })?;
        match r {
            Err(why) => bail!("resharding: {why}"),
            Ok((MoveState::Published { version }, range, pause)) => {
                return Ok(Resharded {
                    from,
                    to,
                    range,
                    attempts: attempt,
                    pause_ms: pause.as_secs_f64() * 1e3,
                    version,
                })
            }
            Ok(_) => std::thread::sleep(RETRY_GAP),
        }
    }
    bail!(
        "resharding: every one of {ATTEMPTS} tries was cancelled (a lock on the range held past \
         {DRAIN_TIMEOUT:?} each time)"
    )
}

/// `--reshard-loop`: Lotus 4.3's periodic resharding loop ([`lockd::reshard::run_loop`]:
/// every 100 ms each compute node's load sample; a node whose lock latency stays above
/// 1.5x the average for three intervals passes a range around its hottest shard to the
/// coolest node) over the compute nodes' lock services, on a thread of its own for the
/// whole run. Its moves come back through [`Self::moves`].
pub struct LoopThread {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    moves: std::sync::mpsc::Receiver<lockd::reshard::MoveReport>,
    handle: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl LoopThread {
    /// Start the loop over the lock services of `nodes` at `addrs` (the same order), on
    /// a thread context of its own over `fabric`.
    ///
    /// Errors: the thread cannot be started. A lock service it cannot reach ends the
    /// loop with that error, returned by [`Self::stop`].
    pub fn start(fabric: &Fabric, nodes: &[u32], addrs: &[SocketAddr]) -> anyhow::Result<Self> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (tx, moves) = std::sync::mpsc::channel();
        let (fabric, addrs, flag) = (fabric.clone(), addrs.to_vec(), stop.clone());
        let ids: Vec<rrpc::NodeId> = nodes.iter().map(|&n| rrpc::NodeId(n)).collect();
        let handle = std::thread::Builder::new()
            .name("reshard-loop".into())
            .spawn(move || -> anyhow::Result<()> {
                let ctx = ThreadCtx::new(fabric, crate::run_runtime::get())
                    .context("resharding loop: a thread context")?;
                for a in &addrs {
                    ctx.connect_rpc(*a).with_context(|| {
                        format!("resharding loop: connecting to the lock service at {a}")
                    })?;
                }
                let c = ctx.clone();
                block_on(&ctx, async move {
                    let stop = || flag.load(Ordering::Relaxed);
                    let mut on_move = |m: &lockd::reshard::MoveReport| {
                        let _ = tx.send(m.clone());
                    };
                    lockd::reshard::run_loop(
                        &c,
                        &ids,
                        lockd::reshard::LoopConfig::default(),
                        &stop,
                        &mut on_move,
                    )
                    .await
                })
                .context("resharding loop: a move failed midway")
            })
            .context("starting the resharding loop's thread")?;
        Ok(Self {
            stop,
            moves,
            handle: Some(handle),
        })
    }

    /// The moves decided and driven since the last call.
    pub fn moves(&self) -> Vec<lockd::reshard::MoveReport> {
        self.moves.try_iter().collect()
    }

    /// Stop the loop at its next interval's end and wait for it; returns the moves not
    /// yet taken. Errors: the loop failed (a lock service unreachable, a move that
    /// failed midway) or its thread panicked.
    pub fn stop(mut self) -> anyhow::Result<Vec<lockd::reshard::MoveReport>> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            match h.join() {
                Ok(r) => r?,
                Err(_) => bail!("the resharding loop's thread panicked"),
            }
        }
        Ok(self.moves())
    }
}

impl Drop for LoopThread {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One move of the loop as an event line: `reshard loop: shards A..B of compute node X
/// moved to compute node Y` (or `... cancelled: a lock held past the drain wait`).
pub fn loop_line(m: &lockd::reshard::MoveReport) -> String {
    let what = match m.state {
        MoveState::Published { version } => format!("moved (map version {version})"),
        _ => "cancelled (a lock on the range held past the drain wait)".to_string(),
    };
    format!(
        "reshard loop: shards {}..{} of compute node {} to compute node {}: {what}",
        m.range.start, m.range.end, m.from, m.to
    )
}
