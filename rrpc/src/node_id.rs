//! [`NodeId`]: the name of one node (process) of a cluster.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A node's id, unique within its cluster.
///
/// Every fabric endpoint, connection, call and error names its peer by one. On the wire
/// (control-plane JSON, `QpEndpoint`) it is the bare number (`#[serde(transparent)]`), so
/// peers built before the newtype interoperate. It displays as the bare number too:
/// messages say "node {id}".
///
/// `NodeId::MAX` is reserved: fabrics report it as the peer of a QP that is not connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The reserved id of "no node" (an unconnected QP's peer).
    pub const MAX: NodeId = NodeId(u32::MAX);

    /// The number.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<NodeId> for u32 {
    fn from(id: NodeId) -> u32 {
        id.0
    }
}

impl std::str::FromStr for NodeId {
    type Err = std::num::ParseIntError;

    /// Parses the bare number, as command lines and config files write it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(NodeId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_and_display_are_the_bare_number() {
        let id = NodeId(7);
        assert_eq!(serde_json::to_string(&id).unwrap(), "7");
        assert_eq!(serde_json::from_str::<NodeId>("7").unwrap(), id);
        assert_eq!(id.to_string(), "7");
        assert_eq!("7".parse::<NodeId>().unwrap(), id);
        assert!("x".parse::<NodeId>().is_err());
    }
}
