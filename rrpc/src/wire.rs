//! Small shared definitions of the RPC wire protocol: message kinds, reply modes and the
//! fixed-layout prefixes the hybrid modes add to a message (Scythe,
//! 4.6 (2) and Fig. 20).

use serde::{Deserialize, Serialize};

/// Kind byte of a message header ([`crate::rocket::MsgHeader::kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum MsgKind {
    /// A request to handler `handler`; `flags` holds its [`ReplyMode`].
    Request = 1,
    /// A successful response; payload is the handler's output.
    Response = 2,
    /// A failed request; payload is a UTF-8 error message.
    Error = 3,
    /// RPC + one-sided READ: payload is a [`ReadReply`]; the caller READs the reply from
    /// the server's buffer and then sends [`MsgKind::Release`].
    ReadReply = 4,
    /// RPC zero-copy: the server has WRITten the reply into the caller's buffer; payload
    /// is its length in bytes (u64, little-endian).
    ZeroCopyDone = 5,
    /// Caller to server: the [`ReadReply`] buffer with this handle (u64) may be reused.
    /// No response.
    Release = 6,
    /// Caller to server: call `call_id` ended (deadline) while its zero-copy buffer is
    /// still reserved; do not WRITE into it. The server answers [`MsgKind::Cancelled`]
    /// if it had not answered yet, else its answer (already on its way) stands. Either
    /// tells the caller no WRITE for that call can land any more.
    Cancel = 7,
    /// Server to caller: the cancelled call was dropped without a reply WRITE.
    Cancelled = 8,
}

impl MsgKind {
    /// The kind with byte value `b`, if any.
    pub fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Request,
            2 => Self::Response,
            3 => Self::Error,
            4 => Self::ReadReply,
            5 => Self::ZeroCopyDone,
            6 => Self::Release,
            7 => Self::Cancel,
            8 => Self::Cancelled,
            _ => return None,
        })
    }
}

/// How the reply to a call travels (Scythe 4.6 (2), Fig. 20): chosen per call
/// ([`crate::runtime::CallOpts::mode`]) and carried in the request header's `flags`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum ReplyMode {
    /// Pure RPC: the reply rides in the response Rocket; a reply larger than a bucket can
    /// carry (`bucket_size - 32` bytes) is an error, never truncated.
    Rpc = 0,
    /// By size. The caller sends a call whose expected reply
    /// ([`crate::runtime::CallOpts::reply_len`]) is above its threshold as zero-copy;
    /// otherwise the server sends the reply inline up to the caller's threshold (given
    /// once per Rocket when it is opened), else by RPC + one-sided READ.
    #[default]
    Auto = 1,
    /// RPC + one-sided READ whatever the size: the reply names a server buffer, the
    /// caller READs it and releases it.
    Read = 2,
    /// RPC zero-copy: the request starts with a [`ZeroCopyPrefix`] naming the caller's
    /// buffer; the server WRITEs the reply there followed by the call id (8 bytes, the
    /// buffer's generation), then answers [`MsgKind::ZeroCopyDone`] in the same ordered
    /// WR list.
    ZeroCopy = 3,
}

impl ReplyMode {
    /// The mode with byte value `b`, if any.
    pub fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            0 => Self::Rpc,
            1 => Self::Auto,
            2 => Self::Read,
            3 => Self::ZeroCopy,
            _ => return None,
        })
    }
    /// Bytes the mode's prefix adds in front of the request payload.
    pub fn prefix_bytes(self) -> usize {
        match self {
            Self::Rpc | Self::Auto | Self::Read => 0,
            Self::ZeroCopy => ZeroCopyPrefix::BYTES,
        }
    }
}

/// Prefix of a [`ReplyMode::ZeroCopy`] request: 16 bytes, `addr` (u64 LE), `rkey` (u32
/// LE), `capacity` (u32 LE, bytes) of the caller's registered buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZeroCopyPrefix {
    /// Buffer address in the caller's address space.
    pub addr: u64,
    /// Remote key of the buffer's MR.
    pub rkey: u32,
    /// Buffer size in bytes.
    pub capacity: u32,
}

impl ZeroCopyPrefix {
    /// Encoded size in bytes.
    pub const BYTES: usize = 16;
    /// Encode.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        b[12..].copy_from_slice(&self.capacity.to_le_bytes());
        b
    }
    /// Decode the first 16 bytes of `b`; `None` when shorter.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let b = b.get(..Self::BYTES)?;
        Some(Self {
            addr: u64::from_le_bytes(b[..8].try_into().ok()?),
            rkey: u32::from_le_bytes(b[8..12].try_into().ok()?),
            capacity: u32::from_le_bytes(b[12..].try_into().ok()?),
        })
    }
}

/// Prefix of a request too large for a bucket, sent by reference (the mirror of RPC +
/// READ): 16 bytes, `addr` (u64 LE), `rkey` (u32 LE), `len` (u32 LE, bytes) of the
/// caller's registered buffer holding the request. It follows the mode's own prefix,
/// and [`FetchPrefix::FLAG`] is set in the header's `flags` next to the
/// [`ReplyMode`]. The server READs the request, then runs the handler; the caller keeps
/// the buffer until the call's answer (or, for a call that ended first, the server's
/// answer to its `Cancel`) arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchPrefix {
    /// Buffer address in the caller's address space.
    pub addr: u64,
    /// Remote key of the buffer's MR.
    pub rkey: u32,
    /// Request length in bytes.
    pub len: u32,
}

