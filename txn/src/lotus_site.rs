//! Where a compute node's Lotus coordinators take their locks ([`LotusSite`]): its own
//! lock table, the shard map, the lock key of each record (Lotus 4.1 and 4.2) and its
//! version table cache (4.4). Kept apart from the protocol ([`crate::lotus`]) so that the
//! settings ([`crate::config::TxnConfig::lotus`]) can name it without importing the
//! protocol.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use lockd::shard::{LockKey, ShardMap, REST_BITS};
use lockd::table_service::{TableClientConfig, TableService};

use crate::lotus_peers::LotusPeers;
use crate::vt_cache::VtCache;

/// The lock key of a record: `(table, key) -> LockKey`, the record's critical field in
/// the shard bits (Lotus 4.2). A workload supplies its own (TPC-C's warehouse, TATP's
/// subscriber, SmallBank's account); [`hashed_lock_key`] is the default. `None` declares
/// the record static: never written at run time, so read without a lock even under SR
/// (TPC-C's ITEM); a write to it is refused ([`crate::error::TxnError::Usage`]).
pub type LockKeyFn = Arc<dyn Fn(u32, u64) -> Option<LockKey> + Send + Sync>;

/// Where a compute node's Lotus coordinators take their locks (one per process, cloned
/// into every thread's [`crate::config::TxnConfig`]).
#[derive(Clone)]
pub struct LotusSite {
    /// This compute node's id: the holder node of every lock its transactions take
    /// (Lotus 4.1; the lock tables release a dead node's locks by it, 6).
    pub node: u32,
    /// This node's own lock table, reached without RPC; `None` when the node serves no
    /// shard.
    pub local: Option<Arc<TableService>>,
    /// Which node serves each shard (every node in it other than [`Self::node`] must be
    /// connected on the thread's context).
    pub map: ShardMap,
    /// The lock key of each record.
    pub lock_key: LockKeyFn,
    /// Retry policy of the lock-table client.
    pub client: TableClientConfig,
    /// The control-plane addresses of the other nodes' lock services: each thread's
    /// client connects to them ([`rrpc::runtime::ThreadCtx::connect_rpc`]).
    pub peers: Vec<std::net::SocketAddr>,
    /// This compute node's version table cache (Lotus 4.4, [`crate::vt_cache`]), shared
    /// by its threads; `None` turns it off. Its grant hook must be installed on
    /// [`Self::local`] ([`VtCache::grant_hook`]), as [`Self::single_cached`] does; the
    /// cache serves only keys of this node's own shards.
    pub cache: Option<Arc<VtCache>>,
    /// Which compute nodes are down, shared by this process's threads (Lotus 6,
    /// [`crate::lotus_peers`]): each attempt registers there, and each thread's client
    /// follows its changes as an attempt begins.
    pub peer_states: Arc<LotusPeers>,
}

impl fmt::Debug for LotusSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LotusSite")
            .field("node", &self.node)
            .field("local", &self.local.is_some())
            .field("map_version", &self.map.version())
            .field("peers", &self.peers)
            .field("cache", &self.cache)
            .field("peer_states", &self.peer_states)
            .finish_non_exhaustive()
    }
}

impl LotusSite {
    /// A site whose one node `node` serves every shard from a lock table of
    /// `table_bytes` bytes (8-byte slots; Lotus 8.1 uses 32 MB per node) in this process,
    /// with [`hashed_lock_key`]: every lock a CPU CAS. With a version table cache of
    /// [`crate::vt_cache::DEFAULT_ENTRIES`] entries (Lotus 8.1's 64 K).
    pub fn single(node: u32, table_bytes: usize) -> Self {
        Self::single_cached(node, table_bytes, crate::vt_cache::DEFAULT_ENTRIES)
    }

    /// [`Self::single`] with a version table cache of `vtc_entries` entries (0: none),
    /// its grant hook installed on the lock table (Lotus 4.4).
    pub fn single_cached(node: u32, table_bytes: usize, vtc_entries: usize) -> Self {
        let map = ShardMap::uniform(&[node]).expect("one node is a valid map");
        let table = Arc::new(lockd::lock_table::LockTable::with_bytes(table_bytes));
        let mut svc = TableService::new(table, lockd::shard::Ownership::new(node, map.clone()));
        let cache = (vtc_entries > 0).then(|| Arc::new(VtCache::new(vtc_entries)));
        if let Some(c) = &cache {
            svc = svc.with_grant_hook(c.grant_hook());
        }
        Self {
            node,
            local: Some(Arc::new(svc)),
            map,
            lock_key: Arc::new(|t, k| Some(hashed_lock_key(t, k))),
            client: TableClientConfig::default(),
            peers: Vec::new(),
            cache,
            peer_states: Arc::default(),
        }
    }

    /// This site with `f` as the lock-key function.
    pub fn with_lock_key(mut self, f: LockKeyFn) -> Self {
        self.lock_key = f;
        self
    }
}

/// A key's `rest` field of a [`LockKey`] (44 bits): the key itself when it fits, else a
/// hash of it (two keys of one table and shard that hash alike share a lock: a false
/// conflict, never a missed one).
pub fn rest_of(key: u64) -> u64 {
    if key >> REST_BITS == 0 {
        key
    } else {
        mix(key) & ((1 << REST_BITS) - 1)
    }
}

/// Random sharding (Lotus 4.2: "if not specified, data is sharded randomly"): the shard
/// from a hash of `(table, key)`, `rest` from the key ([`rest_of`]).
pub fn hashed_lock_key(table: u32, key: u64) -> LockKey {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (table, key).hash(&mut h);
    LockKey::compose(table as u8, h.finish(), rest_of(key)).expect("rest fits by construction")
}

/// The lock key of a record whose critical field (warehouse, subscriber, account) is
/// `critical`: its shard is `critical`'s low 12 bits, so that one entity's records share
/// a shard (Lotus 4.2).
pub fn critical_lock_key(table: u32, critical: u64, key: u64) -> LockKey {
    LockKey::compose(table as u8, mix(critical), rest_of(key)).expect("rest fits by construction")
}

/// A 64-bit mixer (splitmix64's finalizer): spreads consecutive ids over the shards.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_shard_by_the_critical_field() {
        // One account's rows share a shard; rest keeps the key.
        let a = critical_lock_key(0, 42, 42);
        let b = critical_lock_key(1, 42, 42);
        assert_eq!(a.shard(), b.shard());
        assert_ne!(a, b);
        assert_eq!(a.rest(), 42);
        // Wide keys are hashed into 44 bits.
        let w = hashed_lock_key(3, u64::MAX - 5);
        assert!(w.rest() < 1 << REST_BITS);
        assert_eq!(w.table(), 3);
    }

    #[test]
    fn consecutive_ids_spread_over_shards() {
        let shards: std::collections::HashSet<u16> = (0..1000)
            .map(|k| critical_lock_key(0, k, k).shard())
            .collect();
        assert!(shards.len() > 700, "{} shards", shards.len());
    }
}
