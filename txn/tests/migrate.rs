//! Re-replication's copy over the shm fabric: a partition's image copied from one
//! in-process memory node into an empty image of the same geometry on another arrives
//! byte for byte (lock words as 0), and images of another geometry are refused.

use rrpc::fabric::shm::ClusterGuard;
use rrpc::fabric::{Fabric, FabricConfig, FabricKind, MemoryRegion};
use rrpc::node::{Node, NodeConfig};
use rrpc::runtime::{block_on, RuntimeConfig, ThreadCtx};
use rrpc::NodeId;
use txn::cvt::{Cvt, LOCK_OFFSET};
use txn::cvt_store::CvtTableExport;
use txn::error::TxnError;
use txn::migrate::copy_image;

fn fabric(name: &str, node: u32) -> Fabric {
    Fabric::open(&FabricConfig::new(FabricKind::Shm, name, NodeId(node))).unwrap()
}

/// A memory node serving SmallBank (`accounts`) as its only partition; with `empty`
/// its regions are zeroed after the load, as `memnode --empty` leaves them.
fn memnode(
    name: &str,
    id: u32,
    accounts: u64,
    empty: bool,
) -> (Node, Vec<CvtTableExport>, Vec<[MemoryRegion; 3]>) {
    let f = fabric(name, id);
    let loaded = txn::smallbank::load(&f, accounts, 3, 0, 1).unwrap();
    let (tables, regions): (Vec<_>, Vec<_>) = loaded.into_iter().unzip();
    if empty {
        for r in regions.iter().flatten() {
            r.zero(0, r.len());
        }
    }
    let node = Node::start(
        f,
        NodeConfig::new("memnode", "127.0.0.1:0".parse().unwrap()),
    )
    .unwrap();
    (node, tables, regions)
}

fn bytes(r: &MemoryRegion) -> Vec<u8> {
    let mut v = vec![0; r.len()];
    r.read(0, &mut v);
    v
}

#[test]
fn a_copied_image_equals_the_primary_with_its_lock_words_cleared() {
    let (guard, _) = ClusterGuard::new(&format!("migrate-{}", std::process::id())).unwrap();
    let name = guard.name().to_string();
    let (src, from, src_regions) = memnode(&name, 1, 5_000, false);
    let (dst, to, dst_regions) = memnode(&name, 2, 5_000, true);
    // A lock word held on the primary (a CVT of the first table) must not travel.
    let cvt = from[0].cvt_bytes();
    let held_at = 7 * cvt + LOCK_OFFSET;
    src_regions[0][0].store_u64(held_at, 0xdead_beef);
    assert_ne!(bytes(&src_regions[0][1]), bytes(&dst_regions[0][1]));
    let ctx = ThreadCtx::new(fabric(&name, 9), RuntimeConfig::default()).unwrap();
    ctx.connect(src.addr()).unwrap();
    ctx.connect(dst.addr()).unwrap();
    let (s, d) = (src.fabric().node(), dst.fabric().node());
    let copied = block_on(&ctx.clone(), {
        let (ctx, from, to) = (ctx.clone(), from.clone(), to.clone());
        async move { copy_image(&ctx, s, &from, d, &to).await }
    })
    .unwrap();
    assert_eq!(copied.len(), from.len());
    for (i, c) in copied.iter().enumerate() {
        assert_eq!(c.table, from[i].name);
        assert_eq!(c.bytes, from[i].index.len + from[i].values.len);
        // Every CVT arrives with its header (lock word 0) and its cells, each naming
        // the record at the same offset of the new image's value region.
        let (a, b) = (bytes(&src_regions[i][0]), bytes(&dst_regions[i][0]));
        let n = from[i].cvt_bytes();
        let mut used = 0;
        for (x, y) in a.chunks_exact(n).zip(b.chunks_exact(n)) {
            let (Ok(x), Ok(y)) = (Cvt::decode(x), Cvt::decode(y)) else {
                panic!("a CVT of table {} does not decode", c.table);
            };
            assert_eq!(y.header.lock, 0);
            assert_eq!(
                (x.header.key, x.header.state, x.header.table),
                (y.header.key, y.header.state, y.header.table)
            );
            for (cx, cy) in x.cells.iter().zip(&y.cells) {
                assert_eq!((cx.valid, cx.version, cx.cv), (cy.valid, cy.version, cy.cv));
                if cx.valid {
                    used += 1;
                    assert_eq!(
                        cx.addr - from[i].values.addr,
                        cy.addr - to[i].values.addr,
                        "table {}: a cell names another record",
                        c.table
                    );
                }
            }
        }
        assert!(used > 1000, "table {}: {used} valid cells", c.table);
        assert!(
            bytes(&src_regions[i][1]) == bytes(&dst_regions[i][1]),
            "table {}: values differ after the copy",
            c.table
        );
    }
    assert_eq!(src_regions[0][0].load_u64(held_at), 0xdead_beef);
    assert_eq!(
        dst_regions[0][0].load_u64(held_at),
        0,
        "a lock word travelled"
    );
}

#[test]
fn an_image_of_another_geometry_is_refused() {
    let (guard, _) = ClusterGuard::new(&format!("migrate-geo-{}", std::process::id())).unwrap();
    let name = guard.name().to_string();
    let (src, from, _r1) = memnode(&name, 1, 5_000, false);
    let (dst, to, _r2) = memnode(&name, 2, 50_000, true);
    let ctx = ThreadCtx::new(fabric(&name, 9), RuntimeConfig::default()).unwrap();
    ctx.connect(src.addr()).unwrap();
    ctx.connect(dst.addr()).unwrap();
    let (s, d) = (src.fabric().node(), dst.fabric().node());
    let r = block_on(&ctx.clone(), {
        let ctx = ctx.clone();
        async move { copy_image(&ctx, s, &from, d, &to).await }
    });
    assert!(
        matches!(&r, Err(TxnError::Export(m)) if m.contains("geometry")),
        "{r:?}"
    );
}
