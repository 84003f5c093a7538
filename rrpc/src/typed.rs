//! Typed RPCs without code generation: a type implementing [`Rpc`] names a handler id, a
//! request type, a response type and the [`Codec`] that turns both into bytes. The server
//! registers a typed handler with [`Handlers::register_typed`] (or its async,
//! caller-aware and fallible-registration variants); a client calls it with
//! [`ThreadCtx::call_typed`].
//! Both are thin layers over [`Handlers::register`] and [`ThreadCtx::call_with`]: the
//! bytes on the wire are the codec's, nothing is added.
//!
//! Codecs:
//! - [`Fixed`]: fixed layouts through `zerocopy` (`FromBytes + IntoBytes + Immutable`):
//!   the value's bytes as they lie in memory, checked for length on decode. Use
//!   `#[repr(C)]` structs of `zerocopy::little_endian` integers so that hosts of either
//!   byte order agree; the derives need `zerocopy` as a dependency of the crate using
//!   them, or `#[zerocopy(crate = "rrpc::typed::zerocopy")]` on the type.
//! - [`Fixed`] also encodes a [`Batch`]: a fixed-layout head followed by any number of
//!   fixed-layout entries (the shape of a request that carries one entry per lock, say),
//!   the head's bytes then the entries' bytes, nothing else (no count: the length says it).
//!   [`view_request`] and [`view_response`] read one in place, without allocating;
//!   [`encode_batch`] and [`encode_batch_iter`] write one from a slice or an iterator.
//! - [`Fixed`] also encodes a [`TailBatch`]: a head, a count, that many entries, then a
//!   byte area the entries (or the request a reply answers) describe, for messages with
//!   variable-length records. [`TailBatch::view`], [`view_tail_request`] and
//!   [`view_tail_response`] read one in place; [`TailBatchRef::records`] pairs each entry
//!   with its bytes and [`TailReader`] cuts a tail described elsewhere, both checking
//!   that a message is neither short nor long; [`encode_tail_batch`] and
//!   [`TailBatchWriter`] write one into a single buffer.
//! - `Postcard` (feature `serde-codec`): any `serde` type, as postcard bytes (varint
//!   integers, length-prefixed strings and vectors), for variable-length messages.
//!
//! Services that keep their own handler shapes (a sorted batch handler, a handler that
//! writes its reply straight into the server's buffer) use the same codecs through
//! [`decode_request`], [`encode_response`], [`encode_request`] and [`decode_response`].
//!
//! ```
//! use rrpc::typed::{zerocopy, Fixed, Rpc};
//! use zerocopy::little_endian::U64;
//!
//! #[derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, Debug)]
//! #[zerocopy(crate = "rrpc::typed::zerocopy")]
//! #[repr(C)]
//! struct Add { a: U64, b: U64 }
//!
//! struct AddRpc;
//! impl Rpc for AddRpc {
//!     const ID: u16 = rrpc::server::ids::FIRST_APP_ID;
//!     type Req = Add;
//!     type Resp = U64;
//!     type Codec = Fixed;
//! }
//!
//! let mut handlers = rrpc::server::Handlers::new();
//! handlers.register_typed::<AddRpc>(|r| Ok(U64::new(r.a.get() + r.b.get())));
//! // A client on a runtime thread: `ctx.call_typed::<AddRpc>(node, &req).await?`.
//! ```

use std::any::type_name;
use std::future::Future;
use std::mem::{size_of, size_of_val};

use crate::runtime::{CallError, CallOpts, ThreadCtx};
use crate::server::{Caller, DuplicateId, Handlers};
use crate::NodeId;

pub use zerocopy;

mod tail;
pub use tail::{
    encode_tail_batch, view_tail_request, view_tail_response, Records, TailBatch, TailBatchRef,
    TailBatchWriter, TailReader,
};

/// One remote procedure: its handler id, request and response types and their codec.
/// Implement it on a unit struct per procedure; both sides share the definition.
pub trait Rpc: 'static {
    /// The handler id (applications use ids from [`crate::server::ids::FIRST_APP_ID`] up;
    /// [`crate::server::ids`] lists the reserved ranges).
    const ID: u16;
    /// The request.
    type Req: 'static;
    /// The response.
    type Resp: 'static;
    /// How requests and responses become bytes and back.
    type Codec: Codec<Self::Req> + Codec<Self::Resp>;
}

