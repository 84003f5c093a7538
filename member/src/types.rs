//! Roles, member records, events and the key layout.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::MemberError;

/// What a member process is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// A compute node (coordinators).
    Cnode,
    /// A memory node (data in registered memory).
    Memnode,
    /// A lock service.
    Lockd,
    /// A timestamp oracle or proxy.
    Tso,
    /// Anything else, by name.
    Other(String),
}

/// What [`crate::Member::leave`] records as its own incarnation's recovery summary
/// ([`crate::Member::recovered`] returns it for a life that left cleanly).
pub const CLEAN_LEAVE: &str = "clean leave";

/// One incarnation of one node: the JSON value of its member key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemberInfo {
    /// What it is.
    pub role: Role,
    /// Its node id.
    pub node: u16,
    /// Its incarnation (1, 2, ... for each join of `node`).
    pub incarnation: u64,
    /// Its process id (on its host).
    pub pid: u32,
    /// The etcd lease its member key is attached to.
    pub lease: i64,
}

/// A membership change, as etcd decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A member key appeared: that incarnation joined.
    Up(MemberInfo),
    /// A member key disappeared: its lease expired or was revoked (a failure), or it left.
    Down(MemberInfo),
}

/// The claimant recorded in a recovery claim.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // Used by the etcd implementation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Claimant {
    pub node: u16,
    pub incarnation: u64,
}

/// The key layout under `/<cluster>/` (see the crate docs).
#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // Used by the etcd implementation.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    root: String,
}

#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // Used by the etcd implementation.
impl Keys {
    pub(crate) fn new(cluster: &str) -> Result<Self, MemberError> {
        if cluster.is_empty() || cluster.contains('/') {
            return Err(MemberError::InvalidCluster(cluster.to_string()));
        }
        Ok(Self {
            root: format!("/{cluster}"),
        })
    }

    pub(crate) fn incarnation(&self, node: u16) -> String {
        format!("{}/incarnation/{node}", self.root)
    }

    pub(crate) fn incarnation_prefix(&self) -> String {
        format!("{}/incarnation/", self.root)
    }

    pub(crate) fn recovery_prefix(&self) -> String {
        format!("{}/recovery/", self.root)
    }

    pub(crate) fn recovered_prefix(&self) -> String {
        format!("{}/recovered/", self.root)
    }

    /// `(node, incarnation)` from `<prefix><node>/<incarnation>`.
    pub(crate) fn parse_node_incarnation(prefix: &str, key: &[u8]) -> Option<(u16, u64)> {
        let key = std::str::from_utf8(key).ok()?;
        let (node, inc) = key.strip_prefix(prefix)?.split_once('/')?;
        Some((node.parse().ok()?, inc.parse().ok()?))
    }

    pub(crate) fn members_prefix(&self) -> String {
        format!("{}/members/", self.root)
    }

    pub(crate) fn member(&self, node: u16, incarnation: u64) -> String {
        format!("{}/members/{node}/{incarnation}", self.root)
    }

    pub(crate) fn recovery(&self, node: u16, incarnation: u64) -> String {
        format!("{}/recovery/{node}/{incarnation}", self.root)
    }

    pub(crate) fn recovered(&self, node: u16, incarnation: u64) -> String {
        format!("{}/recovered/{node}/{incarnation}", self.root)
    }

    pub(crate) fn user(&self, key: &str) -> String {
        format!("{}/kv/{key}", self.root)
    }

    /// `(node, incarnation)` from a member key, for a Down whose previous value is unknown.
    pub(crate) fn parse_member(&self, key: &str) -> Option<(u16, u64)> {
        Self::parse_node_incarnation(&self.members_prefix(), key.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout() {
        let k = Keys::new("c1").unwrap();
        assert_eq!(k.incarnation(7), "/c1/incarnation/7");
        assert_eq!(k.members_prefix(), "/c1/members/");
        assert_eq!(k.member(7, 3), "/c1/members/7/3");
        assert_eq!(k.recovery(7, 3), "/c1/recovery/7/3");
        assert_eq!(k.recovered(7, 3), "/c1/recovered/7/3");
        assert_eq!(k.user("views/p0"), "/c1/kv/views/p0");
        assert_eq!(k.parse_member("/c1/members/7/3"), Some((7, 3)));
        assert_eq!(k.parse_member("/c2/members/7/3"), None);
        assert_eq!(k.parse_member("/c1/members/7"), None);
        assert_eq!(
            Keys::parse_node_incarnation(&k.recovered_prefix(), b"/c1/recovered/65535/18"),
            Some((65535, 18))
        );
        assert!(matches!(Keys::new(""), Err(MemberError::InvalidCluster(_))));
        assert!(matches!(
            Keys::new("a/b"),
            Err(MemberError::InvalidCluster(_))
        ));
    }

    #[test]
    fn member_json_round_trip() {
        for role in [
            Role::Cnode,
            Role::Memnode,
            Role::Lockd,
            Role::Tso,
            Role::Other("x".into()),
        ] {
            let m = MemberInfo {
                role,
                node: 3,
                incarnation: 9,
                pid: 42,
                lease: 7_000_000_000_000,
            };
            let s = serde_json::to_string(&m).unwrap();
            assert_eq!(serde_json::from_str::<MemberInfo>(&s).unwrap(), m);
        }
        let s = serde_json::to_string(&Role::Cnode).unwrap();
        assert_eq!(s, "\"cnode\"");
    }
}

/// Options of [`crate::Member::join_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberOptions {
    /// The longest any one operation (one call of this API, which may be a few etcd calls)
    /// waits for etcd before it returns [`MemberError::Timeout`]. Default 2 s.
    pub op_timeout: Duration,
}

impl Default for MemberOptions {
    fn default() -> Self {
        Self {
            op_timeout: Duration::from_secs(2),
        }
    }
}

/// Whole seconds, rounded up, at least 1 (etcd's unit and minimum).
#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // Used by the etcd implementation.
pub(crate) fn ttl_secs(ttl: Duration) -> i64 {
    let s = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(s.max(1)).unwrap_or(i64::MAX)
}
