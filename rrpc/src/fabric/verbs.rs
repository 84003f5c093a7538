//! libibverbs backend (real RDMA: hardware RNICs and Soft-RoCE), on the `sideway` binding.
//!
//! Real RDMA: hardware RNICs (InfiniBand, RoCE) and Soft-RoCE (`rdma_rxe`). `sideway`
//! loads libibverbs at run time, so a binary built here starts on a machine without RDMA
//! and reports "no RDMA device found" instead of failing to load.
//!
//! Choices made for Soft-RoCE with Debian's rdma-core 44 (learned the hard way, see the
//! issue that added this backend): basic CQs (`ibv_create_cq`) and basic QPs
//! (`ibv_post_send` of a linked WR list, one doorbell) rather than the extended ones; a QP's
//! state is read with `ibv_query_qp`, not the cached field; atomics are enabled in the QP's
//! access flags. Connection: RC, RoCEv2 with the IPv4-mapped GID by default, QPN/PSN/GID/
//! LID exchanged over the bootstrap service.

use crate::NodeId;
use std::sync::Arc;

use memmap2::{MmapMut, MmapOptions};
use sideway::ibverbs::address::{AddressHandleAttribute, GidType};
use sideway::ibverbs::completion::{BasicCompletionQueue, GenericCompletionQueue};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::memory_region::MemoryRegion as SwMr;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendError, PostSendGuard, QueuePair as _, QueuePairAttribute,
    QueuePairAttributeMask, QueuePairState, SendOperationFlags, SetInlineData,
    SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;

use super::{
    DmPlacement, FabricError, QpEndpoint, QpState, RecvWr, RemoteAccess, Result, SendWr, Wc,
    WcStatus, WrOpcode,
};

/// The verbs access flags of a region peers may access as `access`: local write always
/// (remote write and atomics require it; the owner writes its regions).
fn access_flags(access: RemoteAccess) -> AccessFlags {
    let mut f = AccessFlags::LocalWrite;
    if access.read {
        f |= AccessFlags::RemoteRead;
    }
    if access.write {
        f |= AccessFlags::RemoteWrite;
    }
    if access.atomic {
        f |= AccessFlags::RemoteAtomic;
    }
    f
}

/// Receive-queue depth of a QP, in WRs.
const RQ_DEPTH: u32 = 256;
/// Largest payload sent inline (bytes).
pub const MAX_INLINE_BYTES: u32 = 64;

/// Which device, port and GID to use. Defaults: the first device (or `RRPC_RDMA_DEVICE`),
/// port 1 (or `RRPC_RDMA_PORT`), the port's RoCEv2 IPv4-mapped GID (or `RRPC_GID_INDEX`),
/// else its first GID (InfiniBand).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerbsOptions {
    /// Device name, e.g. `mlx5_0` or `rxe0`.
    pub device: Option<String>,
    /// GID index on the port.
    pub gid_index: Option<u32>,
    /// Port number (from 1).
    pub port: Option<u8>,
    /// Traffic class of the QPs' GRH (default 0).
    pub traffic_class: Option<u8>,
    /// Service level of the QPs' address vector, 0 to 15 (default 0).
    pub service_level: Option<u8>,
    /// This process's incarnation of its node id (default: one per process start,
    /// [`super::default_incarnation`]).
    pub incarnation: Option<u64>,
}

impl VerbsOptions {
    /// Fill unset fields from `RRPC_RDMA_DEVICE`, `RRPC_GID_INDEX`, `RRPC_TCLASS` and
    /// `RRPC_SL`.
    pub fn with_env(mut self) -> Self {
        let num = |var: &str| std::env::var(var).ok().and_then(|s| s.parse::<u8>().ok());
        if self.traffic_class.is_none() {
            self.traffic_class = num("RRPC_TCLASS");
        }
        if self.service_level.is_none() {
            self.service_level = num("RRPC_SL");
        }
        if self.device.is_none() {
            self.device = std::env::var("RRPC_RDMA_DEVICE")
                .ok()
                .filter(|s| !s.is_empty());
        }
        if self.gid_index.is_none() {
            self.gid_index = std::env::var("RRPC_GID_INDEX")
                .ok()
                .and_then(|s| s.parse().ok());
        }
        self
    }
}

/// The message printed when no RDMA device can be used.
pub const NO_DEVICE: &str = "no RDMA device found; use --fabric shm or load rdma_rxe";