/// Why a codec could not encode or decode a value, before the typed layer adds which RPC
/// and which part it was.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CodecError {
    /// The length a fixed layout needs, in bytes, where the failure is a length mismatch.
    pub expected_len: Option<usize>,
    /// What went wrong, in words.
    pub detail: String,
}

impl CodecError {
    /// A fixed layout of `expected_len` bytes did not get that many.
    pub fn size(expected_len: usize) -> Self {
        Self {
            expected_len: Some(expected_len),
            detail: "wrong length for a fixed layout".into(),
        }
    }

    /// Any other failure, described by `detail`.
    pub fn other(detail: impl Into<String>) -> Self {
        Self {
            expected_len: None,
            detail: detail.into(),
        }
    }
}

/// Turns values of `T` into bytes and back. Implemented by [`Fixed`] (zerocopy layouts)
/// and, with feature `serde-codec`, by `Postcard` (serde types); implement it for your
/// own format if neither fits.
pub trait Codec<T> {
    /// Append `value`'s bytes to `out`.
    fn encode(value: &T, out: &mut Vec<u8>) -> Result<(), CodecError>;
    /// A value from exactly `bytes` (trailing bytes are an error).
    fn decode(bytes: &[u8]) -> Result<T, CodecError>;
}

/// The fixed-layout codec: a value is its `size_of::<T>()` bytes in memory order
/// (`zerocopy`'s `IntoBytes`), and decoding checks the length and copies them back
/// (`FromBytes`, which every bit pattern satisfies, so no other check is needed).
#[derive(Debug, Clone, Copy, Default)]
pub struct Fixed;

impl<T> Codec<T> for Fixed
where
    T: zerocopy::FromBytes + zerocopy::IntoBytes + zerocopy::Immutable,
{
    fn encode(value: &T, out: &mut Vec<u8>) -> Result<(), CodecError> {
        out.extend_from_slice(value.as_bytes());
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<T, CodecError> {
        T::read_from_bytes(bytes).map_err(|_| CodecError::size(size_of::<T>()))
    }
}

/// A fixed-layout head followed by zero or more fixed-layout entries, as one message:
/// `size_of::<H>() + entries.len() * size_of::<E>()` bytes, the head's bytes then each
/// entry's, in order, with no count or padding added (the message length gives the
/// count). `H` may be `()` for a message of entries alone.
///
/// Its codec is [`Fixed`] (for `H` and `E` that `Fixed` encodes on their own:
/// `zerocopy` `FromBytes + IntoBytes + Immutable`, entries of at least one byte).
/// Decoding fails, with a [`CodecError`] whose detail names both sizes, when the bytes
/// are fewer than the head or the rest is not a whole number of entries; zero entries
/// decode (a service that needs at least one checks that itself, as it checks the
/// entries' values). [`encode_batch`] writes the same bytes from a head and a slice,
/// without building a `Batch`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Batch<H, E> {
    /// The head.
    pub head: H,
    /// The entries, in message order.
    pub entries: Vec<E>,
}

impl<H, E> Batch<H, E> {
    /// A batch of `head` and `entries`.
    pub fn new(head: H, entries: Vec<E>) -> Self {
        Self { head, entries }
    }

    /// Its encoded length in bytes: `size_of::<H>() + entries.len() * size_of::<E>()`.
    pub fn encoded_len(&self) -> usize {
        size_of::<H>() + self.entries.len() * size_of::<E>()
    }
}

/// Append the bytes of a [`Batch`] of `head` and `entries` to `out` (reserving them
/// first): what [`Fixed`] encodes a `Batch` as, for a caller that has the entries in a
/// slice (on the stack, say) rather than a `Vec`.
pub fn encode_batch<H, E>(head: &H, entries: &[E], out: &mut Vec<u8>)
where
    H: zerocopy::IntoBytes + zerocopy::Immutable,
    E: zerocopy::IntoBytes + zerocopy::Immutable,
{
    out.reserve(size_of::<H>() + size_of_val(entries));
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(zerocopy::IntoBytes::as_bytes(entries));
}

