//! A [`Batch`](super::Batch) with a data tail: a fixed-layout head, a count, that many
//! fixed-layout entries, then a byte area whose layout the entries (or the request the
//! message answers) describe. The shape of a message that carries variable-length
//! records, each entry giving where its record goes and how long it is, without a
//! hand-written codec and without interleaving lengths and bytes.
//!
//! Bytes: `[head: size_of::<H>()][n: u32 little-endian][n entries of size_of::<E>()]
//! [tail: the rest]`. The count is needed (unlike a plain batch's) because the tail
//! follows the entries; everything after the entries is the tail, so the view checks
//! only that the head, count and entries are there, and [`TailBatchRef::records`] (an
//! entry-described tail) or a [`TailReader`] (a tail described elsewhere) checks the
//! tail's length exactly.
//!
//! Writing: [`encode_tail_batch`] from a head, a slice of entries and the tail, or a
//! [`TailBatchWriter`] when the entries and their bytes are produced together (one
//! buffer, each record's bytes written in place, from a store say). Reading:
//! [`TailBatch::view`], [`view_tail_request`] and [`view_tail_response`] borrow the head,
//! entries and tail from the message; [`Fixed`] decodes a copied [`TailBatch`].

use std::marker::PhantomData;
use std::mem::size_of;

use super::{decode_error, CodecError, DecodeError, Fixed, Part, Rpc};
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, IntoBytes};

/// The bytes of the count between the head and the entries.
const COUNT: usize = size_of::<U32>();

/// A head, entries and a byte tail, as one message (the module docs give the bytes).
/// Its codec is [`Fixed`], for `H` and `E` that `Fixed` encodes on their own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TailBatch<H, E> {
    /// The head.
    pub head: H,
    /// The entries, in message order (at most `u32::MAX`).
    pub entries: Vec<E>,
    /// The bytes after the entries.
    pub tail: Vec<u8>,
}

impl<H, E> TailBatch<H, E> {
    /// A batch of `head`, `entries` and `tail`.
    pub fn new(head: H, entries: Vec<E>, tail: Vec<u8>) -> Self {
        Self {
            head,
            entries,
            tail,
        }
    }

    /// Its encoded length in bytes: `size_of::<H>() + 4 + entries.len() * size_of::<E>() +
    /// tail.len()`.
    pub fn encoded_len(&self) -> usize {
        size_of::<H>() + COUNT + std::mem::size_of_val(&self.entries[..]) + self.tail.len()
    }

    /// The batch as a [`TailBatchRef`].
    pub fn as_ref(&self) -> TailBatchRef<'_, H, E> {
        TailBatchRef {
            head: &self.head,
            entries: &self.entries,
            tail: &self.tail,
        }
    }
}

/// A [`TailBatch`] read in place: head, entries and tail borrowed from the message, no
/// copy and no allocation. For layouts of alignment 1 (`zerocopy::Unaligned`).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TailBatchRef<'a, H, E> {
    /// The head.
    pub head: &'a H,
    /// The entries, in message order.
    pub entries: &'a [E],
    /// Every byte after the entries.
    pub tail: &'a [u8],
}

impl<H, E> Clone for TailBatchRef<'_, H, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<H, E> Copy for TailBatchRef<'_, H, E> {}

/// The count a message of `n` entries carries. Errors: more than `u32::MAX` entries.
fn count(n: usize) -> Result<U32, CodecError> {
    u32::try_from(n)
        .map(U32::new)
        .map_err(|_| CodecError::other(format!("{n} entries exceed a tail batch's u32 count")))
}

/// Append the bytes of a [`TailBatch`] of `head`, `entries` and `tail` to `out`
/// (reserving them first): what [`Fixed`] encodes a `TailBatch` as, from slices.
///
/// Errors: more than `u32::MAX` entries (nothing is appended).
pub fn encode_tail_batch<H, E>(
    head: &H,
    entries: &[E],
    tail: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), CodecError>
