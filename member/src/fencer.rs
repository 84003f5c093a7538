//! Fencing on failure events (FaRM's rule: when an incarnation's lease expires, every peer
//! cuts it off before recovery starts). A service that owns memory compute nodes write
//! with one-sided operations runs [`spawn_fencer`]: on each [`Event::Down`] of a compute
//! node it fences that incarnation (its callback moves the incarnation's queue pairs to
//! the error state) and then acknowledges under `kv/fenced/<node>/<incarnation>/<by>`. The
//! recoverer waits for every such service's acknowledgement ([`wait_fenced`]) before it
//! touches the dead incarnation's data, so that a paused process that wakes up finds its
//! late WRITEs and CASes failing rather than landing after recovery.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{Event, Member, MemberError, MemberInfo, Role};

fn fenced_key(node: u16, incarnation: u64, by: u16) -> String {
    format!("fenced/{node}/{incarnation}/{by}")
}

/// Watch `member`'s cluster and, for every compute node ([`Role::Cnode`]) that goes
/// down, call `fence` with its record and then acknowledge it (see the module docs).
/// Runs until the member's event stream ends (the member dropped).
///
/// # Errors
/// Opening the event stream failed ([`Member::events`]).
pub fn spawn_fencer(
    member: Arc<Member>,
    fence: impl Fn(&MemberInfo) + Send + 'static,
) -> Result<JoinHandle<()>, MemberError> {
    let events = member.events()?;
    let by = member.node();
    std::thread::Builder::new()
        .name("fencer".into())
        .spawn(move || {
            for ev in events {
                let Event::Down(info) = ev else { continue };
                if info.role != Role::Cnode {
                    continue;
                }
                fence(&info);
                tracing::info!(
                    node = info.node,
                    incarnation = info.incarnation,
                    "fenced a dead compute node"
                );
                if let Err(e) = member.put_durable(&fenced_key(info.node, info.incarnation, by), "")
                {
                    eprintln!(
                        "fencer: acknowledging the fence of node {} incarnation {}: {e}",
                        info.node, info.incarnation
                    );
                }
            }
        })
        .map_err(MemberError::Runtime)
}

/// Wait up to `timeout` until every node in `by` acknowledged fencing `node`'s
/// `incarnation`; returns the nodes that did not (empty: all fenced).
///
/// # Errors
/// [`MemberError::Etcd`], [`MemberError::Timeout`] from reading the acknowledgements.
pub fn wait_fenced(
    member: &Member,
    node: u16,
    incarnation: u64,
    by: &[u16],
    timeout: Duration,
) -> Result<Vec<u16>, MemberError> {
    let t0 = Instant::now();
    let mut missing: Vec<u16> = by.to_vec();
    loop {
        let mut still = Vec::new();
        for &b in &missing {
            if member.get(&fenced_key(node, incarnation, b))?.is_none() {
                still.push(b);
            }
        }
        missing = still;
        if missing.is_empty() || t0.elapsed() >= timeout {
            return Ok(missing);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// What a service that owns memory does at start: join `cluster` at `endpoints` as
/// `role` node `node` with a 1 s lease and fence every compute node that goes down
/// ([`spawn_fencer`] with `fence`). Keep the member: dropping it ends the membership
/// (its lease expires).
///
/// # Errors
/// [`Member::join`]'s, and [`spawn_fencer`]'s.
pub fn join_and_fence(
    endpoints: &[String],
    cluster: &str,
    role: Role,
    node: u16,
    fence: impl Fn(&MemberInfo) + Send + 'static,
) -> Result<Arc<Member>, MemberError> {
    let me = Arc::new(Member::join(
        endpoints,
        cluster,
        role,
        node,
        Duration::from_secs(1),
    )?);
    spawn_fencer(me.clone(), fence)?;
    Ok(me)
}