/// Append the bytes of a [`Batch`] of `head` and the entries `entries` yields to `out`:
/// what [`encode_batch`] writes, for a caller that computes each entry as it goes (from
/// a list of indices, say) and should not collect them first. Reserves the iterator's
/// lower size bound of entries.
pub fn encode_batch_iter<H, E>(head: &H, entries: impl IntoIterator<Item = E>, out: &mut Vec<u8>)
where
    H: zerocopy::IntoBytes + zerocopy::Immutable,
    E: zerocopy::IntoBytes + zerocopy::Immutable,
{
    let entries = entries.into_iter();
    out.reserve(size_of::<H>() + entries.size_hint().0 * size_of::<E>());
    out.extend_from_slice(head.as_bytes());
    for e in entries {
        out.extend_from_slice(e.as_bytes());
    }
}

/// A [`Batch`] read in place: its head and entries borrowed from the message bytes, no
/// copy and no allocation ([`Batch::view`], [`view_request`], [`view_response`]). For
/// layouts of alignment 1 (`zerocopy::Unaligned`: `u8` arrays and the
/// `zerocopy::little_endian` integers), which any byte offset satisfies.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct BatchRef<'a, H, E> {
    /// The head.
    pub head: &'a H,
    /// The entries, in message order.
    pub entries: &'a [E],
}

impl<H, E> Clone for BatchRef<'_, H, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<H, E> Copy for BatchRef<'_, H, E> {}

impl<H, E> Batch<H, E> {
    /// The batch as a [`BatchRef`].
    pub fn as_ref(&self) -> BatchRef<'_, H, E> {
        BatchRef {
            head: &self.head,
            entries: &self.entries,
        }
    }
}

impl<H, E> Batch<H, E>
where
    H: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
    E: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
{
    /// Read a batch's bytes in place: the checks and errors of [`Fixed`]'s decoding (a
    /// head plus whole entries, zero entries allowed), without copying the entries out.
    pub fn view(bytes: &[u8]) -> Result<BatchRef<'_, H, E>, CodecError> {
        check_batch_len::<H, E>(bytes.len())?;
        let (head, rest) = H::ref_from_prefix(bytes).map_err(|_| bad_batch::<H, E>())?;
        let entries =
            <[E] as zerocopy::FromBytes>::ref_from_bytes(rest).map_err(|_| bad_batch::<H, E>())?;
        Ok(BatchRef { head, entries })
    }
}

/// The error of bytes that are not an `H` head plus whole `E` entries.
fn bad_batch<H, E>() -> CodecError {
    CodecError::other(format!(
        "not a {}-byte head plus whole {}-byte entries",
        size_of::<H>(),
        size_of::<E>()
    ))
}

/// The checks of a [`Batch`]'s decoding, copied ([`Fixed`]) or in place ([`Batch::view`]):
/// `E` is not zero-sized and `len` bytes are an `H` head plus whole `E` entries (zero
/// entries allowed).
fn check_batch_len<H, E>(len: usize) -> Result<(), CodecError> {
    let (head_len, entry_len) = (size_of::<H>(), size_of::<E>());
    if entry_len == 0 {
        return Err(CodecError::other(
            "a batch's entries must not be zero-sized",
        ));
    }
    if len < head_len || !(len - head_len).is_multiple_of(entry_len) {
        return Err(bad_batch::<H, E>());
    }
    Ok(())
}

/// `R`'s request read in place ([`Batch::view`]), for an [`Rpc`] whose request is a
/// [`Batch`] of alignment-1 layouts: what [`decode_request`] returns, borrowed from
/// `bytes` instead of copied into a `Vec` (for a hot path that should not allocate).
///
/// Errors: [`DecodeError`] as [`decode_request`]'s.
pub fn view_request<R, H, E>(bytes: &[u8]) -> Result<BatchRef<'_, H, E>, DecodeError>
where
    R: Rpc<Req = Batch<H, E>>,
    H: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
    E: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
{
    Batch::view(bytes).map_err(|e| decode_error::<R>(e, bytes.len(), Part::Request))
}

/// `R`'s response read in place, as [`view_request`] reads a request.
///
/// Errors: [`DecodeError`] as [`decode_response`]'s.
pub fn view_response<R, H, E>(bytes: &[u8]) -> Result<BatchRef<'_, H, E>, DecodeError>
where
    R: Rpc<Resp = Batch<H, E>>,
    H: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
    E: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
{
    Batch::view(bytes).map_err(|e| decode_error::<R>(e, bytes.len(), Part::Response))
}