where
    H: zerocopy::IntoBytes + zerocopy::Immutable,
    E: zerocopy::IntoBytes + zerocopy::Immutable,
{
    let n = count(entries.len())?;
    let entry_bytes = zerocopy::IntoBytes::as_bytes(entries);
    out.reserve(size_of::<H>() + COUNT + entry_bytes.len() + tail.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(n.as_bytes());
    out.extend_from_slice(entry_bytes);
    out.extend_from_slice(tail);
    Ok(())
}

/// Writes one [`TailBatch`] onto the end of a buffer when its entries and their bytes
/// are produced together: [`TailBatchWriter::new`] writes the head and the count `n` and
/// leaves room for `n` entries; each [`TailBatchWriter::push`] (or
/// [`TailBatchWriter::push_with`], which lets the caller fill the bytes in place) puts
/// the next entry in its slot and appends its bytes to the tail;
/// [`TailBatchWriter::finish`] checks that all `n` came. One buffer, no other
/// allocation. A writer dropped before `finish` leaves a message whose missing entries
/// are zero bytes: truncate the buffer or overwrite it.
#[derive(Debug)]
pub struct TailBatchWriter<'a, H, E> {
    out: &'a mut Vec<u8>,
    /// Where the first entry's slot starts in `out`.
    entries_at: usize,
    /// Entries announced.
    n: usize,
    /// Entries written so far.
    pushed: usize,
    _layout: PhantomData<fn(&H, &E)>,
}

impl<'a, H, E> TailBatchWriter<'a, H, E>
where
    H: zerocopy::IntoBytes + zerocopy::Immutable,
    E: zerocopy::IntoBytes + zerocopy::Immutable,
{
    /// Start a batch of `head` and `n` entries at the end of `out`, reserving
    /// `tail_hint` bytes for the tail besides the head, count and entries.
    ///
    /// Errors: `n` above `u32::MAX` (nothing is appended).
    pub fn new(
        out: &'a mut Vec<u8>,
        head: &H,
        n: usize,
        tail_hint: usize,
    ) -> Result<Self, CodecError> {
        let c = count(n)?;
        let entry_bytes = n
            .checked_mul(size_of::<E>())
            .ok_or_else(|| CodecError::other(format!("{n} entries overflow a buffer")))?;
        out.reserve(
            (size_of::<H>() + COUNT)
                .saturating_add(entry_bytes)
                .saturating_add(tail_hint),
        );
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(c.as_bytes());
        let entries_at = out.len();
        out.resize(entries_at + entry_bytes, 0);
        Ok(Self {
            out,
            entries_at,
            n,
            pushed: 0,
            _layout: PhantomData,
        })
    }

    /// Put `entry` in the next slot and append `data` to the tail.
    ///
    /// Errors: all `n` entries were already pushed (nothing is written).
    pub fn push(&mut self, entry: &E, data: &[u8]) -> Result<(), CodecError> {
        self.push_with(entry, data.len(), |b| b.copy_from_slice(data))
    }

    /// Put `entry` in the next slot, append `len` zero bytes to the tail and let `fill`
    /// write them (a record read from memory straight into the message, say).
    ///
    /// Errors: all `n` entries were already pushed (nothing is written).
    pub fn push_with(
        &mut self,
        entry: &E,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), CodecError> {
        let at = self.entries_at + self.pushed * size_of::<E>();
        let slot = (self.pushed < self.n)
            .then(|| self.out.get_mut(at..at + size_of::<E>()))
            .flatten()
            .ok_or_else(|| {
                CodecError::other(format!(
                    "a tail batch announced {} entries; one more was pushed",
                    self.n
                ))
            })?;
        slot.copy_from_slice(entry.as_bytes());
        self.pushed += 1;
        let start = self.out.len();
        self.out.resize(start + len, 0);
        fill(&mut self.out[start..]);
        Ok(())
    }

    /// Append `data` to the tail without an entry (bytes the entries do not describe
    /// one by one, such as a reply's records whose lengths the request gave).
    pub fn extend_tail(&mut self, data: &[u8]) {
        self.out.extend_from_slice(data);
    }

    /// End the batch.
    ///
    /// Errors: fewer than the `n` entries announced were pushed (their slots hold zero
    /// bytes).
    pub fn finish(self) -> Result<(), CodecError> {
        if self.pushed != self.n {
            return Err(CodecError::other(format!(
                "a tail batch announced {} entries but got {}",
                self.n, self.pushed
            )));
        }
        Ok(())
    }
}

