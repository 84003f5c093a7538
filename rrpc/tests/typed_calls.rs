//! Typed RPCs over a fabric: `call_typed` against `register_typed` and
//! `register_typed_async`, the typed errors a caller sees (a response of the wrong size,
//! a request the server cannot decode, a handler's error), large replies through
//! `call_typed_with`, and (feature `serde-codec`) the postcard codec.

mod common;

use rrpc::prelude::*;
use rrpc::server::ids::FIRST_APP_ID;
use rrpc::typed::zerocopy::little_endian::{U32, U64};
use rrpc::typed::{zerocopy, Part};

/// A fixed-layout request.
#[derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, Debug)]
#[zerocopy(crate = "rrpc::typed::zerocopy")]
#[repr(C)]
struct Mul {
    a: U32,
    b: U32,
}

/// Multiplies, in a plain handler.
struct MulRpc;
impl Rpc for MulRpc {
    const ID: u16 = FIRST_APP_ID;
    type Req = Mul;
    type Resp = U64;
    type Codec = Fixed;
}

/// Doubles, in an async handler.
struct DoubleAsync;
impl Rpc for DoubleAsync {
    const ID: u16 = FIRST_APP_ID + 1;
    type Req = U64;
    type Resp = U64;
    type Codec = Fixed;
}

/// Registered as raw bytes on the server (3 bytes back), so its typed response cannot
/// decode on the client.
struct Short;
impl Rpc for Short {
    const ID: u16 = FIRST_APP_ID + 2;
    type Req = U64;
    type Resp = U64;
    type Codec = Fixed;
}

/// A 64 KiB fixed response, for the large-reply modes.
struct Big;
impl Rpc for Big {
    const ID: u16 = FIRST_APP_ID + 3;
    type Req = U64;
    type Resp = [U64; 8192];
    type Codec = Fixed;
}

fn handlers() -> Handlers {
    let mut h = Handlers::new();
    h.register_typed::<MulRpc>(|m| {
        if m.b.get() == 0 {
            return Err("b is zero".into());
        }
        Ok(U64::new(u64::from(m.a.get()) * u64::from(m.b.get())))
    });
    h.register_typed_async::<DoubleAsync, _, _>(|x| async move {
        // Awaits on the server thread's runtime before answering.
        if let Some(ctx) = ThreadCtx::current() {
            ctx.yield_now().await;
        }
        Ok(U64::new(x.get() * 2))
    });
    h.register(Short::ID, |_, out| {
        out.extend_from_slice(&[1, 2, 3]);
        Ok(())
    });
    h.register_typed::<Big>(|x| Ok([x; 8192]));
    h
}

#[test]
fn typed_calls_answer_and_fail_with_typed_errors() {
    let c = common::setup("typed", "calls");
    let server = common::server_with(c.name(), handlers(), 1);
    let ctx = ThreadCtx::new(common::fabric(c.name(), 2), RuntimeConfig::default()).unwrap();
    let node = ctx.connect_rpc(server.addr()).unwrap().node;
    let cx = ctx.clone();
    block_on(&ctx, async move {
        let m = Mul {
            a: U32::new(6),
            b: U32::new(7),
        };
        assert_eq!(cx.call_typed::<MulRpc>(node, &m).await.unwrap().get(), 42);
        assert_eq!(
            cx.call_typed::<DoubleAsync>(node, &U64::new(21))
                .await
                .unwrap()
                .get(),
            42
        );

        // The handler's own error.
        let zero = Mul {
            a: U32::new(1),
            b: U32::new(0),
        };
        match cx.call_typed::<MulRpc>(node, &zero).await {
            Err(TypedCallError::Call(CallError::Remote { msg, handler, .. })) => {
                assert_eq!((msg.as_str(), handler), ("b is zero", MulRpc::ID));
            }
            other => panic!("want the handler's error, got {other:?}"),
        }

        // A response of the wrong size: the client's decode error names the RPC and
        // both lengths.
        match cx.call_typed::<Short>(node, &U64::new(1)).await {
            Err(TypedCallError::Decode(e)) => {
                assert_eq!(
                    (e.id, e.part, e.len, e.expected_len),
                    (Short::ID, Part::Response, 3, Some(8))
                );
                assert!(e.rpc.ends_with("Short"), "{}", e.rpc);
            }
            other => panic!("want a decode error, got {other:?}"),
        }

        // A request of the wrong size: the server's decode error comes back as text.
        match cx.call(node, DoubleAsync::ID, &[0; 5]).await {
            Err(CallError::Remote { msg, .. }) => {
                assert!(
                    msg.contains("DoubleAsync (handler 101): cannot decode the request from 5 bytes (its layout has 8)"),
                    "{msg}"
                );
            }
            other => panic!("want the server's decode error, got {other:?}"),
        }

        // A 64 KiB response through each large-reply mode.
        for mode in [ReplyMode::Read, ReplyMode::ZeroCopy, ReplyMode::Auto] {
            let opts = CallOpts {
                mode,
                reply_len: Some(8192 * 8),
                ..CallOpts::default()
            };
            let r = cx
                .call_typed_with::<Big>(node, &U64::new(9), opts)
                .await
                .unwrap();
            assert!(r.iter().all(|x| x.get() == 9), "{mode:?}");
        }
    });
}

#[cfg(feature = "serde-codec")]
#[test]
fn postcard_typed_calls_carry_variable_length_values() {
    use rrpc::typed::Postcard;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    enum Cmd {
        Concat(Vec<String>),
        Len(String),
    }
    struct Text;
    impl Rpc for Text {
        const ID: u16 = FIRST_APP_ID + 10;
        type Req = Cmd;
        type Resp = Result<String, u64>;
        type Codec = Postcard;
    }

    let mut h = Handlers::new();
    h.register_typed::<Text>(|c| {
        Ok(match c {
            Cmd::Concat(v) => Ok(v.concat()),
            Cmd::Len(s) => Err(s.len() as u64),
        })
    });
    let c = common::setup("typed", "postcard");
    let server = common::server_with(c.name(), h, 1);
    let ctx = ThreadCtx::new(common::fabric(c.name(), 2), RuntimeConfig::default()).unwrap();
    let node = ctx.connect_rpc(server.addr()).unwrap().node;
    let cx = ctx.clone();
    block_on(&ctx, async move {
        let words = vec!["typed".to_string(), " ".into(), "rpc".into()];
        assert_eq!(
            cx.call_typed::<Text>(node, &Cmd::Concat(words))
                .await
                .unwrap(),
            Ok("typed rpc".to_string())
        );
        let long = "x".repeat(3000);
        assert_eq!(
            cx.call_typed::<Text>(node, &Cmd::Len(long)).await.unwrap(),
            Err(3000)
        );
    });
}