impl<H, E> Codec<Batch<H, E>> for Fixed
where
    H: zerocopy::FromBytes + zerocopy::IntoBytes + zerocopy::Immutable,
    E: zerocopy::FromBytes + zerocopy::IntoBytes + zerocopy::Immutable,
{
    fn encode(value: &Batch<H, E>, out: &mut Vec<u8>) -> Result<(), CodecError> {
        encode_batch(&value.head, &value.entries, out);
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<Batch<H, E>, CodecError> {
        check_batch_len::<H, E>(bytes.len())?;
        let (head, rest) = H::read_from_prefix(bytes).map_err(|_| bad_batch::<H, E>())?;
        let entries = rest
            .chunks_exact(size_of::<E>())
            .map(|c| E::read_from_bytes(c).map_err(|_| bad_batch::<H, E>()))
            .collect::<Result<_, _>>()?;
        Ok(Batch { head, entries })
    }
}

/// The serde codec (feature `serde-codec`): values as postcard bytes. Decoding rejects
/// bytes left over after the value.
#[cfg(feature = "serde-codec")]
#[derive(Debug, Clone, Copy, Default)]
pub struct Postcard;

#[cfg(feature = "serde-codec")]
impl<T> Codec<T> for Postcard
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    fn encode(value: &T, out: &mut Vec<u8>) -> Result<(), CodecError> {
        let bytes = postcard::to_stdvec(value).map_err(|e| CodecError::other(e.to_string()))?;
        out.extend_from_slice(&bytes);
        Ok(())
    }

    fn decode(bytes: &[u8]) -> Result<T, CodecError> {
        let (v, rest) =
            postcard::take_from_bytes(bytes).map_err(|e| CodecError::other(e.to_string()))?;
        if !rest.is_empty() {
            return Err(CodecError::other(format!(
                "{} bytes left over after the value",
                rest.len()
            )));
        }
        Ok(v)
    }
}

/// Which half of a call a codec failed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The request.
    Request,
    /// The response.
    Response,
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Part::Request => "request",
            Part::Response => "response",
        })
    }
}

/// A typed RPC's bytes that its codec could not decode (on the server: the request, sent
/// back to the caller as the handler's error text; on the client: the response).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{rpc} (handler {id}): cannot decode the {part} from {len} bytes{}: {detail}",
    expected_len.map(|n| format!(" (its layout has {n})")).unwrap_or_default()
)]
#[non_exhaustive]
pub struct DecodeError {
    /// The [`Rpc`] type's name.
    pub rpc: &'static str,
    /// Its handler id.
    pub id: u16,
    /// Request or response.
    pub part: Part,
    /// The bytes received.
    pub len: usize,
    /// The bytes a fixed layout needs, where that was the failure.
    pub expected_len: Option<usize>,
    /// The codec's description.
    pub detail: String,
}

/// A typed RPC's value that its codec could not encode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{rpc} (handler {id}): cannot encode the {part}: {detail}")]
#[non_exhaustive]
pub struct EncodeError {
    /// The [`Rpc`] type's name.
    pub rpc: &'static str,
    /// Its handler id.
    pub id: u16,
    /// Request or response.
    pub part: Part,
    /// The codec's description.
    pub detail: String,
}

/// Errors of [`ThreadCtx::call_typed`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TypedCallError {
    /// The call itself failed (including [`CallError::Remote`] with the handler's error,
    /// or the server's text of a request it could not decode).
    #[error(transparent)]
    Call(#[from] CallError),
    /// The request could not be encoded (nothing was sent).
    #[error(transparent)]
    Encode(EncodeError),
    /// The response could not be decoded.
    #[error(transparent)]
    Decode(DecodeError),
}

/// Encode `R`'s `part` value `v` onto `out`.
fn encode<R: Rpc, T>(v: &T, out: &mut Vec<u8>, part: Part) -> Result<(), EncodeError>
where
    R::Codec: Codec<T>,
{
    <R::Codec as Codec<T>>::encode(v, out).map_err(|e| EncodeError {
        rpc: type_name::<R>(),
        id: R::ID,
        part,
        detail: e.detail,
    })
}

