//! What an oracle publishes to its clients: the counter word, its placement and the
//! incarnation, as JSON under [`EXPORT_NAME`] in the node's exports (Scythe 4.5, Fig. 18:
//! clients FAA the counter directly, so they must know where it is).

use rrpc::fabric::{DmPlacement, RemoteAddr};
use serde::{Deserialize, Serialize};

/// Name under which [`crate::Oracle::export`] is published in a node's exports.
pub const EXPORT_NAME: &str = "tso";
/// Bytes of the counter (one 8-byte word, as RDMA atomics require).
pub const COUNTER_BYTES: usize = 8;

/// What an oracle exports to its clients (JSON on the control plane).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TsoExport {
    /// The 8-byte, 8-byte-aligned counter word.
    pub counter: RemoteAddr,
    /// Where the counter lives: `"device"` or `"host-fallback: <reason>"`.
    pub placement: String,
    /// The incarnation ([`crate::epoch`]): every timestamp this oracle hands out has it
    /// in its high 16 bits. Absent in exports of older oracles: 0.
    #[serde(default)]
    pub epoch: u16,
    /// A random id of this oracle process, drawn at its start: tells two incarnations
    /// apart when their epochs and counter words are the same (an oracle restarted
    /// without its state dir, on zero-based device memory whose address and key repeat).
    /// Absent in exports of older oracles: 0.
    #[serde(default)]
    pub incarnation: u64,
}

/// Human-readable form of a placement, as exported and printed at start.
pub fn describe_placement(p: &DmPlacement) -> String {
    match p {
        DmPlacement::Device => "device".into(),
        DmPlacement::HostFallback { reason } => format!("host-fallback: {reason}"),
    }
}