fn verbs_err(op: &'static str, e: impl std::fmt::Display) -> FabricError {
    FabricError::Verbs {
        op,
        what: e.to_string(),
    }
}

struct Inner {
    node: NodeId,
    incarnation: u64,
    fences: Arc<super::Fences>,
    ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    dev_name: String,
    port: u8,
    gid_index: u32,
    gid: [u8; 16],
    lid: u16,
    mtu: Mtu,
    max_rd_atomic: u8,
    traffic_class: u8,
    service_level: u8,
}

/// The verbs backend's fabric handle: an opened device and a protection domain.
#[derive(Clone)]
pub struct VerbsFabric {
    inner: Arc<Inner>,
}

// SAFETY: the device context and PD are thread-safe in libibverbs (every verb may be
// called concurrently on them); sideway's handles are reference counted wrappers.
unsafe impl Send for VerbsFabric {}
// SAFETY: as above.
unsafe impl Sync for VerbsFabric {}

impl VerbsFabric {
    /// Open the device chosen by `opts` as cluster node `node`.
    ///
    /// Errors: [`FabricError::NoDevice`] when libibverbs is missing, the kernel has no RDMA
    /// support, or no device exists ("no RDMA device found; use --fabric shm or load
    /// rdma_rxe"); [`FabricError::Verbs`] naming the failing verb otherwise.
    /// Also [`FabricError::Verbs`] (op `open verbs fabric`) when `RLIMIT_MEMLOCK` is
    /// below what any rrpc process registers and the process lacks `CAP_IPC_LOCK`: the
    /// message says the limit, the need and the fix.
    pub fn open(node: NodeId, opts: &VerbsOptions) -> Result<Self> {
        super::memlock::check_at_open(super::memlock::limit(), super::memlock::exempt()).map_err(
            |what| FabricError::Verbs {
                op: "open verbs fabric",
                what,
            },
        )?;
        if opts.service_level.is_some_and(|sl| sl > 15) {
            return Err(FabricError::InvalidArgument {
                op: "open verbs fabric",
                what: format!(
                    "service level {} (0 to 15)",
                    opts.service_level.unwrap_or_default()
                ),
            });
        }
        let list = DeviceList::new().map_err(|e| FabricError::NoDevice {
            why: format!("{NO_DEVICE} (ibv_get_device_list: {})", source_msg(&e)),
        })?;
        let names: Vec<String> = list.iter().map(|d| d.name()).collect();
        if names.is_empty() {
            return Err(FabricError::NoDevice {
                why: NO_DEVICE.to_string(),
            });
        }
        let idx = match &opts.device {
            Some(want) => {
                names
                    .iter()
                    .position(|n| n == want)
                    .ok_or_else(|| FabricError::NoDevice {
                        why: format!(
                            "RDMA device {want:?} not found; devices: {}",
                            names.join(", ")
                        ),
                    })?
            }
            None => 0,
        };
        let dev = list.get(idx).expect("index in range");
        let dev_name = dev.name();
        let ctx = dev
            .open()
            .map_err(|e| verbs_err("ibv_open_device", source_msg(&e)))?;
        let pd = ctx
            .alloc_pd()
            .map_err(|e| verbs_err("ibv_alloc_pd", source_msg(&e)))?;
        let port = opts.port.unwrap_or(1);
        let dev_attr = ctx
            .query_device()
            .map_err(|e| verbs_err("ibv_query_device", source_msg(&e)))?;
        if port == 0 || port > dev_attr.phys_port_cnt() {
            return Err(FabricError::InvalidArgument {
                op: "open verbs fabric",
                what: format!(
                    "{dev_name} has ports 1..={}, not {port}",
                    dev_attr.phys_port_cnt()
                ),
            });
        }
        let port_attr = ctx
            .query_port(port)
            .map_err(|e| verbs_err("ibv_query_port", source_msg(&e)))?;
        let table = ctx
            .query_gid_table()
            .map_err(|e| verbs_err("ibv_query_gid_table", source_msg(&e)))?;
        let gid_index = match opts.gid_index {
            Some(i) => {
                if !table
                    .iter()
                    .any(|g| g.gid_index() == i && g.port_num() == u32::from(port))
                {
                    return Err(FabricError::InvalidArgument {
                        op: "open verbs fabric",
                        what: format!(
                            "GID index {i} is not populated on {dev_name} port {port}; populated: {:?}",
                            table.iter().map(|g| g.gid_index()).collect::<Vec<_>>()
                        ),
                    });
                }
                i
            }
            // RoCEv2 with an IPv4-mapped address routes over UDP/IP, like rdma_cm picks.
            None => table
                .iter()
                .find(|g| {
                    g.port_num() == u32::from(port)
                        && g.gid_type() == GidType::RoceV2
                        && std::net::Ipv6Addr::from(g.gid()).to_ipv4_mapped().is_some()
                })
                .or_else(|| table.iter().find(|g| g.port_num() == u32::from(port)))
                .map(|g| g.gid_index())
                .unwrap_or(0),
        };
        let gid = ctx
            .query_gid(port, gid_index)
            .map_err(|e| verbs_err("ibv_query_gid", source_msg(&e)))?;
        let gid: [u8; 16] = std::net::Ipv6Addr::from(gid).octets();
        let max_rd_atomic = dev_attr.max_qp_rd_atom().clamp(1, 16) as u8;
        Ok(Self {
            inner: Arc::new(Inner {
                node,
                incarnation: opts.incarnation.unwrap_or_else(super::default_incarnation),
                fences: Arc::default(),
                ctx,
                pd,
                dev_name,
                port,
                gid_index,
                gid,
                lid: port_attr.lid(),
                mtu: port_attr.active_mtu(),
                max_rd_atomic,
                traffic_class: opts.traffic_class.unwrap_or(0),
                service_level: opts.service_level.unwrap_or(0),
            }),
        })
    }