/// Decode `R`'s `part` value from `bytes`.
fn decode<R: Rpc, T>(bytes: &[u8], part: Part) -> Result<T, DecodeError>
where
    R::Codec: Codec<T>,
{
    <R::Codec as Codec<T>>::decode(bytes).map_err(|e| decode_error::<R>(e, bytes.len(), part))
}

/// The [`DecodeError`] of `R`'s `part` of `len` bytes that a codec refused with `e`.
fn decode_error<R: Rpc>(e: CodecError, len: usize, part: Part) -> DecodeError {
    DecodeError {
        rpc: type_name::<R>(),
        id: R::ID,
        part,
        len,
        expected_len: e.expected_len,
        detail: e.detail,
    }
}

/// Decode `R`'s request from `bytes` with `R`'s codec: what a typed handler gets, for a
/// service that registers its own handler shape (a sorted batch handler, say).
///
/// Errors: [`DecodeError`] naming `R`, the length received and, for fixed layouts, the
/// one expected.
pub fn decode_request<R: Rpc>(bytes: &[u8]) -> Result<R::Req, DecodeError> {
    decode::<R, R::Req>(bytes, Part::Request)
}

/// Append `R`'s response `resp` to `out` with `R`'s codec: what a typed handler sends.
///
/// Errors: [`EncodeError`] if the codec refuses the value (never for [`Fixed`]).
pub fn encode_response<R: Rpc>(resp: &R::Resp, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    encode::<R, R::Resp>(resp, out, Part::Response)
}

/// Append `R`'s request `req` to `out` with `R`'s codec: the bytes [`ThreadCtx::call_typed`]
/// sends, for a caller that sends them itself (into a buffer it reuses, or to a handler
/// id it learned at run time).
///
/// Errors: [`EncodeError`] if the codec refuses the value (never for [`Fixed`]).
pub fn encode_request<R: Rpc>(req: &R::Req, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    encode::<R, R::Req>(req, out, Part::Request)
}

/// Decode `R`'s response from `bytes` with `R`'s codec, as [`ThreadCtx::call_typed`]
/// does.
///
/// Errors: [`DecodeError`] as [`decode_request`]'s.
pub fn decode_response<R: Rpc>(bytes: &[u8]) -> Result<R::Resp, DecodeError> {
    decode::<R, R::Resp>(bytes, Part::Response)
}

/// The plain handler that runs typed handler `f` for `R`.
fn plain<R: Rpc>(
    f: impl Fn(R::Req) -> Result<R::Resp, String> + Send + Sync + 'static,
) -> impl Fn(&[u8], &mut Vec<u8>) -> Result<(), String> + Send + Sync + 'static {
    move |req, out| {
        let req = decode::<R, R::Req>(req, Part::Request).map_err(|e| e.to_string())?;
        let resp = f(req)?;
        encode::<R, R::Resp>(&resp, out, Part::Response).map_err(|e| e.to_string())
    }
}

impl Handlers {
    /// Register `f` as the handler of [`Rpc`] `R` (id `R::ID`), a plain handler as
    /// [`Handlers::register`] makes: it gets the decoded request and returns the response
    /// or an error text for the caller. A request that does not decode is answered with
    /// the [`DecodeError`]'s text (naming `R`, the length received and the one expected)
    /// without calling `f`. Panics if `R::ID` is taken, as [`Handlers::register`] does;
    /// [`Handlers::try_register_typed`] returns the error instead.
    pub fn register_typed<R: Rpc>(
        &mut self,
        f: impl Fn(R::Req) -> Result<R::Resp, String> + Send + Sync + 'static,
    ) -> &mut Self {
        self.register(R::ID, plain::<R>(f))
    }

    /// [`Handlers::register_typed`], but a taken id is an error (nothing is registered).
    pub fn try_register_typed<R: Rpc>(
        &mut self,
        f: impl Fn(R::Req) -> Result<R::Resp, String> + Send + Sync + 'static,
    ) -> Result<&mut Self, DuplicateId> {
        self.try_register(R::ID, plain::<R>(f))
    }

