//! A typed key-value service: `Put` and `Get` defined once as [`Rpc`] types with
//! fixed zerocopy layouts, served by a node with `register_typed` and called with
//! `call_typed`, both sides in one process over the shm fabric (node 1 serves, node 2
//! calls). Uses only rrpc's default features.
//!
//! ```text
//! cargo run -p rrpc --example kv_typed [-- CLUSTER]
//! ```
//!
//! Prints one line per step and `kv_typed: ok` at the end; a failure is an error exit.

use std::collections::HashMap;
use std::io::Write;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use rrpc::fabric::shm::ClusterGuard;
use rrpc::prelude::*;
use rrpc::server::ids::FIRST_APP_ID;
use rrpc::typed::zerocopy::{self, little_endian::U64};

/// `Put` request: store `value` under `key`.
#[derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, Debug)]
#[zerocopy(crate = "rrpc::typed::zerocopy")]
#[repr(C)]
struct PutReq {
    key: U64,
    value: U64,
}

/// `Get` response (and `Put`'s: the value replaced): `found` is 1 when the key had a
/// value, which is then `value`.
#[derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable, Debug, PartialEq)]
#[zerocopy(crate = "rrpc::typed::zerocopy")]
#[repr(C)]
struct Lookup {
    found: U64,
    value: U64,
}

impl Lookup {
    fn of(v: Option<u64>) -> Self {
        Self {
            found: U64::new(v.is_some().into()),
            value: U64::new(v.unwrap_or(0)),
        }
    }

    fn get(&self) -> Option<u64> {
        (self.found.get() == 1).then(|| self.value.get())
    }
}

/// Store a value; answers with the one it replaced.
struct Put;
impl Rpc for Put {
    const ID: u16 = FIRST_APP_ID;
    type Req = PutReq;
    type Resp = Lookup;
    type Codec = Fixed;
}

/// Look a key up.
struct Get;
impl Rpc for Get {
    const ID: u16 = FIRST_APP_ID + 1;
    type Req = U64;
    type Resp = Lookup;
    type Codec = Fixed;
}

/// The server's handlers over one shared map.
fn kv_handlers() -> Handlers {
    let map = Arc::new(Mutex::new(HashMap::<u64, u64>::new()));
    let mut h = Handlers::new();
    let m = map.clone();
    h.register_typed::<Put>(move |r| {
        let mut m = m.lock().map_err(|_| "map poisoned")?;
        Ok(Lookup::of(m.insert(r.key.get(), r.value.get())))
    });
    h.register_typed::<Get>(move |k| {
        let m = map.lock().map_err(|_| "map poisoned")?;
        Ok(Lookup::of(m.get(&k.get()).copied()))
    });
    h
}

/// Start the server on `cluster`, put and get through a client and write what happens
/// to `out`. Errors: any step failing, or a reply other than the one expected.
fn run(cluster: &str, out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    let (guard, _) = ClusterGuard::new(cluster)?;
    let node = Node::start(
        guard.open(NodeId(1))?,
        NodeConfig::new("kv", "127.0.0.1:0".parse()?).rpc(kv_handlers(), 1),
    )?;
    writeln!(out, "server: node 1 on {}", node.addr())?;

    let rt = Runtime::new(guard.open(NodeId(2))?, RuntimeConfig::default());
    let ctx = rt.thread_ctx()?;
    let server = ctx.connect_rpc(node.addr())?.node;
    let c = ctx.clone();
    let lines = block_on(&ctx, async move { session(c, server).await })?;
    for l in lines {
        writeln!(out, "{l}")?;
    }
    writeln!(out, "kv_typed: ok")?;
    drop(ctx);
    drop(rt);
    drop(node);
    Ok(())
}

/// The client's calls; returns the lines to print.
async fn session(ctx: Rc<ThreadCtx>, server: NodeId) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    for (k, v) in [(1u64, 10u64), (2, 20), (1, 11)] {
        let req = PutReq {
            key: U64::new(k),
            value: U64::new(v),
        };
        let old = ctx
            .call_typed::<Put>(server, &req)
            .await
            .map_err(|e| e.to_string())?;
        lines.push(format!("put {k} = {v}: replaced {:?}", old.get()));
    }
    for k in [1u64, 2, 3] {
        let v = ctx
            .call_typed::<Get>(server, &U64::new(k))
            .await
            .map_err(|e| e.to_string())?;
        lines.push(format!("get {k}: {:?}", v.get()));
    }
    // A request of the wrong size (raw bytes to Get's id) is refused by the typed layer
    // with a message naming the RPC and both lengths.
    match ctx.call(server, Get::ID, &[0; 3]).await {
        Err(CallError::Remote { msg, .. }) => lines.push(format!("bad get refused: {msg}")),
        other => return Err(format!("a 3-byte Get request was answered: {other:?}")),
    }
    Ok(lines)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cluster = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("kv-typed-{}", std::process::id()));
    run(&cluster, &mut std::io::stdout().lock())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_puts_gets_and_refuses_a_malformed_request() {
        let mut out = Vec::new();
        run(&format!("kv-typed-test-{}", std::process::id()), &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = out.lines().skip(1).collect();
        assert_eq!(
            &lines[..6],
            [
                "put 1 = 10: replaced None",
                "put 2 = 20: replaced None",
                "put 1 = 11: replaced Some(10)",
                "get 1: Some(11)",
                "get 2: Some(20)",
                "get 3: None",
            ]
        );
        assert!(lines[6].starts_with("bad get refused: "), "{out}");
        assert!(lines[6].contains("Get (handler 101)"), "{out}");
        assert!(
            lines[6].contains("from 3 bytes (its layout has 8)"),
            "{out}"
        );
        assert_eq!(lines[7], "kv_typed: ok");
    }
}
