//! Lotus's lock tables across compute-node processes (`txn-bench --cnodes N --protocol
//! lotus`): each `cnode` embeds a lock service ([`lockd::embed::LockService`]) serving
//! its share of the 4096 shards (Lotus 4.1 and 4.2: lock tables on the compute nodes,
//! sharded uniformly at start), publishes its control-plane address in the run's etcd,
//! and waits for every other compute node's before its coordinators start; they then
//! lock their own shards with a CPU CAS and the others' with batched RPCs.
//!
//! The service answers lock RPCs on a server thread of its own (the paper serves them on
//! the coordinator threads; rrpc's server runs its handlers on server threads), which on
//! a machine with few cores competes with the coordinators: say so when comparing.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockd::embed::{LockService, LockServiceConfig};
use lockd::shard::ShardMap;
use rrpc::fabric::Fabric;
use txn::lotus::{LockKeyFn, LotusSite};

/// How long a compute node waits for the others' lock services to be published.
const PEERS_WAIT: Duration = Duration::from_secs(60);

/// Longest sleep of the idle lock-service thread, microseconds. Its thread competes
/// with the coordinators for few cores; sleeping gives the core back. Measured on 2
/// cores (pairs, Zipf 0.99, 3 compute nodes x 1 thread x 8 coroutines, 3 s): 0 (spin and
/// yield) 1653 txn/s, 20 us 2306, 100 us 3585.
const SERVER_IDLE_SLEEP_US: u64 = 100;

/// Bytes of a compute node's Lotus lock table (Lotus 7.1: 32 MB, 4 M slots).
pub(crate) const TABLE_SLOTS: u64 = 4 << 20;

/// The etcd key under which compute node `node` publishes its lock service's address.
fn addr_key(node: u32) -> String {
    format!("lotus-locks/{node}")
}

/// The IP this host uses to reach `peer` (no packet is sent: a UDP socket's
/// `connect` only picks the route).
///
/// Errors: no route to `peer`.
fn local_ip_towards(peer: SocketAddr) -> anyhow::Result<IpAddr> {
    let unspecified: SocketAddr = if peer.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let s = UdpSocket::bind(unspecified).context("binding a UDP socket to find the local IP")?;
    s.connect(peer)
        .with_context(|| format!("no route to {peer}"))?;
    Ok(s.local_addr()?.ip())
}

/// A compute node's lock service and the site its coordinators lock through.
pub(crate) struct LotusCn {
    /// Kept alive while the coordinators run.
    pub(crate) _service: LockService,
    pub(crate) site: LotusSite,
}

/// Start compute node `node`'s lock service (its shards of a uniform map over `nodes`),
/// publish its address through `me`, and wait for every other node's.
///
/// Errors: the service does not start, etcd fails, a peer does not publish within
/// [`PEERS_WAIT`].
pub(crate) fn start(
    fabric: Fabric,
    me: &member::Member,
    node: u32,
    nodes: &[u32],
    towards: SocketAddr,
    lock_key: LockKeyFn,
) -> anyhow::Result<LotusCn> {
    let map = ShardMap::uniform(nodes).context("the compute nodes' shard map")?;
    if !nodes.contains(&node) {
        bail!("compute node {node} is not among {nodes:?}");
    }
    // The node's share of the map, exactly as the map has it (a contiguous range).
    let mine = map.shards_of(node);
    let (Some(&lo), Some(&hi)) = (mine.first(), mine.last()) else {
        bail!("compute node {node} owns no shard of the map");
    };
    debug_assert_eq!(mine.len(), usize::from(hi - lo) + 1);
    let cfg = LockServiceConfig {
        // The Takeout table is unused here: the smallest one.
        locks: 1,
        lock_table_slots: TABLE_SLOTS,
        shards: format!("{lo}-{hi}"),
        map_version: map.version(),
        // Served by the embedding process's incarnation (a restarted node refuses
        // operations of its predecessor's clients).
        epoch: Some(fabric.incarnation().max(1)),
        restart_grace_ms: 0,
        idle_sleep_us: SERVER_IDLE_SLEEP_US,
        ..LockServiceConfig::default()
    };
    let listen = SocketAddr::new(local_ip_towards(towards)?, 0);
    let service = LockService::start(fabric, listen, &cfg)
        .with_context(|| format!("starting compute node {node}'s lock service"))?;
    me.put_durable(&addr_key(node), service.addr().to_string())
        .context("publishing the lock service's address")?;
    let deadline = Instant::now() + PEERS_WAIT;
    let mut peers = Vec::new();
    for &n in nodes.iter().filter(|&&n| n != node) {
        let addr = loop {
            if let Some(v) = me.get(&addr_key(n))? {
                let s = String::from_utf8(v).context("a published lock service address")?;
                break s
                    .parse::<SocketAddr>()
                    .with_context(|| format!("compute node {n}'s lock service address {s:?}"))?;
            }
            if Instant::now() >= deadline {
                bail!("compute node {n} did not publish its lock service within {PEERS_WAIT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        peers.push(addr);
    }
    let site = LotusSite {
        node,
        local: Some(service.lotus().clone()),
        map,
        lock_key,
        client: Default::default(),
        peers,
        // No version table cache across processes yet: the embedded service has no
        // grant hook to invalidate it by.
        cache: None,
    };
    Ok(LotusCn {
        _service: service,
        site,
    })
}