    /// Node id.
    pub fn node(&self) -> NodeId {
        self.inner.node
    }

    /// This process's incarnation of its node id.
    pub fn incarnation(&self) -> u64 {
        self.inner.incarnation
    }

    pub(super) fn fences(&self) -> &Arc<super::Fences> {
        &self.inner.fences
    }

    /// One-line description.
    pub fn describe(&self) -> String {
        let i = &self.inner;
        let qos = match (i.traffic_class, i.service_level) {
            (0, 0) => String::new(),
            (t, s) => format!(", tclass {t}, SL {s}"),
        };
        format!(
            "verbs ({} port {} GID index {} {}, MTU {}{qos})",
            i.dev_name,
            i.port,
            i.gid_index,
            std::net::Ipv6Addr::from(i.gid),
            mtu_bytes(i.mtu)
        )
    }

    /// Allocate `len` zeroed bytes (hugepages when reserved and `len` >= 2 MiB) and
    /// register them for local write and remote read, write and atomics.
    pub fn alloc_mr(&self, len: usize) -> Result<VerbsMr> {
        self.alloc_mr_with(len, RemoteAccess::ALL)
    }

    /// As [`VerbsFabric::alloc_mr`], registered for local write and only the remote
    /// rights `access` gives: the NIC refuses other remote operations on it.
    pub fn alloc_mr_with(&self, len: usize, access: RemoteAccess) -> Result<VerbsMr> {
        if len == 0 {
            return Err(FabricError::InvalidArgument {
                op: "alloc_mr",
                what: "length 0".into(),
            });
        }
        let huge = len >= 2 << 20 && hugepages_reserved();
        let map = huge
            .then(|| {
                MmapOptions::new()
                    .len(len.div_ceil(2 << 20) * (2 << 20))
                    .huge(Some(21))
                    .populate()
                    .map_anon()
                    .ok()
            })
            .flatten();
        let map = match map {
            Some(m) => m,
            None => MmapOptions::new()
                .len(len.div_ceil(4096) * 4096)
                .populate()
                .map_anon()
                .map_err(|source| FabricError::Io {
                    op: "mmap MR",
                    source,
                })?,
        };
        // SAFETY: the mapping outlives the registration: VerbsMr drops `mr` before `map`.
        let mr = unsafe {
            self.inner
                .pd
                .reg_mr(map.as_ptr() as usize, len, access_flags(access))
        }
        .map_err(|e| {
            use sideway::ibverbs::memory_region::RegisterMemoryRegionErrorKind as K;
            let errno = match &e.0 {
                K::Ibverbs(io) => io.raw_os_error(),
                _ => None,
            };
            let m = &super::memlock::explain_reg_failure(
                errno,
                len as u64,
                super::memlock::limit(),
                super::memlock::exempt(),
                super::memlock::pinned_bytes(),
            );
            match m {
                Some(m) => verbs_err("ibv_reg_mr", format!("{}: {m}", source_msg(&e))),
                None => verbs_err("ibv_reg_mr", source_msg(&e)),
            }
        })?;
        Ok(VerbsMr { mr, map, len })
    }