impl FetchPrefix {
    /// Encoded size in bytes.
    pub const BYTES: usize = 16;
    /// Bit of the request header's `flags` saying the request is sent by reference.
    pub const FLAG: u8 = 0x80;
    /// Encode.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        b[12..].copy_from_slice(&self.len.to_le_bytes());
        b
    }
    /// Decode the first 16 bytes of `b`; `None` when shorter.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let b = b.get(..Self::BYTES)?;
        Some(Self {
            addr: u64::from_le_bytes(b[..8].try_into().ok()?),
            rkey: u32::from_le_bytes(b[8..12].try_into().ok()?),
            len: u32::from_le_bytes(b[12..].try_into().ok()?),
        })
    }
}

/// Payload of [`MsgKind::ReadReply`]: 24 bytes, `addr` (u64 LE), `rkey` (u32 LE), `len`
/// (u32 LE, bytes), `handle` (u64 LE) to release the buffer with.
///
/// The buffer at `addr` holds `handle` (8 bytes), the `len` reply bytes, and `handle`
/// again: the handle is the buffer's generation. The caller READs all `len + 16` bytes
/// and accepts the reply only if both words equal the handle, so a READ that comes
/// after the server expired the buffer (its words are cleared) or reused it (another
/// handle) fails its call instead of returning another call's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadReply {
    /// Reply address in the server's address space.
    pub addr: u64,
    /// Remote key of the server's buffer MR.
    pub rkey: u32,
    /// Reply length in bytes (without the two generation words).
    pub len: u32,
    /// Handle for [`MsgKind::Release`], and the buffer's generation.
    pub handle: u64,
}

impl ReadReply {
    /// Encoded size in bytes.
    pub const BYTES: usize = 24;
    /// Encode.
    pub fn to_bytes(self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..].copy_from_slice(&self.handle.to_le_bytes());
        b
    }
    /// Decode exactly 24 bytes; `None` otherwise.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() != Self::BYTES {
            return None;
        }
        Some(Self {
            addr: u64::from_le_bytes(b[..8].try_into().ok()?),
            rkey: u32::from_le_bytes(b[8..12].try_into().ok()?),
            len: u32::from_le_bytes(b[12..16].try_into().ok()?),
            handle: u64::from_le_bytes(b[16..].try_into().ok()?),
        })
    }
}

/// Batching of a Rocket's traffic (Scythe 3.4 guideline (2), Fig. 9, and 4.6 (3)).
/// Message batching packs the messages of a polling round into shared buckets (one WRITE
/// each); doorbell batching posts a round's WRs as one list (one `ibv_post_send`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Batching {
    /// One message per bucket, one doorbell per WR.
    None,
    /// One message per bucket; a round's buckets posted as one list.
    Doorbell,
    /// Messages share buckets; one doorbell per bucket.
    Msg,
    /// Messages share buckets and a round's buckets are posted as one list (RRPC).
    #[default]
    Combined,
}

impl Batching {
    /// All four, in the order benchmarks print them.
    pub const ALL: [Batching; 4] = [Self::None, Self::Doorbell, Self::Msg, Self::Combined];
    /// Whether messages share buckets.
    pub fn msg(self) -> bool {
        matches!(self, Self::Msg | Self::Combined)
    }
    /// Whether a round's WRs are posted with one doorbell.
    pub fn doorbell(self) -> bool {
        matches!(self, Self::Doorbell | Self::Combined)
    }
    /// Kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Doorbell => "doorbell",
            Self::Msg => "msg",
            Self::Combined => "combined",
        }
    }
}

impl std::str::FromStr for Batching {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| format!("unknown batching {s:?} (none, doorbell, msg, combined)"))
    }
}

/// Hasher for ids this side chooses or connects to and looks up per message (call ids,
/// handler ids, reply-buffer handles, the node ids of a thread's connections): a
/// multiply, not SipHash, since no peer can flood the table with keys.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u16(&mut self, v: u16) {
        self.0 = u64::from(v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub(crate) type IdHash = std::hash::BuildHasherDefault<IdHasher>;

/// Polling rounds without work before a polling thread starts yielding its core
/// (the machines this runs on are often oversubscribed).
pub const IDLE_SPINS: u32 = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_round_trip_and_reject_short_input() {
        let z = ZeroCopyPrefix {
            addr: 0x1122_3344_5566_7788,
            rkey: 7,
            capacity: 1 << 20,
        };
        assert_eq!(ZeroCopyPrefix::from_bytes(&z.to_bytes()), Some(z));
        assert_eq!(ZeroCopyPrefix::from_bytes(&[0; 15]), None);
        let r = ReadReply {
            addr: 1,
            rkey: 2,
            len: 3,
            handle: 4,
        };
        assert_eq!(ReadReply::from_bytes(&r.to_bytes()), Some(r));
        assert_eq!(ReadReply::from_bytes(&[0; 23]), None);
        for b in Batching::ALL {
            assert_eq!(b.name().parse::<Batching>(), Ok(b));
        }
        assert!("both".parse::<Batching>().is_err());
    }
}