    /// Register `f` as the handler of [`Rpc`] `R` as [`Handlers::register_typed`] does,
    /// and tell it each request's [`Caller`] ([`Handlers::register_with_caller`]): the
    /// node and incarnation the requester's connection authenticated at setup. Decode
    /// failures are answered as in [`Handlers::register_typed`]. Panics if `R::ID` is
    /// taken.
    pub fn register_typed_with_caller<R: Rpc>(
        &mut self,
        f: impl Fn(Caller, R::Req) -> Result<R::Resp, String> + Send + Sync + 'static,
    ) -> &mut Self {
        self.register_with_caller(R::ID, move |caller, req, out| {
            let req = decode::<R, R::Req>(req, Part::Request).map_err(|e| e.to_string())?;
            let resp = f(caller, req)?;
            encode::<R, R::Resp>(&resp, out, Part::Response).map_err(|e| e.to_string())
        })
    }

    /// Register `f` as the async handler of [`Rpc`] `R`, as [`Handlers::register_async`]
    /// does: its future runs on the server thread's runtime and may await calls. Decode
    /// failures are answered as in [`Handlers::register_typed`]. Panics if `R::ID` is
    /// taken.
    pub fn register_typed_async<R, F, Fut>(&mut self, f: F) -> &mut Self
    where
        R: Rpc,
        F: Fn(R::Req) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R::Resp, String>> + 'static,
    {
        let f = std::sync::Arc::new(f);
        self.register_async(R::ID, move |req: Vec<u8>| {
            let f = f.clone();
            async move {
                let req = decode::<R, R::Req>(&req, Part::Request).map_err(|e| e.to_string())?;
                let resp = f(req).await?;
                let mut out = Vec::new();
                encode::<R, R::Resp>(&resp, &mut out, Part::Response).map_err(|e| e.to_string())?;
                Ok(out)
            }
        })
    }
}

impl ThreadCtx {
    /// Call [`Rpc`] `R` on `node` with `req` ([`ThreadCtx::call`] with `R::ID` and the
    /// codec's bytes) and decode the response. Errors: [`TypedCallError::Encode`] if the
    /// request does not encode (nothing sent), [`TypedCallError::Call`] for every error of
    /// the call, [`TypedCallError::Decode`] if the response does not decode (naming `R`,
    /// the length received and, for fixed layouts, the one expected).
    pub async fn call_typed<R: Rpc>(
        &self,
        node: NodeId,
        req: &R::Req,
    ) -> Result<R::Resp, TypedCallError> {
        self.call_typed_with::<R>(node, req, CallOpts::default())
            .await
    }