    /// Device memory: `ibv_alloc_dm` of `len` bytes (8-byte aligned), registered with
    /// `ibv_reg_dm_mr` as a zero-based MR (`IBV_ACCESS_ZERO_BASED`: remote addresses are
    /// offsets from 0) for local write and remote read, write and atomics, and zeroed.
    /// Devices without device memory (Soft-RoCE reports `max_dm_size` 0) or whose
    /// provider cannot register it fall back to host memory ([`VerbsFabric::alloc_mr`]),
    /// and the reason says why.
    pub fn alloc_dm(&self, len: usize) -> Result<(DmOrHost, DmPlacement)> {
        self.alloc_dm_with(len, RemoteAccess::ALL)
    }

    /// As [`VerbsFabric::alloc_dm`], registered (device or host memory alike) with only
    /// the remote rights `access` gives.
    pub fn alloc_dm_with(
        &self,
        len: usize,
        access: RemoteAccess,
    ) -> Result<(DmOrHost, DmPlacement)> {
        match self.try_alloc_dm(len, access) {
            Ok(dm) => Ok((DmOrHost::Device(dm), DmPlacement::Device)),
            Err(reason) => Ok((
                DmOrHost::Host(self.alloc_mr_with(len, access)?),
                DmPlacement::HostFallback {
                    reason: format!("{}: {reason}", self.inner.dev_name),
                },
            )),
        }
    }

