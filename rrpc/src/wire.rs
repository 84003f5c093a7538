//! Small shared constants of the RPC wire protocol.

/// Kind byte of a message header ([`crate::rocket::MsgHeader::kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum MsgKind {
    /// A request to handler `handler`.
    Request = 1,
    /// A successful response; payload is the handler's output.
    Response = 2,
    /// A failed request; payload is a UTF-8 error message.
    Error = 3,
}

/// Polling rounds without work before a polling thread starts yielding its core
/// (the machines this runs on are often oversubscribed).
pub const IDLE_SPINS: u32 = 256;