/// Zero-sized entries would let a small message announce billions of them.
fn no_zero_sized<E>() -> Result<(), CodecError> {
    if size_of::<E>() == 0 {
        return Err(CodecError::other(
            "a tail batch's entries must not be zero-sized",
        ));
    }
    Ok(())
}

/// The error of bytes too short for an `H` head, a count and `n` `E` entries.
fn short<H, E>(len: usize, n: Option<u32>) -> CodecError {
    let want = match n {
        Some(n) => format!("{n} entries of {} bytes", size_of::<E>()),
        None => "a 4-byte count".into(),
    };
    CodecError::other(format!(
        "{len} bytes are too few for a {}-byte head, {want}",
        size_of::<H>()
    ))
}

impl<H, E> TailBatch<H, E>
where
    H: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
    E: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
{
    /// Read a tail batch's bytes in place.
    ///
    /// Errors: zero-sized entries; fewer bytes than the head, the count and the count's entries (any bytes
    /// after the entries are the tail; check its length with
    /// [`TailBatchRef::records`] or a [`TailReader`]).
    pub fn view(bytes: &[u8]) -> Result<TailBatchRef<'_, H, E>, CodecError> {
        no_zero_sized::<E>()?;
        let (head, rest) =
            H::ref_from_prefix(bytes).map_err(|_| short::<H, E>(bytes.len(), None))?;
        let (n, rest) =
            U32::read_from_prefix(rest).map_err(|_| short::<H, E>(bytes.len(), None))?;
        let n_entries = usize::try_from(n.get()).unwrap_or(usize::MAX);
        let (entries, tail) =
            <[E] as zerocopy::FromBytes>::ref_from_prefix_with_elems(rest, n_entries)
                .map_err(|_| short::<H, E>(bytes.len(), Some(n.get())))?;
        Ok(TailBatchRef {
            head,
            entries,
            tail,
        })
    }
}

impl<'a, H, E> TailBatchRef<'a, H, E> {
    /// Each entry with its bytes, for a tail the entries describe: `len_of(entry)` bytes
    /// each, in entry order, filling the tail exactly.
    ///
    /// Errors: the entries' lengths do not add up to the tail's length (a short or long
    /// message), or overflow.
    pub fn records<F>(&self, len_of: F) -> Result<Records<'a, E, F>, CodecError>
    where
        F: Fn(&E) -> usize,
    {
        let mut sum = 0usize;
        for e in self.entries {
            sum = sum
                .checked_add(len_of(e))
                .ok_or_else(|| CodecError::other("the entries' lengths overflow"))?;
        }
        if sum != self.tail.len() {
            return Err(CodecError::other(format!(
                "the entries describe {sum} tail bytes; the message has {}",
                self.tail.len()
            )));
        }
        Ok(Records {
            entries: self.entries.iter(),
            tail: TailReader::new(self.tail),
            len_of,
        })
    }

    /// A reader over the tail, for a tail whose layout is described elsewhere.
    pub fn tail_reader(&self) -> TailReader<'a> {
        TailReader::new(self.tail)
    }
}

/// The entries of a [`TailBatchRef`] with their bytes ([`TailBatchRef::records`]).
pub struct Records<'a, E, F> {
    entries: std::slice::Iter<'a, E>,
    tail: TailReader<'a>,
    len_of: F,
}

impl<E: std::fmt::Debug, F> std::fmt::Debug for Records<'_, E, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records")
            .field("entries", &self.entries)
            .field("tail", &self.tail)
            .finish_non_exhaustive()
    }
}

impl<'a, E, F: Fn(&E) -> usize> Iterator for Records<'a, E, F> {
    type Item = (&'a E, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let e = self.entries.next()?;
        // The lengths were checked to fill the tail; a `len_of` that answers differently
        // the second time ends the iteration rather than panicking.
        let data = self.tail.take((self.len_of)(e)).ok()?;
        Some((e, data))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.entries.len()))
    }
}