    /// Device memory or why not.
    fn try_alloc_dm(
        &self,
        len: usize,
        remote: RemoteAccess,
    ) -> std::result::Result<VerbsDm, String> {
        if len == 0 || !len.is_multiple_of(8) {
            return Err(format!(
                "device memory of {len} bytes (a multiple of 8 is needed)"
            ));
        }
        let mut attr = rdma_mummy_sys::ibv_alloc_dm_attr {
            length: len,
            log_align_req: 3,
            comp_mask: 0,
        };
        // SAFETY: a valid open context and an initialized attribute struct.
        let dm =
            unsafe { rdma_mummy_sys::ibv_alloc_dm(self.inner.ctx.context().as_ptr(), &mut attr) };
        let Some(dm) = std::ptr::NonNull::new(dm) else {
            return Err(format!("ibv_alloc_dm: {}", std::io::Error::last_os_error()));
        };
        use rdma_mummy_sys::ibv_access_flags as F;
        let mut access = F::IBV_ACCESS_ZERO_BASED.0 | F::IBV_ACCESS_LOCAL_WRITE.0;
        if remote.read {
            access |= F::IBV_ACCESS_REMOTE_READ.0;
        }
        if remote.write {
            access |= F::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if remote.atomic {
            access |= F::IBV_ACCESS_REMOTE_ATOMIC.0;
        }
        // SAFETY: `pd` and `dm` belong to this open context; the MR covers `0..len` of
        // the `len` bytes allocated; `VerbsDm` deregisters it before freeing `dm`.
        let mr = unsafe {
            rdma_mummy_sys::ibv_reg_dm_mr(self.inner.pd.pd().as_ptr(), dm.as_ptr(), 0, len, access)
        };
        let Some(mr) = std::ptr::NonNull::new(mr) else {
            let e = std::io::Error::last_os_error();
            // SAFETY: `dm` was allocated above, nothing refers to it, it is not used after.
            unsafe { rdma_mummy_sys::ibv_free_dm(dm.as_ptr()) };
            return Err(format!("ibv_reg_dm_mr (zero-based): {e}"));
        };
        let dm = VerbsDm {
            dm,
            mr,
            len,
            _ctx: self.inner.clone(),
        };
        // Device memory is not zeroed by the device.
        dm.write(0, &vec![0u8; len])
            .map_err(|e| format!("ibv_memcpy_to_dm: {e}"))?;
        Ok(dm)
    }

    /// Create a basic CQ of `depth` entries.
    pub fn create_cq(&self, depth: usize) -> Result<VerbsCq> {
        let mut b = self.inner.ctx.create_cq_builder();
        b.setup_cqe(depth.clamp(1, 1 << 16) as u32);
        let cq = b
            .build()
            .map_err(|e| verbs_err("ibv_create_cq", source_msg(&e)))?;
        Ok(VerbsCq { cq })
    }

    /// Create an RC QP in RESET state whose send completions go to `cq`.
    pub fn create_qp(&self, cq: &VerbsCq, sq_depth: usize) -> Result<VerbsQp> {
        let mut b = self.inner.pd.create_qp_builder();
        b.setup_max_send_wr(sq_depth.clamp(1, 1 << 14) as u32)
            .setup_max_recv_wr(RQ_DEPTH)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_max_inline_data(MAX_INLINE_BYTES)
            .setup_send_cq(GenericCompletionQueue::from(cq.cq.clone()))
            .setup_recv_cq(GenericCompletionQueue::from(cq.cq.clone()))
            .setup_send_ops_flags(
                SendOperationFlags::Write
                    | SendOperationFlags::Read
                    | SendOperationFlags::Send
                    | SendOperationFlags::AtomicCompareAndSwap
                    | SendOperationFlags::AtomicFetchAndAdd,
            );
        let qp = b
            .build()
            .map_err(|e| verbs_err("ibv_create_qp", source_msg(&e)))?;
        // Random-ish initial PSN, as rdma_cm does (24 bits).
        let psn = (std::process::id() ^ qp.qp_number().rotate_left(7) ^ nanos_now()) & 0x00FF_FFFF;
        Ok(VerbsQp {
            fabric: self.inner.clone(),
            qp,
            psn,
            peer: NodeId::MAX,
            state: QpState::Init,
            sq_depth: sq_depth.max(1),
        })
    }
}

fn nanos_now() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

fn hugepages_reserved() -> bool {
    std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}

fn mtu_bytes(m: Mtu) -> u32 {
    match m {
        Mtu::Mtu256 => 256,
        Mtu::Mtu512 => 512,
        Mtu::Mtu1024 => 1024,
        Mtu::Mtu2048 => 2048,
        Mtu::Mtu4096 => 4096,
    }
}

fn mtu_from_bytes(b: u32) -> Mtu {
    match b {
        0..=256 => Mtu::Mtu256,
        257..=512 => Mtu::Mtu512,
        513..=1024 => Mtu::Mtu1024,
        1025..=2048 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

/// The innermost message of an error chain (sideway wraps `io::Error`s).
fn source_msg(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        msg = format!("{msg}: {s}");
        cur = s.source();
    }
    msg
}

/// A registered MR of the verbs backend (anonymous memory, or hugepages).
pub struct VerbsMr {
    // Field order matters: deregister before unmapping.
    mr: Arc<SwMr>,
    map: MmapMut,
    len: usize,
}

// SAFETY: the registration is an immutable handle; the memory is accessed through raw
// pointers and atomics by design (the NIC writes it concurrently anyway).
unsafe impl Send for VerbsMr {}
// SAFETY: as above.
unsafe impl Sync for VerbsMr {}

impl VerbsMr {
    /// Base address (bytes).
    pub fn addr(&self) -> u64 {
        self.map.as_ptr() as u64
    }
    /// Length in bytes as asked.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the length is zero (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
    /// Pointer to the data.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr() as *mut u8
    }
}

/// What [`VerbsFabric::alloc_dm`] got: device memory, or host memory in its place.
pub enum DmOrHost {
    /// On the NIC.
    Device(VerbsDm),
    /// The host fallback.
    Host(VerbsMr),
}

/// Device memory on the NIC (`ibv_alloc_dm`) with a zero-based MR over it: remote
/// addresses are offsets (`addr()` is 0), and the CPU reaches it only through
/// `ibv_memcpy_to_dm` / `ibv_memcpy_from_dm` (there is no pointer to it).
pub struct VerbsDm {
    dm: std::ptr::NonNull<rdma_mummy_sys::ibv_dm>,
    mr: std::ptr::NonNull<rdma_mummy_sys::ibv_mr>,
    len: usize,
    /// Keeps the context and PD alive while the DM and its MR exist.
    _ctx: Arc<Inner>,
}

// SAFETY: the DM and MR handles are immutable after creation; libibverbs allows its
// objects to be used from any thread, and the memcpy calls take no Rust references into
// the device memory.
unsafe impl Send for VerbsDm {}
// SAFETY: as above.
unsafe impl Sync for VerbsDm {}

impl VerbsDm {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the length is zero (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is a live registration owned by `self`.
        unsafe { self.mr.as_ref().lkey }
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.mr.as_ref().rkey }
    }
    /// Copy `dst.len()` bytes at byte `off` out of device memory.
    ///
    /// Errors: out of range, or the provider's error (mlx5 wants 4-byte multiples).
    pub fn read(&self, off: usize, dst: &mut [u8]) -> std::io::Result<()> {
        self.check(off, dst.len())?;
        // SAFETY: `dm` is live; `dst` is a valid writable buffer of `dst.len()` bytes and
        // `off + dst.len()` is within the allocation (checked).
        let rc = unsafe {
            rdma_mummy_sys::ibv_memcpy_from_dm(
                dst.as_mut_ptr().cast(),
                self.dm.as_ptr(),
                off as u64,
                dst.len(),
            )
        };
        errno(rc)
    }
    /// Copy `src` into device memory at byte `off`.
    ///
    /// Errors as [`VerbsDm::read`].
    pub fn write(&self, off: usize, src: &[u8]) -> std::io::Result<()> {
        self.check(off, src.len())?;
        // SAFETY: `dm` is live; `src` is valid for reads of `src.len()` bytes and the
        // range is within the allocation (checked).
        let rc = unsafe {
            rdma_mummy_sys::ibv_memcpy_to_dm(
                self.dm.as_ptr(),
                off as u64,
                src.as_ptr().cast(),
                src.len(),
            )
        };
        errno(rc)
    }
    fn check(&self, off: usize, len: usize) -> std::io::Result<()> {
        if off.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{len} bytes at {off} outside {} bytes of device memory",
                    self.len
                ),
            ));
        }
        Ok(())
    }
}

