//! The configuration structs as an embedding crate builds them. They are
//! `#[non_exhaustive]`, so outside rrpc (and an integration test is outside) a struct
//! literal does not compile, not even with `..Default::default()`: a crate starts from
//! `default()` or `new` and chains the `with_<field>` setters, or assigns the public
//! fields on a `let mut` binding. Each setter changes its field and nothing else, and
//! TOML still reads into the structs.

use std::collections::BTreeMap;
use std::time::Duration;

use rrpc::fabric::{FabricConfig, FabricKind};
use rrpc::node::{NodeConfig, RpcSettings};
use rrpc::rocket::RocketConfig;
use rrpc::runtime::RuntimeConfig;
use rrpc::server::{Handlers, ServerConfig};
use rrpc::straw::StrawConfig;
use rrpc::wire::Batching;
use rrpc::NodeId;

#[test]
fn runtime_config_is_built_with_setters() {
    let c = RuntimeConfig::default()
        .with_rocket(RocketConfig::new(1024, 32))
        .with_batching(Batching::Msg)
        .with_call_timeout(Duration::from_millis(250))
        .with_connect_timeout(Duration::from_secs(3))
        .with_sq_depth(64)
        .with_threads_per_qp(2)
        .with_mode_threshold(256)
        .with_buffer_bytes(8 << 20)
        .with_max_transfer(1 << 20)
        .with_reconnect_give_up(Duration::from_millis(500));
    c.validate().unwrap();
    // The same through field assignment on a binding.
    let mut m = RuntimeConfig::default();
    m.rocket.bucket_size = 1024;
    m.rocket.buckets = 32;
    m.batching = Batching::Msg;
    m.call_timeout = Duration::from_millis(250);
    m.connect_timeout = Duration::from_secs(3);
    m.sq_depth = 64;
    m.threads_per_qp = 2;
    m.mode_threshold = 256;
    m.buffer_bytes = 8 << 20;
    m.max_transfer = 1 << 20;
    m.reconnect_give_up = Duration::from_millis(500);
    assert_eq!(c, m);
    // And through TOML.
    let t: RuntimeConfig = toml::from_str(
        "batching = \"msg\"\ncall-timeout-ms = 250\nconnect-timeout-ms = 3000\nsq-depth = 64\n\
         threads-per-qp = 2\nmode-threshold = 256\nbuffer-bytes = 8388608\n\
         max-transfer = 1048576\nreconnect-give-up-ms = 500\n\
         [rocket]\nbucket-size = 1024\nbuckets = 32\n",
    )
    .unwrap();
    assert_eq!(c, t);
    let s = c.straw_config();
    assert_eq!((s.threads_per_qp, s.sq_depth), (2, 64));
}

#[test]
fn rocket_and_straw_configs_are_built_with_setters() {
    const SMALL: RocketConfig = RocketConfig::new(128, 4);
    assert_eq!((SMALL.bucket_size, SMALL.buckets), (128, 4));
    let r = RocketConfig::default().with_buckets(8);
    assert_eq!(r, RocketConfig::new(512, 8));
    assert_eq!(r.with_bucket_size(256), RocketConfig::new(256, 8));
    r.validate().unwrap();

    let s = StrawConfig::default()
        .with_threads_per_qp(1)
        .with_sq_depth(16)
        .with_connect_timeout(Duration::from_secs(1))
        .with_reconnect_give_up(Duration::from_millis(100));
    assert_eq!(s.threads_per_qp, 1);
    assert_eq!(s.sq_depth, 16);
    assert_eq!(s.connect_timeout, Duration::from_secs(1));
    assert_eq!(s.reconnect_give_up, Duration::from_millis(100));
}

#[test]
fn server_config_and_rpc_settings_are_built_with_setters() {
    let s = ServerConfig::default()
        .with_threads(2)
        .with_buffer_bytes(16 << 20)
        .with_max_reply_bytes(1 << 20)
        .with_read_hold(Duration::from_millis(300))
        .with_cores(vec![0, 1])
        .with_max_ring_bytes(1 << 20)
        .with_max_rockets_per_straw(8)
        .with_idle_sleep_us(50);
    s.validate().unwrap();
    let t: ServerConfig = toml::from_str(
        "threads = 2\nbuffer-bytes = 16777216\nmax-reply-bytes = 1048576\nread-hold-ms = 300\n\
         cores = [0, 1]\nmax-ring-bytes = 1048576\nmax-rockets-per-straw = 8\n\
         idle-sleep-us = 50\n",
    )
    .unwrap();
    assert_eq!(s, t);

    let rt = RuntimeConfig::default().with_sq_depth(128);
    let settings = RpcSettings::default()
        .with_runtime(rt.clone())
        .with_server(s.clone());
    assert_eq!((settings.runtime, settings.server), (rt, s));
}

#[test]
fn fabric_and_node_configs_are_built_with_setters() {
    let f = FabricConfig::new(FabricKind::Shm, "setters", NodeId(3))
        .with_device(Some("mlx5_0".into()))
        .with_gid_index(Some(3))
        .with_port(Some(1))
        .with_traffic_class(Some(106))
        .with_service_level(Some(3))
        .with_model(Some("rxe".into()))
        .with_incarnation(42);
    assert_eq!(f.node, NodeId(3));
    assert_eq!(f.device.as_deref(), Some("mlx5_0"));
    assert_eq!(
        (f.gid_index, f.port, f.traffic_class, f.service_level),
        (Some(3), Some(1), Some(106), Some(3))
    );
    assert_eq!(f.model.as_deref(), Some("rxe"));
    assert_eq!(f.incarnation, 42);

    let mut exports = BTreeMap::new();
    exports.insert("a".to_string(), serde_json::json!(1));
    let n = NodeConfig::new("embed", "127.0.0.1:0".parse().unwrap())
        .with_exports(exports)
        .export("b", serde_json::json!(2))
        .rpc(Handlers::new(), 0);
    assert_eq!(n.role, "embed");
    assert_eq!(n.exports.len(), 2);
    assert_eq!(
        n.rpc.as_ref().map(|r| r.1),
        Some(1),
        "rpc() asks for at least one thread"
    );
    let n = n.with_rpc(None);
    assert!(n.rpc.is_none());
}
