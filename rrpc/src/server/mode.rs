//! What a request asks for and how its reply travels, as pure functions: parsing a
//! request's header flags and prefixes (bytes a peer controls), and deciding the reply's
//! route from the request's mode and the reply's size (Scythe,
//! 4.6 (2), Fig. 20).

use crate::wire::{FetchPrefix, ReplyMode, ZeroCopyPrefix};

/// A request's parts, borrowed from its message payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// How the reply travels.
    pub mode: ReplyMode,
    /// The mode's prefix ([`ZeroCopyPrefix`] for zero-copy, else empty).
    pub prefix: &'a [u8],
    /// Where to READ the request from, when it was sent by reference.
    pub fetch: Option<FetchPrefix>,
    /// The request payload (empty when sent by reference).
    pub body: &'a [u8],
}

/// Why a request message is malformed; the text goes back to the caller.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The reply-mode bits name no mode.
    #[error("unknown reply mode {0}")]
    UnknownMode(u8),
    /// The payload is shorter than its prefixes.
    #[error("request of {have} bytes is shorter than its {need}-byte prefix")]
    Short {
        /// Bytes the prefixes need.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
}

/// Parse a request message: `flags` from its header (the [`ReplyMode`] in the low bits,
/// [`FetchPrefix::FLAG`]), `payload` its bytes: the mode's prefix, then a
/// [`FetchPrefix`] if flagged, then the body. Never panics on any input.
pub fn parse_request(flags: u8, payload: &[u8]) -> Result<Request<'_>, RequestError> {
    let mode =
        ReplyMode::from_u8(flags & !FetchPrefix::FLAG).ok_or(RequestError::UnknownMode(flags))?;
    let fetch = flags & FetchPrefix::FLAG != 0;
    let need = mode.prefix_bytes() + if fetch { FetchPrefix::BYTES } else { 0 };
    if payload.len() < need {
        return Err(RequestError::Short {
            need,
            have: payload.len(),
        });
    }
    let (prefix, rest) = payload.split_at(mode.prefix_bytes());
    let (fetch, body) = if fetch {
        let (f, body) = rest.split_at(FetchPrefix::BYTES);
        (FetchPrefix::from_bytes(f), body)
    } else {
        (None, rest)
    };
    Ok(Request {
        mode,
        prefix,
        fetch,
        body,
    })
}

/// Where a reply goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Inline in the response Rocket.
    Inline,
    /// Into a server buffer the caller READs (RPC + READ).
    Read,
    /// WRITten into the caller's buffer (zero-copy), followed by the generation word.
    ZeroCopy(ZeroCopyPrefix),
}

/// Why a reply cannot be sent as asked; the text goes back to the caller.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// A pure-RPC reply larger than a bucket carries.
    #[error(
        "reply of {len} bytes exceeds the {max}-byte limit of pure RPC mode; call with the Read or ZeroCopy mode"
    )]
    TooLargeInline {
        /// Reply bytes.
        len: usize,
        /// Bucket payload limit in bytes.
        max: usize,
    },
    /// A zero-copy reply larger than the caller's buffer.
    #[error("reply of {len} bytes exceeds the caller's {capacity}-byte zero-copy buffer")]
    TooLargeZeroCopy {
        /// Reply bytes.
        len: usize,
        /// The caller's buffer in bytes.
        capacity: u32,
    },
    /// A zero-copy request without its prefix.
    #[error("malformed zero-copy prefix")]
    MalformedPrefix,
}

/// The route of a reply of `len` bytes to a request in `mode` with mode prefix `prefix`,
/// given the bucket payload limit `max_inline` and the caller's Auto threshold
/// `threshold` (bytes).
pub fn route(
    mode: ReplyMode,
    prefix: &[u8],
    len: usize,
    max_inline: usize,
    threshold: usize,
) -> Result<Route, RouteError> {
    match mode {
        ReplyMode::Rpc if len > max_inline => Err(RouteError::TooLargeInline {
            len,
            max: max_inline,
        }),
        ReplyMode::Rpc => Ok(Route::Inline),
        ReplyMode::Auto if len > threshold.min(max_inline) => Ok(Route::Read),
        ReplyMode::Auto => Ok(Route::Inline),
        ReplyMode::Read => Ok(Route::Read),
        ReplyMode::ZeroCopy => {
            let z = ZeroCopyPrefix::from_bytes(prefix).ok_or(RouteError::MalformedPrefix)?;
            if len > z.capacity as usize {
                return Err(RouteError::TooLargeZeroCopy {
                    len,
                    capacity: z.capacity,
                });
            }
            Ok(Route::ZeroCopy(z))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_mode_and_size() {
        let r = |m, len| route(m, &[], len, 480, 512);
        assert_eq!(r(ReplyMode::Rpc, 480), Ok(Route::Inline));
        assert!(matches!(
            r(ReplyMode::Rpc, 481),
            Err(RouteError::TooLargeInline { .. })
        ));
        assert_eq!(r(ReplyMode::Auto, 480), Ok(Route::Inline));
        // Auto goes by READ above the smaller of threshold and bucket limit.
        assert_eq!(r(ReplyMode::Auto, 481), Ok(Route::Read));
        assert_eq!(route(ReplyMode::Auto, &[], 300, 480, 256), Ok(Route::Read));
        assert_eq!(r(ReplyMode::Read, 0), Ok(Route::Read));
        assert_eq!(r(ReplyMode::ZeroCopy, 1), Err(RouteError::MalformedPrefix));
        let z = ZeroCopyPrefix {
            addr: 4096,
            rkey: 7,
            capacity: 100,
        };
        let p = z.to_bytes();
        assert_eq!(
            route(ReplyMode::ZeroCopy, &p, 100, 480, 512),
            Ok(Route::ZeroCopy(z))
        );
        assert!(matches!(
            route(ReplyMode::ZeroCopy, &p, 101, 480, 512),
            Err(RouteError::TooLargeZeroCopy { .. })
        ));
    }
}