/// A verbs return code (0 or an errno value, as the DM calls return them) as a result.
fn errno(rc: i32) -> std::io::Result<()> {
    match rc {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e.abs())),
    }
}

impl Drop for VerbsDm {
    fn drop(&mut self) {
        // SAFETY: the MR was registered over `dm` by `alloc_dm` and is deregistered once,
        // before the DM is freed; nothing uses either afterwards.
        unsafe {
            rdma_mummy_sys::ibv_dereg_mr(self.mr.as_ptr());
            rdma_mummy_sys::ibv_free_dm(self.dm.as_ptr());
        }
    }
}

/// A basic completion queue.
#[derive(Clone)]
pub struct VerbsCq {
    cq: Arc<BasicCompletionQueue>,
}

// SAFETY: a CQ handle may be used from any thread; callers poll it from one at a time.
unsafe impl Send for VerbsCq {}
// SAFETY: as above; libibverbs serializes concurrent polls internally (provider lock).
unsafe impl Sync for VerbsCq {}

impl VerbsCq {
    /// Move up to `max` completions into `out` (a poller batch is drained whole, so a few
    /// more than `max` may come).
    pub fn poll(&self, out: &mut Vec<Wc>, max: usize) -> usize {
        let before = out.len();
        if let Ok(poller) = self.cq.start_poll() {
            for wc in poller {
                out.push(Wc {
                    wr_id: wc.wr_id(),
                    status: wc_status(wc.status()),
                    byte_len: wc.byte_len(),
                    // IBV_WC_RECV and IBV_WC_RECV_RDMA_WITH_IMM have bit 7 set.
                    recv: wc.opcode() & 0x80 != 0,
                });
                if out.len() - before >= max {
                    // The poller holds no more than it polled; keep consuming what it has.
                    continue;
                }
            }
        }
        out.len() - before
    }
}

fn wc_status(s: u32) -> WcStatus {
    match s {
        0 => WcStatus::Success,
        1 => WcStatus::LocalLength,
        2 => WcStatus::LocalQpOperation,
        4 => WcStatus::LocalProtection,
        5 => WcStatus::Flushed,
        9 => WcStatus::RemoteInvalidRequest,
        10 => WcStatus::RemoteAccess,
        11 => WcStatus::RemoteOperation,
        12 => WcStatus::RetryExceeded,
        13 => WcStatus::RnrRetryExceeded,
        other => WcStatus::Other(other),
    }
}

/// An RC queue pair of the verbs backend.
pub struct VerbsQp {
    fabric: Arc<Inner>,
    qp: BasicQueuePair,
    psn: u32,
    peer: NodeId,
    state: QpState,
    sq_depth: usize,
}