    /// [`ThreadCtx::call_typed`] with call options (reply mode, expected reply length,
    /// timeout) as [`ThreadCtx::call_with`] takes them.
    pub async fn call_typed_with<R: Rpc>(
        &self,
        node: NodeId,
        req: &R::Req,
        opts: CallOpts,
    ) -> Result<R::Resp, TypedCallError> {
        // The codecs reserve what they write: one allocation for a fixed layout or batch.
        let mut bytes = Vec::new();
        encode::<R, R::Req>(req, &mut bytes, Part::Request).map_err(TypedCallError::Encode)?;
        let resp = self.call_with(node, R::ID, &bytes, opts).await?;
        decode::<R, R::Resp>(&resp, Part::Response).map_err(TypedCallError::Decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::MsgKind;
    use zerocopy::little_endian::{U32, U64};

    #[derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, Debug, PartialEq)]
    #[repr(C)]
    struct Pair {
        a: U64,
        b: U32,
        pad: U32,
    }

    struct Sum;
    impl Rpc for Sum {
        const ID: u16 = 200;
        type Req = Pair;
        type Resp = U64;
        type Codec = Fixed;
    }

    #[test]
    fn fixed_round_trips_little_endian_and_checks_the_length() {
        let p = Pair {
            a: U64::new(0x0102_0304_0506_0708),
            b: U32::new(9),
            pad: U32::new(0),
        };
        let mut out = vec![0xee];
        <Fixed as Codec<Pair>>::encode(&p, &mut out).unwrap();
        assert_eq!(out.len(), 1 + 16);
        assert_eq!(&out[1..9], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(<Fixed as Codec<Pair>>::decode(&out[1..]).unwrap(), p);
        let e = <Fixed as Codec<Pair>>::decode(&out).unwrap_err();
        assert_eq!(e.expected_len, Some(16));
    }

    #[test]
    fn a_typed_handler_answers_and_a_short_request_names_the_rpc_and_sizes() {
        let mut h = Handlers::new();
        h.register_typed::<Sum>(|p| Ok(U64::new(p.a.get() + u64::from(p.b.get()))));
        let mut req = Vec::new();
        let p = Pair {
            a: U64::new(40),
            b: U32::new(2),
            pad: U32::new(0),
        };
        encode::<Sum, Pair>(&p, &mut req, Part::Request).unwrap();
        let mut out = Vec::new();
        assert_eq!(h.call(Sum::ID, &req, &mut out), MsgKind::Response);
        let r: U64 = decode::<Sum, U64>(&out, Part::Response).unwrap();
        assert_eq!(r.get(), 42);

        assert_eq!(h.call(Sum::ID, &req[..5], &mut out), MsgKind::Error);
        let msg = String::from_utf8(out.clone()).unwrap();
        assert!(msg.contains("Sum"), "{msg}");
        assert!(msg.contains("handler 200"), "{msg}");
        assert!(msg.contains("request from 5 bytes"), "{msg}");
        assert!(msg.contains("layout has 16"), "{msg}");
    }

    #[test]
    fn a_typed_handler_error_reaches_the_caller_as_text() {
        let mut h = Handlers::new();
        h.register_typed::<Sum>(|_| Err("no sums today".into()));
        let mut req = Vec::new();
        encode::<Sum, Pair>(
            &Pair {
                a: U64::new(1),
                b: U32::new(1),
                pad: U32::new(0),
            },
            &mut req,
            Part::Request,
        )
        .unwrap();
        let mut out = Vec::new();
        assert_eq!(h.call(Sum::ID, &req, &mut out), MsgKind::Error);
        assert_eq!(out, b"no sums today");
    }

    #[test]
    fn try_register_typed_refuses_a_taken_id() {
        let mut h = Handlers::new();
        h.register(Sum::ID, |_, _| Ok(()));
        let e = h.try_register_typed::<Sum>(|_| Ok(U64::new(0))).err();
        assert_eq!(e, Some(DuplicateId { id: Sum::ID }));
        // The first handler is still the one registered.
        let mut out = vec![1];
        assert_eq!(h.call(Sum::ID, &[0; 16], &mut out), MsgKind::Response);
        assert!(out.is_empty());
    }

    #[test]
    fn a_response_decode_error_names_the_rpc_and_both_lengths() {
        let e = decode::<Sum, U64>(&[1, 2, 3], Part::Response).unwrap_err();
        assert_eq!((e.id, e.len, e.expected_len), (200, 3, Some(8)));
        let s = e.to_string();
        assert!(
            s.contains(
                "Sum (handler 200): cannot decode the response from 3 bytes (its layout has 8)"
            ),
            "{s}"
        );
    }

    #[derive(
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::Immutable,
        zerocopy::KnownLayout,
        zerocopy::Unaligned,
        Clone,
        Debug,
        PartialEq,
    )]
    #[repr(C)]
    struct Entry {
        id: U32,
        flag: u8,
        pad: [u8; 3],
    }

    fn entry(id: u32, flag: u8) -> Entry {
        Entry {
            id: U32::new(id),
            flag,
            pad: [0; 3],
        }
    }

    #[test]
    fn a_batch_is_its_head_then_its_entries_and_round_trips() {
        let b = Batch::new(U64::new(0x0102), vec![entry(7, 1), entry(0x0a0b, 2)]);
        assert_eq!(b.encoded_len(), 8 + 2 * 8);
        let mut out = Vec::new();
        <Fixed as Codec<Batch<U64, Entry>>>::encode(&b, &mut out).unwrap();
        assert_eq!(
            out,
            [2, 1, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, 0x0b, 0x0a, 0, 0, 2, 0, 0, 0]
        );
        let mut same = Vec::new();
        encode_batch(&b.head, &b.entries, &mut same);
        assert_eq!(same, out, "encode_batch writes the codec's bytes");
        let mut from_iter = Vec::new();
        encode_batch_iter(&b.head, b.entries.iter().cloned(), &mut from_iter);
        assert_eq!(from_iter, out, "encode_batch_iter writes the codec's bytes");
        assert_eq!(
            <Fixed as Codec<Batch<U64, Entry>>>::decode(&out),
            Ok(b.clone())
        );
        let v = Batch::<U64, Entry>::view(&out[..]).unwrap();
        assert_eq!(v, b.as_ref(), "a view reads the same batch in place");
        // Any offset will do for alignment-1 layouts.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&out);
        assert_eq!(
            Batch::<U64, Entry>::view(&shifted[1..]).unwrap(),
            b.as_ref()
        );
        assert!(Batch::<U64, Entry>::view(&shifted[1..20]).is_err());
    }

    #[test]
    fn a_batch_of_bad_length_is_refused_and_zero_entries_decode() {
        type B = Batch<U64, Entry>;
        let mut out = Vec::new();
        encode_batch(&U64::new(5), &[entry(1, 1)], &mut out);
        for len in [0, 7, 9, 15] {
            let e = <Fixed as Codec<B>>::decode(&out[..len]).unwrap_err();
            assert!(
                e.detail.contains("8-byte head plus whole 8-byte entries"),
                "{len}: {}",
                e.detail
            );
        }
        let empty = <Fixed as Codec<B>>::decode(&out[..8]).unwrap();
        assert_eq!((empty.head.get(), empty.entries.len()), (5, 0));
        // A head of `()`: entries alone, none at all included.
        type E = Batch<(), Entry>;
        assert_eq!(<Fixed as Codec<E>>::decode(&[]).unwrap().entries, vec![]);
        let two = <Fixed as Codec<E>>::decode(&[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0]);
        assert_eq!(two.unwrap().entries, vec![entry(1, 0), entry(2, 3)]);
        assert!(<Fixed as Codec<E>>::decode(&[1, 2, 3]).is_err());
    }

    struct Pairs;
    impl Rpc for Pairs {
        const ID: u16 = 201;
        type Req = Batch<U64, Entry>;
        type Resp = Batch<(), U32>;
        type Codec = Fixed;
    }

    #[test]
    fn a_typed_handler_with_caller_sees_the_caller_and_the_helpers_agree() {
        let mut h = Handlers::new();
        h.register_typed_with_caller::<Pairs>(|c, b| {
            let base = u32::try_from(c.incarnation).unwrap_or(u32::MAX);
            Ok(Batch::new(
                (),
                b.entries
                    .iter()
                    .map(|e| U32::new(base + e.id.get()))
                    .collect(),
            ))
        });
        let mut req = Vec::new();
        encode_request::<Pairs>(
            &Batch::new(U64::new(0), vec![entry(1, 0), entry(2, 0)]),
            &mut req,
        )
        .unwrap();
        assert_eq!(decode_request::<Pairs>(&req).unwrap().entries.len(), 2);
        assert_eq!(view_request::<Pairs, _, _>(&req).unwrap().entries.len(), 2);
        let e = view_request::<Pairs, _, _>(&req[..3]).unwrap_err();
        assert_eq!((e.id, e.len, e.part), (201, 3, Part::Request));
        let caller = Caller {
            node: NodeId(3),
            incarnation: 40,
        };
        let mut out = Vec::new();
        assert_eq!(
            h.call_as(caller, Pairs::ID, &req, &mut out),
            MsgKind::Response
        );
        let r = decode_response::<Pairs>(&out).unwrap();
        assert_eq!(r.entries, vec![U32::new(41), U32::new(42)]);
        let mut again = Vec::new();
        encode_response::<Pairs>(&r, &mut again).unwrap();
        assert_eq!(again, out);
        // A request of a bad length is answered with the decode error, naming the RPC.
        assert_eq!(
            h.call_as(caller, Pairs::ID, &req[..12], &mut out),
            MsgKind::Error
        );
        let msg = String::from_utf8(out).unwrap();
        assert!(msg.contains("Pairs (handler 201)"), "{msg}");
        assert!(msg.contains("from 12 bytes"), "{msg}");
    }

    #[cfg(feature = "serde-codec")]
    #[test]
    fn postcard_round_trips_and_rejects_trailing_bytes() {
        let v: (String, Vec<u32>) = ("key".into(), vec![1, 300, 70000]);
        let mut out = Vec::new();
        <Postcard as Codec<(String, Vec<u32>)>>::encode(&v, &mut out).unwrap();
        assert_eq!(
            <Postcard as Codec<(String, Vec<u32>)>>::decode(&out).unwrap(),
            v
        );
        out.push(0);
        let e = <Postcard as Codec<(String, Vec<u32>)>>::decode(&out).unwrap_err();
        assert!(e.detail.contains("1 bytes left over"), "{}", e.detail);
    }
}