/// Cuts a byte area into consecutive pieces of given lengths, each cut checked: the
/// tail of a [`TailBatch`] described by something other than its entries (the request a
/// reply answers), or any byte area that is a sequence of records. Borrowed, no copy.
#[derive(Clone, Debug)]
pub struct TailReader<'a> {
    rest: &'a [u8],
}

impl<'a> TailReader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    /// The next `len` bytes.
    ///
    /// Errors: fewer than `len` bytes are left (nothing is consumed).
    pub fn take(&mut self, len: usize) -> Result<&'a [u8], CodecError> {
        let Some((piece, rest)) = self.rest.split_at_checked(len) else {
            return Err(CodecError::other(format!(
                "wanted {len} more tail bytes, {} left",
                self.rest.len()
            )));
        };
        self.rest = rest;
        Ok(piece)
    }

    /// The bytes not yet taken.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// Check that every byte was taken.
    ///
    /// Errors: bytes are left over (a long message).
    pub fn finish(self) -> Result<(), CodecError> {
        if !self.rest.is_empty() {
            return Err(CodecError::other(format!(
                "{} tail bytes left over after the last record",
                self.rest.len()
            )));
        }
        Ok(())
    }
}

/// `R`'s request read in place ([`TailBatch::view`]), for an [`Rpc`] whose request is a
/// [`TailBatch`] of alignment-1 layouts (the server side of a message with a data tail).
///
/// Errors: [`DecodeError`] naming `R` and the length received, for bytes too short for
/// the head, count and entries.
pub fn view_tail_request<R, H, E>(bytes: &[u8]) -> Result<TailBatchRef<'_, H, E>, DecodeError>
where
    R: Rpc<Req = TailBatch<H, E>>,
    H: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
    E: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
{
    TailBatch::view(bytes).map_err(|e| decode_error::<R>(e, bytes.len(), Part::Request))
}

/// `R`'s response read in place, as [`view_tail_request`] reads a request.
///
/// Errors: as [`view_tail_request`]'s, for the response.
pub fn view_tail_response<R, H, E>(bytes: &[u8]) -> Result<TailBatchRef<'_, H, E>, DecodeError>
where
    R: Rpc<Resp = TailBatch<H, E>>,
    H: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
    E: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable + zerocopy::Unaligned,
{
    TailBatch::view(bytes).map_err(|e| decode_error::<R>(e, bytes.len(), Part::Response))
}