// SAFETY: a QP may be moved between threads; post_send takes &mut self, so one thread
// posts at a time, as libibverbs requires for a QP without its own lock.
unsafe impl Send for VerbsQp {}
// SAFETY: shared references only read immutable fields (QPN, endpoint).
unsafe impl Sync for VerbsQp {}

impl VerbsQp {
    /// Endpoint to give the peer.
    pub fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            node: self.fabric.node,
            qpn: self.qp.qp_number(),
            psn: self.psn,
            gid: self.fabric.gid,
            lid: self.fabric.lid,
            gid_index: self.fabric.gid_index,
            mtu: mtu_bytes(self.fabric.mtu),
            recv_queue: None,
            incarnation: self.fabric.incarnation,
        }
    }

    /// What a fence calls to move this QP to the error state from any thread:
    /// `ibv_modify_qp` to ERR on our end, so the NIC drops the peer's requests (its
    /// one-sided operations complete in error there) and our outstanding WRs flush.
    /// Called only while the QP lives (the wrapper clears it before the QP drops).
    pub(super) fn kill_handle(&self) -> super::KillQp {
        /// The QP's handle, used only by `ibv_modify_qp`, which libibverbs allows from
        /// any thread.
        struct Raw(std::ptr::NonNull<rdma_mummy_sys::ibv_qp>);
        // SAFETY: see above; the pointer is only dereferenced by libibverbs.
        unsafe impl Send for Raw {}
        impl Raw {
            // A method, so the closure captures the whole `Raw` (which is Send), not
            // its field.
            fn ptr(&self) -> *mut rdma_mummy_sys::ibv_qp {
                self.0.as_ptr()
            }
        }
        // SAFETY: the handle is valid while the QP lives, which the caller guarantees.
        let raw = Raw(unsafe { sideway::ibverbs::queue_pair::QueuePair::qp(&self.qp) });
        Box::new(move || {
            // SAFETY: an all-zero ibv_qp_attr is valid (plain C data); only qp_state is
            // read, as the mask says.
            let mut attr: rdma_mummy_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
            attr.qp_state = rdma_mummy_sys::ibv_qp_state::IBV_QPS_ERR;
            // SAFETY: the QP is alive (the kill handle is cleared before it is destroyed)
            // and `attr` is a valid, initialised attribute struct.
            let rc = unsafe {
                rdma_mummy_sys::ibv_modify_qp(
                    raw.ptr(),
                    &mut attr,
                    rdma_mummy_sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as _,
                )
            };
            if rc != 0 {
                tracing::warn!(rc, "fence: ibv_modify_qp(ERR) failed");
            }
        })
    }

    /// Peer node id, or `NodeId::MAX` before connect.
    pub fn peer(&self) -> NodeId {
        self.peer
    }

    /// INIT -> RTR -> RTS towards `remote`.
    pub fn connect(&mut self, remote: &QpEndpoint) -> Result<()> {
        let f = &self.fabric;
        let access = AccessFlags::LocalWrite
            | AccessFlags::RemoteWrite
            | AccessFlags::RemoteRead
            | AccessFlags::RemoteAtomic;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(f.port)
            .setup_access_flags(access);
        self.qp
            .modify(&attr)
            .map_err(|e| verbs_err("ibv_modify_qp(INIT)", source_msg(&e)))?;

        let mut attr = QueuePairAttribute::new();
        let mtu = match remote.mtu {
            0 => f.mtu,
            m => mtu_from_bytes(m.min(mtu_bytes(f.mtu))),
        };
        attr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu)
            .setup_dest_qp_num(remote.qpn)
            .setup_rq_psn(remote.psn)
            .setup_max_dest_read_atomic(f.max_rd_atomic)
            .setup_min_rnr_timer(12);
        let mut ah = AddressHandleAttribute::new();
        ah.setup_dest_lid(remote.lid)
            .setup_port(f.port)
            .setup_service_level(f.service_level);
        if remote.gid != [0; 16] {
            ah.setup_grh(
                &std::net::Ipv6Addr::from(remote.gid).into(),
                0,
                f.gid_index as u8,
                64,
                f.traffic_class,
            );
        }
        attr.setup_address_vector(&ah);
        self.qp
            .modify(&attr)
            .map_err(|e| verbs_err("ibv_modify_qp(RTR)", source_msg(&e)))?;

        let mut attr = QueuePairAttribute::new();
        // Timeout 14 (4.096 us x 2^14 = 67 ms) x 7 retries: a dead peer surfaces as
        // RETRY_EXC_ERR in about half a second.
        attr.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(self.psn)
            .setup_timeout(14)
            .setup_retry_cnt(7)
            // 6, not 7 (= forever): a SEND with no receive posted fails, it does not hang.
            .setup_rnr_retry(6)
            .setup_max_read_atomic(f.max_rd_atomic);
        self.qp
            .modify(&attr)
            .map_err(|e| verbs_err("ibv_modify_qp(RTS)", source_msg(&e)))?;
        self.peer = remote.node;
        self.state = QpState::ReadyToSend;
        Ok(())
    }

    /// State as last queried ([`VerbsQp::refresh`]).
    pub fn state(&mut self) -> QpState {
        self.state
    }

    /// Query the state with `ibv_query_qp` (the QP wrapper does so at most once a
    /// millisecond).
    pub fn refresh(&mut self) {
        if self.state == QpState::ReadyToSend {
            if let Ok((attr, _)) = self.qp.query(QueuePairAttributeMask::State) {
                if matches!(
                    attr.state(),
                    QueuePairState::Error | QueuePairState::SendQueueError
                ) {
                    self.state = QpState::Error;
                }
            }
        }
    }

    /// Send-queue depth in WRs.
    pub fn sq_depth(&self) -> usize {
        self.sq_depth
    }

    /// Move the QP to the error state (`ibv_modify_qp` to ERR): outstanding WRs complete
    /// with `WR_FLUSH_ERR`.
    pub fn to_error(&mut self) -> Result<()> {
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        self.qp
            .modify(&attr)
            .map_err(|e| verbs_err("ibv_modify_qp(ERR)", source_msg(&e)))?;
        self.state = QpState::Error;
        Ok(())
    }

    /// Post receive buffers with one `ibv_post_recv`.
    pub fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<()> {
        let mut guard = self.qp.start_post_recv();
        for w in wrs {
            let h = guard.construct_wr(w.wr_id);
            // SAFETY: the caller keeps the buffer registered and alive until completion.
            unsafe { h.setup_sge(w.sge.lkey, w.sge.addr, w.sge.len) };
        }
        guard
            .post()
            .map_err(|e| verbs_err("ibv_post_recv", source_msg(&e)))
    }

    /// Post the list with one `ibv_post_send` (the caller checked state and depth).
    pub fn post_send(&mut self, wrs: &[SendWr]) -> Result<()> {
        let mut guard = self.qp.start_post_send();
        for wr in wrs {
            let mut flags = WorkRequestFlags::none();
            if wr.signaled {
                flags |= WorkRequestFlags::Signaled;
            }
            // Inline when asked, and for every small WRITE: the NIC then need not DMA the
            // payload from host memory (one PCIe read less).
            let inline = matches!(wr.opcode, WrOpcode::Write | WrOpcode::Send)
                && wr.sge.len <= MAX_INLINE_BYTES;
            if inline {
                flags |= WorkRequestFlags::Inline;
            }
            let h = guard.construct_wr(wr.wr_id, flags);
            let (rkey, raddr) = (wr.remote.rkey, wr.remote.addr);
            let buf = match wr.opcode {
                WrOpcode::Read => h.setup_read(rkey, raddr),
                WrOpcode::Write => h.setup_write(rkey, raddr),
                WrOpcode::CmpSwap { compare, swap } => {
                    h.setup_atomic_compare_swap(rkey, raddr, compare, swap)
                }
                WrOpcode::FetchAdd { add } => h.setup_atomic_fetch_add(rkey, raddr, add),
                WrOpcode::Send => h.setup_send(),
            };
            if inline {
                // SAFETY: the caller's SGE names `len` readable bytes of a registered MR.
                let data = unsafe {
                    std::slice::from_raw_parts(wr.sge.addr as *const u8, wr.sge.len as usize)
                };
                buf.setup_inline_data(data);
            } else {
                // SAFETY: the caller keeps the buffer registered and alive until completion.
                unsafe { buf.setup_sge(wr.sge.lkey, wr.sge.addr, wr.sge.len) };
            }
        }
        guard.post().map_err(|e| match e {
            PostSendError::NotEnoughResources(_) => FabricError::SendQueueFull {
                posted: 0,
                asked: wrs.len(),
                depth: self.sq_depth,
            },
            other => verbs_err("ibv_post_send", source_msg(&other)),
        })
    }
}