impl<H, E> super::Codec<TailBatch<H, E>> for Fixed
where
    H: zerocopy::FromBytes + zerocopy::IntoBytes + zerocopy::Immutable,
    E: zerocopy::FromBytes + zerocopy::IntoBytes + zerocopy::Immutable,
{
    fn encode(value: &TailBatch<H, E>, out: &mut Vec<u8>) -> Result<(), CodecError> {
        encode_tail_batch(&value.head, &value.entries, &value.tail, out)
    }

    fn decode(bytes: &[u8]) -> Result<TailBatch<H, E>, CodecError> {
        no_zero_sized::<E>()?;
        let (head, rest) =
            H::read_from_prefix(bytes).map_err(|_| short::<H, E>(bytes.len(), None))?;
        let (n, rest) =
            U32::read_from_prefix(rest).map_err(|_| short::<H, E>(bytes.len(), None))?;
        let entry_bytes = usize::try_from(n.get())
            .ok()
            .and_then(|n| n.checked_mul(size_of::<E>()))
            .filter(|&b| b <= rest.len())
            .ok_or_else(|| short::<H, E>(bytes.len(), Some(n.get())))?;
        let (entries, tail) = rest.split_at(entry_bytes);
        let entries = entries
            .chunks_exact(size_of::<E>())
            .map(|c| E::read_from_bytes(c).map_err(|_| short::<H, E>(bytes.len(), Some(n.get()))))
            .collect::<Result<_, _>>()?;
        Ok(TailBatch {
            head,
            entries,
            tail: tail.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Batch, Codec};
    use super::*;
    use zerocopy::little_endian::U64;

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
    struct Rec {
        off: U64,
        len: U32,
    }

    fn rec(off: u64, len: u32) -> Rec {
        Rec {
            off: U64::new(off),
            len: U32::new(len),
        }
    }

    fn len_of(r: &Rec) -> usize {
        r.len.get() as usize
    }

    type T = TailBatch<U64, Rec>;

    fn sample() -> T {
        TailBatch::new(
            U64::new(9),
            vec![rec(16, 2), rec(32, 3)],
            vec![1, 2, 3, 4, 5],
        )
    }

    #[test]
    fn a_tail_batch_is_head_count_entries_tail_and_round_trips() {
        let b = sample();
        let mut out = Vec::new();
        <Fixed as Codec<T>>::encode(&b, &mut out).unwrap();
        assert_eq!(out.len(), b.encoded_len());
        assert_eq!(out.len(), 8 + 4 + 2 * 12 + 5);
        assert_eq!(&out[..12], &[9, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(&out[12..20], &[16, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&out[out.len() - 5..], &[1, 2, 3, 4, 5]);
        assert_eq!(<Fixed as Codec<T>>::decode(&out), Ok(b.clone()));
        let v = T::view(&out).unwrap();
        assert_eq!(v, b.as_ref());
        let recs: Vec<_> = v.records(len_of).unwrap().collect();
        assert_eq!(
            recs,
            vec![
                (&b.entries[0], &[1, 2][..]),
                (&b.entries[1], &[3, 4, 5][..])
            ]
        );
        // Any offset will do for alignment-1 layouts.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&out);
        assert_eq!(T::view(&shifted[1..]).unwrap(), b.as_ref());
    }

    #[test]
    fn every_truncation_and_every_extension_is_an_error_not_a_panic() {
        let mut out = Vec::new();
        encode_tail_batch(
            &U64::new(9),
            &[rec(16, 2), rec(32, 3)],
            &[1, 2, 3, 4, 5],
            &mut out,
        )
        .unwrap();
        for len in 0..out.len() {
            let short = &out[..len];
            // Too short for the head, count and entries: the view refuses it; within the
            // tail, the records' check does.
            let refused = match T::view(short) {
                Err(e) => {
                    assert!(e.detail.contains("too few"), "{len}: {}", e.detail);
                    assert!(<Fixed as Codec<T>>::decode(short).is_err(), "{len}");
                    true
                }
                Ok(v) => v.records(len_of).is_err(),
            };
            assert!(refused, "{len} bytes accepted");
        }
        let mut long = out.clone();
        long.push(0);
        let e = T::view(&long).unwrap().records(len_of).unwrap_err();
        assert!(
            e.detail
                .contains("describe 5 tail bytes; the message has 6"),
            "{}",
            e.detail
        );
        // A count far beyond the bytes present.
        let mut huge = out.clone();
        huge[8..12].copy_from_slice(&[0xff; 4]);
        let e = T::view(&huge).unwrap_err();
        assert!(
            e.detail.contains("4294967295 entries of 12 bytes"),
            "{}",
            e.detail
        );
        assert!(<Fixed as Codec<T>>::decode(&huge).is_err());
        // Garbage of every short length.
        for len in 0..40 {
            let g: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            if let Ok(v) = T::view(&g) {
                let _ = v.records(len_of).map(|r| r.count());
            }
            let _ = <Fixed as Codec<T>>::decode(&g);
        }
    }

    #[test]
    fn entry_lengths_that_overflow_are_refused() {
        let mut out = Vec::new();
        let big = rec(0, u32::MAX);
        encode_tail_batch(&U64::new(0), &[big.clone(), big], &[], &mut out).unwrap();
        let v = T::view(&out).unwrap();
        assert!(v.records(|_| usize::MAX).is_err());
        assert!(v.records(len_of).is_err());
    }

    #[test]
    fn the_writer_writes_what_encode_tail_batch_writes_and_checks_the_count() {
        let b = sample();
        let mut want = vec![0xee];
        encode_tail_batch(&b.head, &b.entries, &b.tail, &mut want).unwrap();
        let mut out = vec![0xee];
        let mut w = TailBatchWriter::new(&mut out, &b.head, 2, 5).unwrap();
        w.push(&b.entries[0], &[1, 2]).unwrap();
        w.push_with(&b.entries[1], 3, |buf| buf.copy_from_slice(&[3, 4, 5]))
            .unwrap();
        assert!(w.push(&rec(0, 0), &[]).is_err(), "a third entry of two");
        w.finish().unwrap();
        assert_eq!(out, want);

        let mut out = Vec::new();
        let mut w = TailBatchWriter::new(&mut out, &b.head, 2, 0).unwrap();
        w.push(&b.entries[0], &[1, 2]).unwrap();
        let e = w.finish().unwrap_err();
        assert!(
            e.detail.contains("announced 2 entries but got 1"),
            "{}",
            e.detail
        );

        // A tail described elsewhere: no entries, bytes appended.
        let mut out = Vec::new();
        let mut w = TailBatchWriter::<U64, Rec>::new(&mut out, &U64::new(1), 0, 3).unwrap();
        w.extend_tail(&[7, 8, 9]);
        w.finish().unwrap();
        let v = T::view(&out).unwrap();
        assert_eq!(
            (v.head.get(), v.entries.len(), v.tail),
            (1, 0, &[7, 8, 9][..])
        );
    }

    #[test]
    fn a_tail_reader_cuts_exactly_and_refuses_short_and_long() {
        let mut r = TailReader::new(&[1, 2, 3, 4]);
        assert_eq!(r.take(1).unwrap(), &[1]);
        let e = r.take(4).unwrap_err();
        assert!(
            e.detail.contains("wanted 4 more tail bytes, 3 left"),
            "{}",
            e.detail
        );
        assert_eq!(r.remaining(), 3, "a failed take consumes nothing");
        assert_eq!(r.take(2).unwrap(), &[2, 3]);
        let e = r.clone().finish().unwrap_err();
        assert!(e.detail.contains("1 tail bytes left over"), "{}", e.detail);
        assert_eq!(r.take(1).unwrap(), &[4]);
        r.finish().unwrap();
    }

    #[derive(
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::Immutable,
        zerocopy::KnownLayout,
        zerocopy::Unaligned,
        Debug,
    )]
    #[repr(C)]
    struct Nothing;

    #[test]
    fn zero_sized_entries_are_refused() {
        type Z = TailBatch<U64, Nothing>;
        let bytes = [0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff];
        assert!(Z::view(&bytes).unwrap_err().detail.contains("zero-sized"));
        assert!(<Fixed as Codec<Z>>::decode(&bytes).is_err());
    }

    struct Put;
    impl Rpc for Put {
        const ID: u16 = 210;
        type Req = TailBatch<U64, Rec>;
        type Resp = Batch<(), u8>;
        type Codec = Fixed;
    }

    #[test]
    fn views_of_requests_and_responses_name_the_rpc() {
        let mut req = Vec::new();
        super::super::encode_request::<Put>(&sample(), &mut req).unwrap();
        let v = view_tail_request::<Put, _, _>(&req).unwrap();
        assert_eq!(v.entries.len(), 2);
        let e = view_tail_request::<Put, _, _>(&req[..10]).unwrap_err();
        assert_eq!((e.id, e.len, e.part), (210, 10, Part::Request));
        assert!(e.to_string().contains("Put (handler 210)"), "{e}");

        struct Get;
        impl Rpc for Get {
            const ID: u16 = 211;
            type Req = ();
            type Resp = TailBatch<U64, Rec>;
            type Codec = Fixed;
        }
        let e = view_tail_response::<Get, _, _>(&[1, 2]).unwrap_err();
        assert_eq!((e.id, e.len, e.part), (211, 2, Part::Response));
        assert!(view_tail_response::<Get, _, _>(&req).is_ok());
    }
}
