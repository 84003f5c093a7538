//! Shared-memory fabric backend (one host, many processes).
//!
//! An MR is a file under the cluster's MR directory (`<root>/rrpc-<cluster>/n<node>-mr<rkey>`,
//! mode 0600), where `<root>` is a mounted hugetlbfs when hugepages are reserved and
//! `/dev/shm` otherwise (`RRPC_SHM_ROOT` overrides). Liveness files (below) need ordinary
//! writes, which hugetlbfs refuses, so they always live in `/dev/shm/rrpc-<cluster>/`
//! (or `$RRPC_SHM_ROOT/rrpc-<cluster>/`). The file starts with a 4 KiB header
//! (magic, owner node, rkey, owner's base address, length) followed by the data, so a
//! peer resolves `(addr, rkey)` from the rkey alone, as a NIC would.
//!
//! One-sided WRs execute in the requester, on its own mapping of the owner's file: the
//! owner's CPU takes no part. CAS and FAA are real atomic instructions on the shared
//! word. A WRITE copies all but its last 8 bytes, then publishes the last 8 with release
//! ordering, so a receiver that polls a trailing label with acquire loads sees the whole
//! payload once it sees the label (the property Rocket buckets rely on). Completions of
//! signaled WRs are pushed to the CQ when the work is done, i.e. during `post_send`.
//!
//! Liveness: each node holds an exclusive `flock` on `n<node>.alive` for its lifetime;
//! the kernel drops it when the process dies however it dies. A QP probes its peer's
//! lock (at most once a millisecond) and enters the error state when the peer is gone,
//! as an RC QP does after its retry count is exhausted.
//!
//! Fencing ([`super::Fabric::fence`]): each QP's receive-queue MR holds a state word that
//! only its owner writes. A fence sets it on every QP of the fenced (node, incarnation);
//! the owner's QP is then in error, and the peer, which executes its own one-sided WRs
//! on the owner's memory, reads the word of the owner's end before each WR and fails it
//! (`RetryExceeded`, as a NIC's unanswered requests end) once it is set or the owner
//! destroyed that QP. A peer could be paused (SIGSTOP, preemption) between that check and
//! its store and land the store after the fence; so the check and the store form a
//! handshake with the fence: the peer raises a busy word (`RQ_BUSY`) in the owner's
//! receive queue before the check and lowers it after the store (under a timing model,
//! when the WR executes), and a fence, after setting the state word, waits until the
//! busy word is down or the peer process is dead. Both sides use sequentially consistent
//! accesses, so either the peer sees the fence or the fence sees the peer busy and waits
//! for its store to land: when [`super::Fabric::fence`] returns, no store of the fenced
//! peer is still to come. (A fence of a peer stopped in the middle of a WR waits until it
//! is continued or dies.) On verbs the NIC closes the window (our end of the QP is in
//! ERR).

use crate::NodeId;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use memmap2::{MmapMut, MmapOptions};

use super::model::{self, ModelOp, Nic, TimingModel, NIC_BYTES, NIC_WORDS};
use super::{
    FabricError, QpEndpoint, QpState, RecvWr, RemoteAddr, Result, SendWr, Wc, WcStatus, WrOpcode,
};

/// Bytes of the header at the start of every MR file.
pub const MR_HEADER_BYTES: usize = 4096;
const MR_MAGIC: u64 = u64::from_le_bytes(*b"RRPCMR01");
/// Header word 4 (flags): the MR was allocated as device memory.
const HEADER_DM: u64 = 1;
/// Byte offset in the header of the live word: 1 while the MR is registered, 0 once its
/// owner deregistered it (or a restarted node retired it). A requester checks it on every
/// access through its mapping, as a NIC looks the rkey up in its translation table.
const HEADER_LIVE: usize = 64;
/// MRs up to this size are prefaulted at registration (rings, control words: no page
/// fault on the data path); larger ones (arenas, tables) commit memory as it is touched.
const PREFAULT_MAX_BYTES: usize = 1 << 20;
/// Remote MRs one QP keeps mapped; past it the QP drops its mappings and maps again on use.
const QP_MAPPINGS_MAX: usize = 256;
const HUGE_PAGE_BYTES: usize = 2 << 20;
const PAGE_BYTES: usize = 4096;

fn io_err(op: &'static str) -> impl FnOnce(std::io::Error) -> FabricError {
    move |source| FabricError::Io { op, source }
}

/// Open `path` with `opts` without following a symlink at its last component
/// (`O_NOFOLLOW`), then check the file opened (`fstat`, so no race with a swap of the
/// path): a regular file owned by this process's effective uid and writable by nobody
/// else. Every file of the shm fabric is created so (mode 0600); anything else was
/// planted. Errors: [`FabricError::Io`] from the open (`ELOOP` for a symlink, reported
/// as [`FabricError::UnsafeFile`]), [`FabricError::UnsafeFile`] naming the path.
fn open_checked(path: &Path, opts: &mut OpenOptions, op: &'static str) -> Result<File> {
    let file = opts
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                unsafe_file(path, "it is a symbolic link")
            } else {
                io_err(op)(e)
            }
        })?;
    let meta = file.metadata().map_err(io_err(op))?;
    check_owned(path, &meta, false)?;
    Ok(file)
}

fn unsafe_file(path: &Path, why: impl Into<String>) -> FabricError {
    FabricError::UnsafeFile {
        path: path.display().to_string(),
        why: why.into(),
    }
}

/// Whether `meta` (of `path`) is what this process creates there: a regular file (or a
/// directory, if `dir`), owned by our effective uid, not writable by group or others.
fn check_owned(path: &Path, meta: &std::fs::Metadata, dir: bool) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let ft = meta.file_type();
    if ft.is_symlink() {
        return Err(unsafe_file(path, "it is a symbolic link"));
    }
    if dir && !ft.is_dir() {
        return Err(unsafe_file(path, "it is not a directory"));
    }
    if !dir && !ft.is_file() {
        return Err(unsafe_file(path, "it is not a regular file"));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid {
        return Err(unsafe_file(
            path,
            format!(
                "owned by uid {}, not by this process's uid {euid}",
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_file(
            path,
            format!(
                "mode {:o} lets group or others write it",
                meta.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Create directory `d` (mode 0700) unless it exists; either way check, without
/// following a symlink, that it is a directory of ours writable by nobody else.
fn ensure_dir(d: &Path) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(d) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(io_err("create cluster dir")(e))
        }
        _ => {}
    }
    let meta = std::fs::symlink_metadata(d).map_err(io_err("create cluster dir"))?;
    check_owned(d, &meta, true)
}

/// Where cluster directories live: `RRPC_SHM_ROOT`, else a hugetlbfs mount when
/// hugepages are reserved, else `/dev/shm`. Returns the root and whether it is hugetlbfs.
pub fn shm_root() -> (PathBuf, bool) {
    if let Some(root) = std::env::var_os("RRPC_SHM_ROOT") {
        let root = PathBuf::from(root);
        let huge = is_hugetlbfs(&root);
        return (root, huge);
    }
    let reserved = std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if reserved > 0 {
        if let Some(mount) = hugetlbfs_mount() {
            return (mount, true);
        }
    }
    (PathBuf::from("/dev/shm"), false)
}

fn hugetlbfs_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, dir, fs) = (f.next()?, f.next()?, f.next()?);
        (fs == "hugetlbfs").then(|| PathBuf::from(dir))
    })
}

fn is_hugetlbfs(p: &Path) -> bool {
    hugetlbfs_mount().is_some_and(|m| p.starts_with(m))
}

/// The control directory of cluster `name` (liveness files; MR files too unless on hugetlbfs).
pub fn cluster_dir(name: &str) -> PathBuf {
    ctl_root().join(format!("rrpc-{name}"))
}

/// The directory of cluster `name`'s MR files, and whether it is on hugetlbfs.
pub fn mr_dir(name: &str) -> (PathBuf, bool) {
    let (root, huge) = shm_root();
    (root.join(format!("rrpc-{name}")), huge)
}

fn ctl_root() -> PathBuf {
    match std::env::var_os("RRPC_SHM_ROOT").map(PathBuf::from) {
        Some(root) if !is_hugetlbfs(&root) => root,
        _ => PathBuf::from("/dev/shm"),
    }
}

/// What [`prepare_cluster`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum ClusterDirState {
    /// No directory existed.
    Fresh,
    /// A directory left by a crashed run (no live node) was removed; `files` were in it.
    RemovedStale {
        /// Number of files removed.
        files: usize,
    },
}

/// Make sure cluster `name` starts clean: a directory whose nodes are all dead (a crashed
/// run) is removed; a directory with a live node is an error (another run is using it).
pub fn prepare_cluster(name: &str) -> Result<ClusterDirState> {
    let dir = cluster_dir(name);
    let (mrs, _) = mr_dir(name);
    for d in [&dir, &mrs] {
        if let Ok(meta) = std::fs::symlink_metadata(d) {
            check_owned(d, &meta, true)?;
        }
    }
    if !dir.exists() {
        if mrs.exists() {
            // MR files without a control directory: nobody can be alive.
            let files = std::fs::read_dir(&mrs).map_or(0, |d| d.count());
            std::fs::remove_dir_all(&mrs).map_err(io_err("remove stale MR dir"))?;
            return Ok(ClusterDirState::RemovedStale { files });
        }
        return Ok(ClusterDirState::Fresh);
    }
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).map_err(io_err("read cluster dir"))? {
        let entry = entry.map_err(io_err("read cluster dir"))?;
        files += 1;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "alive") {
            if let Ok(f) = open_checked(&path, OpenOptions::new().read(true), "open liveness file")
            {
                if !try_lock(&f, libc::LOCK_SH) {
                    return Err(FabricError::NodeInUse {
                        node: node_of_alive_file(&path).unwrap_or(NodeId::MAX),
                        cluster: name.to_string(),
                        path: path.display().to_string(),
                    });
                }
            }
        }
    }
    if mrs != dir && mrs.exists() {
        files += std::fs::read_dir(&mrs).map_or(0, |d| d.count());
        std::fs::remove_dir_all(&mrs).map_err(io_err("remove stale MR dir"))?;
    }
    std::fs::remove_dir_all(&dir).map_err(io_err("remove stale cluster dir"))?;
    Ok(ClusterDirState::RemovedStale { files })
}

/// A cluster directory owned for a scope: prepared on creation (a stale directory from a
/// crashed run is removed, one in use is an error; see [`prepare_cluster`]) and removed on
/// drop, however the scope ends. Launchers and test suites hold one per cluster.
pub struct ClusterGuard {
    name: String,
}

impl ClusterGuard {
    /// Prepare cluster `name`; also says what was found there.
    pub fn new(name: &str) -> Result<(Self, ClusterDirState)> {
        let state = prepare_cluster(name)?;
        Ok((Self { name: name.into() }, state))
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Open node `node` of this cluster on the backend `$RRPC_FABRIC` names (shm when
    /// unset), as binaries and test suites choose it.
    pub fn open(&self, node: NodeId) -> Result<super::Fabric> {
        let kind = super::FabricKind::from_env().map_err(|what| FabricError::InvalidArgument {
            op: "open fabric",
            what,
        })?;
        super::Fabric::open(&super::FabricConfig::new(kind, &self.name, node))
    }
}

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        let _ = remove_cluster(&self.name);
    }
}

/// Remove cluster `name`'s directory (after all its nodes exited).
pub fn remove_cluster(name: &str) -> Result<()> {
    for dir in [mr_dir(name).0, cluster_dir(name)] {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_err("remove cluster dir")(e))
            }
            _ => {}
        }
    }
    Ok(())
}

fn node_of_alive_file(p: &Path) -> Option<NodeId> {
    p.file_stem()?.to_str()?.strip_prefix('n')?.parse().ok()
}

/// Non-blocking flock; true if taken. A taken shared lock is released at once.
/// A pause for the next guarded WR, between its fence check and its access (tests).
static WR_PAUSE_NS: AtomicU64 = AtomicU64::new(0);

/// For tests of the fence handshake: the next one-sided WR this process executes waits
/// `pause` after its fence check and before it touches the responder's memory, as a
/// requester descheduled (or SIGSTOPped) there would. One WR only.
#[doc(hidden)]
pub fn pause_next_wr(pause: std::time::Duration) {
    WR_PAUSE_NS.store(pause.as_nanos() as u64, Ordering::Relaxed);
}

/// The responder's state word ([`RQ_STATE`]) and the requester's busy word
/// ([`RQ_BUSY`]) of one QP, in the responder's receive queue (kept mapped by `map`, or by the QP).
struct FenceGuard {
    /// Keeps the mapping alive for a WR that executes later (timing model); `None` when
    /// the QP, which holds it, executes the WR at once.
    map: Option<Arc<RemoteMr>>,
    state: usize,
    busy: usize,
}

/// Run `wr` (one WR's access to the responder's memory) under the fence handshake
/// (module docs): busy up, the responder's state checked (fenced: `RetryExceeded`, the
/// WR not run), the WR, busy down. Without a guard the WR just runs.
fn guard_wr(g: Option<&FenceGuard>, wr: impl FnOnce() -> WcStatus) -> WcStatus {
    let Some(g) = g else { return wr() };
    if g.map.as_ref().is_some_and(|m| !m.live()) {
        // The peer destroyed its end since the WR was posted: as fenced.
        return WcStatus::RetryExceeded;
    }
    // SAFETY: both words lie in the responder's receive-queue mapping, which `map` (or
    // the QP executing the WR now) keeps alive, bounds-checked by `ptr` when the guard
    // was made; 8-byte aligned
    // (page-aligned mapping, word offsets), and AtomicU64 has u64's layout.
    let (state, busy) = unsafe {
        (
            &*(g.state as *const AtomicU64),
            &*(g.busy as *const AtomicU64),
        )
    };
    busy.store(1, Ordering::SeqCst);
    let status = if state.load(Ordering::SeqCst) != 0 {
        WcStatus::RetryExceeded
    } else {
        // A load first: the swap, an RMW on one word every WR of every thread would
        // contend for, is only for the rare test that armed a pause.
        let pause = match WR_PAUSE_NS.load(Ordering::Relaxed) {
            0 => 0,
            _ => WR_PAUSE_NS.swap(0, Ordering::Relaxed),
        };
        if pause > 0 {
            std::thread::sleep(std::time::Duration::from_nanos(pause));
        }
        wr()
    };
    busy.store(0, Ordering::Release);
    status
}

fn try_lock(f: &File, kind: libc::c_int) -> bool {
    // SAFETY: flock on a valid open fd has no memory-safety preconditions.
    let rc = unsafe { libc::flock(f.as_raw_fd(), kind | libc::LOCK_NB) };
    if rc == 0 && kind == libc::LOCK_SH {
        // SAFETY: as above.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
    }
    rc == 0
}

struct LocalMr {
    base: u64,
    len: usize,
}

struct FabricInner {
    node: NodeId,
    /// This process's incarnation of `node`.
    incarnation: u64,
    fences: Arc<super::Fences>,
    cluster: String,
    /// Liveness files.
    dir: PathBuf,
    /// MR files (same as `dir` unless on hugetlbfs).
    mr_dir: PathBuf,
    huge: bool,
    alive_path: PathBuf,
    _alive: File,
    /// The cluster-wide rkey counter (`rkeys` in the control directory), shared by every
    /// process of the cluster, so that an rkey names one MR incarnation for the cluster's
    /// lifetime, across processes and restarts of a node id.
    rkeys: MmapMut,
    next_qpn: AtomicU32,
    local: RwLock<HashMap<u32, LocalMr>>,
    /// Bumped at every deregistration: QPs' lkey caches filled before it may be stale.
    local_gen: AtomicU64,
    /// Mappings of remote MRs by (node, rkey), shared by this process's QPs. Weak: a
    /// mapping lives as long as a QP (or a queued WR) holds it, so the memory of a
    /// departed peer is not pinned here.
    remote: Mutex<RemoteCache>,
    /// The timing model, if one was chosen ([`ShmFabric::open_with_model`]).
    model: Option<Arc<TimingModel>>,
    /// NIC state files mapped, by node (this node's own included). Weak: the QPs that
    /// post to or from a node keep its mapping, so a departed node's is not kept here.
    nics: Mutex<HashMap<NodeId, std::sync::Weak<NicMap>>>,
}

impl Drop for FabricInner {
    fn drop(&mut self) {
        // The timing model's NIC state of this node: peers still mapping it keep their
        // copy; a later incarnation starts a fresh one.
        if self.model.is_some() {
            let _ = std::fs::remove_file(self.dir.join(format!("n{}.nic", self.node)));
        }
        // Unlink before the lock is released so nobody sees a dead node's file.
        let _ = std::fs::remove_file(&self.alive_path);
    }
}

/// The shm backend's fabric handle (one per node process; clones share it).
#[derive(Clone)]
pub struct ShmFabric {
    inner: Arc<FabricInner>,
}

impl ShmFabric {
    /// Join cluster `cluster` as node `node`, creating the cluster directory if needed.
    ///
    /// Errors: [`FabricError::NodeInUse`] if a live process is node `node`; I/O errors.
    pub fn open(cluster: &str, node: NodeId) -> Result<Self> {
        Self::open_with_model(cluster, node, None)
    }

    /// [`ShmFabric::open`] under a timing model (see [`super::model`]): WRs take effect
    /// and complete at their modeled times, doorbells cost the posting CPU, and the rate
    /// caps of each node's NIC are shared by all processes through `n<node>.nic` in the
    /// cluster directory. `None` is the plain backend, at no cost.
    ///
    /// Errors: as [`ShmFabric::open`]; the NIC state file cannot be created.
    pub fn open_with_model(
        cluster: &str,
        node: NodeId,
        model: Option<Arc<TimingModel>>,
    ) -> Result<Self> {
        Self::open_as(cluster, node, model, super::default_incarnation())
    }

    /// [`ShmFabric::open_with_model`] as incarnation `incarnation` of `node` (see
    /// [`super::Fabric::incarnation`]). Errors: as [`ShmFabric::open_with_model`].
    pub fn open_as(
        cluster: &str,
        node: NodeId,
        model: Option<Arc<TimingModel>>,
        incarnation: u64,
    ) -> Result<Self> {
        if cluster.is_empty() || cluster.contains('/') || cluster.contains("..") {
            return Err(FabricError::InvalidArgument {
                op: "open fabric",
                what: format!("cluster name {cluster:?} must be non-empty without '/' or '..'"),
            });
        }
        let dir = cluster_dir(cluster);
        let (mr_dir, huge) = mr_dir(cluster);
        for d in [&dir, &mr_dir] {
            ensure_dir(d)?;
        }
        let alive_path = dir.join(format!("n{node}.alive"));
        let mut alive = open_checked(
            &alive_path,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600),
            "create liveness file",
        )?;
        if !try_lock(&alive, libc::LOCK_EX) {
            return Err(FabricError::NodeInUse {
                node,
                cluster: cluster.to_string(),
                path: alive_path.display().to_string(),
            });
        }
        alive.set_len(0).map_err(io_err("write liveness file"))?;
        writeln!(alive, "{}", std::process::id()).map_err(io_err("write liveness file"))?;
        // Files left by an earlier incarnation of this node id (a process that was killed):
        // retire each (clear its live word, so peers still holding a mapping get a remote
        // access error instead of the dead process's memory), then remove it.
        let prefix = format!("n{node}-mr");
        for d in [&dir, &mr_dir] {
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    retire_mr_file(&e.path());
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        // Zero: no rkey handed out yet.
        let rkeys = map_shared_words(&dir.join("rkeys"), 8, "rkey counter")?;
        Ok(Self {
            inner: Arc::new(FabricInner {
                node,
                incarnation,
                fences: Arc::default(),
                cluster: cluster.to_string(),
                dir,
                mr_dir,
                huge,
                alive_path,
                _alive: alive,
                rkeys,
                next_qpn: AtomicU32::new(1),
                local: RwLock::new(HashMap::new()),
                local_gen: AtomicU64::new(0),
                remote: Mutex::new(RemoteCache::default()),
                model,
                nics: Mutex::new(HashMap::new()),
            }),
        })
        .and_then(|f| {
            if f.inner.model.is_some() {
                f.nic(node)?;
            }
            Ok(f)
        })
    }

    /// The timing model this fabric runs under, if any.
    pub fn model(&self) -> Option<&Arc<TimingModel>> {
        self.inner.model.as_ref()
    }

    /// Node `node`'s NIC state, mapped once per process (created if the node has not
    /// created it yet: a node without the model still has a NIC others reserve).
    fn nic(&self, node: NodeId) -> Result<Arc<NicMap>> {
        let mut nics = self.inner.nics.lock().expect("NIC table poisoned");
        if let Some(n) = nics.get(&node).and_then(std::sync::Weak::upgrade) {
            return Ok(n);
        }
        nics.retain(|_, w| w.strong_count() > 0);
        let n = Arc::new(NicMap::open(&self.inner.dir.join(format!("n{node}.nic")))?);
        nics.insert(node, Arc::downgrade(&n));
        Ok(n)
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
        format!(
            "shm (cluster {}, {}, {}, timing model {})",
            self.inner.cluster,
            self.inner.mr_dir.display(),
            if self.inner.huge {
                "hugepages"
            } else {
                "4 KiB pages"
            },
            self.inner
                .model
                .as_ref()
                .map_or("none", |m| &m.params().name)
        )
    }

    /// Allocate a zeroed MR of `len` bytes backed by a new shared file.
    pub fn alloc_mr(&self, len: usize) -> Result<ShmMr> {
        self.alloc_region(len, false)
    }

    /// Allocate "device memory": host memory like [`ShmFabric::alloc_mr`] (the shm fabric
    /// has no NIC), marked so that the timing model charges atomics on it at the NIC's
    /// device-memory rates.
    pub fn alloc_dm(&self, len: usize) -> Result<ShmMr> {
        self.alloc_region(len, true)
    }

    fn alloc_region(&self, len: usize, dm: bool) -> Result<ShmMr> {
        if len == 0 {
            return Err(FabricError::InvalidArgument {
                op: "alloc_mr",
                what: "length 0".into(),
            });
        }
        let key = self.next_rkey();
        // Regions smaller than a huge page stay on 4 KiB pages: a 16-byte credit word
        // would otherwise pin 2 MiB. Peers look in both directories.
        let huge = self.inner.huge && MR_HEADER_BYTES + len >= HUGE_PAGE_BYTES;
        let (page, dir) = if huge {
            (HUGE_PAGE_BYTES, &self.inner.mr_dir)
        } else {
            (PAGE_BYTES, &self.inner.dir)
        };
        let file_len = (MR_HEADER_BYTES + len).div_ceil(page) * page;
        let path = dir.join(format!("n{}-mr{key}", self.inner.node));
        let file = open_checked(
            &path,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600),
            "create MR file",
        )?;
        file.set_len(file_len as u64)
            .map_err(io_err("size MR file"))?;
        // SAFETY: the file is ours, freshly created with mode 0600; peers map it too,
        // which is the point: all access to the data goes through raw pointers or atomics.
        let map = unsafe {
            let mut o = MmapOptions::new();
            o.len(file_len);
            if len <= PREFAULT_MAX_BYTES {
                o.populate();
            }
            o.map_mut(&file)
        }
        .map_err(io_err("mmap MR file"))?;
        let data = map.as_ptr() as u64 + MR_HEADER_BYTES as u64;
        let header = [
            MR_MAGIC,
            u64::from(self.inner.node.get()) << 32 | u64::from(key),
            data,
            len as u64,
            if dm { HEADER_DM } else { 0 },
        ];
        // SAFETY: the header page is inside the mapping, page aligned, and not yet shared.
        unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), map.as_ptr() as *mut u64, 5) };
        live_word(&map).store(1, Ordering::Release);
        self.inner
            .local
            .write()
            .expect("MR table poisoned")
            .insert(key, LocalMr { base: data, len });
        Ok(ShmMr {
            fabric: self.inner.clone(),
            map,
            path,
            key,
            len,
        })
    }

    /// Create a CQ.
    pub fn create_cq(&self, depth: usize) -> ShmCq {
        ShmCq {
            queue: Arc::new(Mutex::new(VecDeque::with_capacity(depth))),
            rqs: Arc::new(Mutex::new(Vec::new())),
            timed: self.inner.model.as_ref().map(|_| {
                Arc::new(Mutex::new(Timed {
                    fabric: self.inner.clone(),
                    seq: 0,
                    slab: Vec::new(),
                    free: Vec::new(),
                    exec: BinaryHeap::new(),
                    done: BinaryHeap::new(),
                }))
            }),
        }
    }

    /// Create a QP (state Init) completing into `cq`, with its shared receive queue.
    pub fn create_qp(&self, cq: ShmCq, sq_depth: usize) -> Result<ShmQp> {
        let rq = Arc::new(RecvQueue {
            mr: self.alloc_mr(RQ_BYTES)?,
            posted: AtomicU64::new(0),
            seen: AtomicU64::new(0),
        });
        cq.rqs
            .lock()
            .expect("CQ poisoned")
            .push(Arc::downgrade(&rq));
        Ok(ShmQp {
            fabric: self.inner.clone(),
            cq,
            qpn: self.inner.next_qpn.fetch_add(1, Ordering::Relaxed),
            sq_depth: sq_depth.max(1),
            peer: None,
            state: QpState::Init,
            local_cache: HashMap::default(),
            local_gen: 0,
            rq,
            peer_rq: None,
            peer_state: None,
            timing: match &self.inner.model {
                Some(m) => Some(QpTiming {
                    model: m.clone(),
                    local_nic: self.nic(self.inner.node)?,
                    peer_nic: None,
                    last: (0, 0),
                    error: Arc::new(std::sync::atomic::AtomicBool::new(false)),
                }),
                None => None,
            },
        })
    }

    /// The next rkey of the cluster (never 0; wraps after 2^32 - 1 registrations).
    fn next_rkey(&self) -> u32 {
        // SAFETY: the mapping is 8 bytes, page aligned, lives as long as `self.inner`, and
        // is only ever accessed as this atomic word.
        let word = unsafe { &*(self.inner.rkeys.as_ptr() as *const AtomicU64) };
        loop {
            let k = word.fetch_add(1, Ordering::Relaxed).wrapping_add(1) as u32;
            if k != 0 {
                return k;
            }
        }
    }

    /// Map node `node`'s MR `rkey` (or share this process's live mapping of it). `None`:
    /// no such MR, or it was deregistered.
    fn map_remote(&self, node: NodeId, rkey: u32) -> Option<Arc<RemoteMr>> {
        let mut cache = self.inner.remote.lock().expect("remote MR cache poisoned");
        if let Some(r) = cache
            .map
            .get(&(node, rkey))
            .and_then(std::sync::Weak::upgrade)
        {
            if r.live() {
                return Some(r);
            }
            cache.map.remove(&(node, rkey));
            return None;
        }
        let name = format!("n{node}-mr{rkey}");
        let open = |d: &Path| {
            open_checked(
                &d.join(&name),
                OpenOptions::new().read(true).write(true),
                "map peer MR",
            )
        };
        let file = open(&self.inner.mr_dir)
            .or_else(|_| open(&self.inner.dir))
            .ok()?;
        let file_len = file.metadata().ok()?.len() as usize;
        if file_len < MR_HEADER_BYTES {
            return None;
        }
        // SAFETY: a peer's MR file, shared by design; accessed only through raw pointers
        // and atomics after the bounds checks in `ShmQp::remote_ptr`.
        let map = unsafe { MmapOptions::new().len(file_len).map_mut(&file) }.ok()?;
        let mut h = [0u64; 5];
        // SAFETY: the header is at the start of the mapping, which is page aligned.
        unsafe { std::ptr::copy_nonoverlapping(map.as_ptr() as *const u64, h.as_mut_ptr(), 5) };
        let (magic, id, base, len) = (h[0], h[1], h[2], h[3] as usize);
        if magic != MR_MAGIC
            || id != (u64::from(node.get()) << 32 | u64::from(rkey))
            || MR_HEADER_BYTES + len > file_len
        {
            return None;
        }
        let dm = h[4] & HEADER_DM != 0;
        let r = Arc::new(RemoteMr { map, base, len, dm });
        if !r.live() {
            return None;
        }
        cache.insert((node, rkey), &r);
        Some(r)
    }
}

/// An MR of the shm backend. Dropping it unregisters it and removes its file.
pub struct ShmMr {
    fabric: Arc<FabricInner>,
    map: MmapMut,
    path: PathBuf,
    key: u32,
    len: usize,
}

impl ShmMr {
    /// Base address of the data (bytes, this process's address space).
    pub fn addr(&self) -> u64 {
        self.map.as_ptr() as u64 + MR_HEADER_BYTES as u64
    }
    /// Length in bytes as asked at allocation.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the length is zero (never, allocation refuses it).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// lkey = rkey on shm.
    pub fn key(&self) -> u32 {
        self.key
    }
    /// Pointer to the data.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr() as *mut u8
    }
}

impl Drop for ShmMr {
    fn drop(&mut self) {
        // Deregistered: peers' later accesses fail (they check this word on every access).
        live_word(&self.map).store(0, Ordering::Release);
        if let Ok(mut t) = self.fabric.local.write() {
            t.remove(&self.key);
        }
        self.fabric.local_gen.fetch_add(1, Ordering::Release);
        let _ = std::fs::remove_file(&self.path);
    }
}

struct RemoteMr {
    map: MmapMut,
    base: u64,
    len: usize,
    /// Allocated as device memory (`alloc_dm`): the timing model charges its atomics so.
    dm: bool,
}

impl RemoteMr {
    /// Whether the owner still has the MR registered.
    fn live(&self) -> bool {
        live_word(&self.map).load(Ordering::Acquire) == 1
    }

    /// The local pointer of `addr..addr+len` in this MR; `None` if out of range or the MR
    /// was deregistered.
    fn ptr(&self, addr: u64, len: usize) -> Option<*mut u8> {
        if !self.live() {
            return None;
        }
        let off = addr.checked_sub(self.base)? as usize;
        (off.checked_add(len)? <= self.len)
            // SAFETY: off + len <= len of the data, which follows the header in the mapping.
            .then(|| unsafe { (self.map.as_ptr() as *mut u8).add(MR_HEADER_BYTES + off) })
    }
}

/// The live word of an MR file's mapping (see [`HEADER_LIVE`]).
fn live_word(map: &MmapMut) -> &AtomicU64 {
    // SAFETY: every MR mapping starts with the 4 KiB header; HEADER_LIVE is 8-byte aligned
    // inside it; AtomicU64 has u64's layout.
    unsafe { &*(map.as_ptr().add(HEADER_LIVE) as *const AtomicU64) }
}

/// Clear the live word of the MR file at `path` (of a dead incarnation of this node).
fn retire_mr_file(path: &Path) {
    let Ok(file) = open_checked(
        path,
        OpenOptions::new().read(true).write(true),
        "retire MR file",
    ) else {
        return;
    };
    if file
        .metadata()
        .map_or(true, |m| (m.len() as usize) < MR_HEADER_BYTES)
    {
        return;
    }
    // SAFETY: an MR file of this cluster; only its header's live word is touched, atomically.
    if let Ok(map) = unsafe { MmapOptions::new().len(MR_HEADER_BYTES).map_mut(&file) } {
        live_word(&map).store(0, Ordering::Release);
    }
}

/// This process's mappings of remote MRs, by (node, rkey): weak, so the QPs (and queued
/// WRs) that use a mapping keep it alive and nothing else does. Entries whose mapping is
/// gone are pruned whenever the table has doubled since the last pruning.
#[derive(Default)]
struct RemoteCache {
    map: HashMap<(NodeId, u32), std::sync::Weak<RemoteMr>>,
    prune_at: usize,
}

impl RemoteCache {
    fn insert(&mut self, key: (NodeId, u32), r: &Arc<RemoteMr>) {
        if self.map.len() >= self.prune_at {
            self.map.retain(|_, w| w.strong_count() > 0);
            self.prune_at = (2 * self.map.len()).max(64);
        }
        self.map.insert(key, Arc::downgrade(r));
    }
}

// Shared receive queue of a shm QP (SEND/RECV). A NIC keeps this state on the card; here
// it is a small MR of the owner's that the sending peer maps:
//   [0, 8)     completed: receive completions written, by the sender (its only writer)
//   [16, 24)   the owning QP's state (RQ_STATE), written by the owner
//   [24, 32)   the sender's busy word (RQ_BUSY), written by the sender
//   [64, ..)   RQ_DEPTH descriptors of 32 bytes: wr_id, addr, len, lkey (owner writes)
//   [.., ..)   RQ_DEPTH completions of 16 bytes: wr_id, byte_len, status (sender writes)
// and the count of posted descriptors lives at [8, 16), written only by the owner.
// Each word has one writer; slots are reused only after their completion was seen.
const RQ_DEPTH: u64 = 256;
const RQ_COMPLETED: usize = 0;
const RQ_POSTED: usize = 8;
/// The owning QP's state word: 0 while it may be used, 1 once it was moved to the error
/// state by a fence ([`super::Fabric::fence`]). Written only by the owner; the peer reads
/// it before executing each of its WRs, as a NIC would look at the responder QP's state.
const RQ_STATE: usize = 16;
/// The peer's busy word: 1 while the peer executes a one-sided WR on the owner's memory
/// (from its check of [`RQ_STATE`] to its store), else 0. Written only by the peer; a
/// fence waits for it to be 0 (the module docs' handshake).
const RQ_BUSY: usize = 24;
const RQ_DESC: usize = 64;
const RQ_DESC_BYTES: usize = 32;
const RQ_CQE: usize = RQ_DESC + RQ_DEPTH as usize * RQ_DESC_BYTES;
const RQ_CQE_BYTES: usize = 16;
const RQ_BYTES: usize = RQ_CQE + RQ_DEPTH as usize * RQ_CQE_BYTES;

struct RecvQueue {
    mr: ShmMr,
    /// Descriptors posted (the owner's count; mirrored to RQ_POSTED for the sender).
    posted: AtomicU64,
    /// Completions moved to the CQ.
    seen: AtomicU64,
}

impl RecvQueue {
    fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the 8-byte aligned header words inside the MR.
        unsafe { &*(self.mr.as_ptr().add(off) as *const AtomicU64) }
    }
}

/// A completion queue of the shm backend.
#[derive(Clone)]
pub struct ShmCq {
    queue: Arc<Mutex<VecDeque<Wc>>>,
    /// Receive queues of the QPs completing here: polled for receive completions.
    rqs: Arc<Mutex<Vec<std::sync::Weak<RecvQueue>>>>,
    /// Under a timing model: WRs of this CQ's QPs waiting for their modeled times.
    timed: Option<Arc<Mutex<Timed>>>,
}

impl ShmCq {
    /// Move up to `max` completions into `out` (receive completions the peers wrote
    /// into this CQ's QPs' receive queues first).
    pub fn poll(&self, out: &mut Vec<Wc>, max: usize) -> usize {
        if let Some(t) = &self.timed {
            t.lock()
                .expect("CQ poisoned")
                .drive(model::now_ns(), &self.queue);
        }
        let mut q = self.queue.lock().expect("CQ poisoned");
        self.rqs.lock().expect("CQ poisoned").retain(|w| {
            let Some(rq) = w.upgrade() else {
                return false;
            };
            let completed = rq.word(RQ_COMPLETED).load(Ordering::Acquire);
            let mut seen = rq.seen.load(Ordering::Relaxed);
            while seen < completed {
                let off = RQ_CQE + (seen % RQ_DEPTH) as usize * RQ_CQE_BYTES;
                // SAFETY: the completion slot is inside the MR and was published by the
                // release store of `completed` that the acquire load above saw.
                let (wr_id, len_status) = unsafe {
                    let p = rq.mr.as_ptr().add(off) as *const u64;
                    (p.read(), p.add(1).read())
                };
                q.push_back(Wc {
                    wr_id,
                    status: match len_status >> 32 {
                        0 => WcStatus::Success,
                        _ => WcStatus::LocalLength,
                    },
                    byte_len: len_status as u32,
                    recv: true,
                });
                seen += 1;
            }
            rq.seen.store(seen, Ordering::Relaxed);
            true
        });
        let n = q.len().min(max);
        out.extend(q.drain(..n));
        n
    }
    fn push(&self, wc: Wc) {
        self.queue.lock().expect("CQ poisoned").push_back(wc);
    }
}

struct Peer {
    node: NodeId,
    alive: File,
    /// The peer's MRs by rkey. A multiplicative hash: at most [`QP_MAPPINGS_MAX`]
    /// entries, and only rkeys the peer registered get one, so no flood of colliding keys.
    remote: HashMap<u32, Arc<RemoteMr>, crate::wire::IdHash>,
}

/// An RC queue pair of the shm backend.
pub struct ShmQp {
    fabric: Arc<FabricInner>,
    cq: ShmCq,
    qpn: u32,
    sq_depth: usize,
    peer: Option<Peer>,
    state: QpState,
    local_cache: HashMap<u32, (u64, usize), crate::wire::IdHash>,
    /// The fabric's `local_gen` when `local_cache` was last checked.
    local_gen: u64,
    /// This QP's receive queue (the peer SENDs into it).
    rq: Arc<RecvQueue>,
    /// The peer's receive queue (we SEND into it).
    peer_rq: Option<RemoteAddr>,
    /// The mapping of the peer's receive queue and the address of its QP's state word
    /// ([`RQ_STATE`]), checked before each WR.
    peer_state: Option<(Arc<RemoteMr>, u64)>,
    /// Under a timing model: the NICs and the QP's RC order.
    timing: Option<QpTiming>,
}

/// A QP's part of the timing model.
struct QpTiming {
    model: Arc<TimingModel>,
    local_nic: Arc<NicMap>,
    peer_nic: Option<Arc<NicMap>>,
    /// Execution and completion times of the last WR posted: the next is no earlier.
    last: (u64, u64),
    /// Set when the QP enters the error state: WRs still waiting are flushed.
    error: Arc<std::sync::atomic::AtomicBool>,
}

impl ShmQp {
    /// Endpoint to give the peer.
    pub fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            node: self.fabric.node,
            qpn: self.qpn,
            psn: 0,
            gid: [0; 16],
            lid: 0,
            gid_index: 0,
            mtu: 0,
            recv_queue: Some(RemoteAddr {
                addr: self.rq.mr.addr(),
                rkey: self.rq.mr.key(),
            }),
            incarnation: self.fabric.incarnation,
        }
    }

    /// What a fence calls to move this QP to the error state from any thread: it sets
    /// the state word in the QP's shared receive queue, which this QP's own state and
    /// the peer's every WR look at.
    pub(super) fn kill_handle(&self) -> super::KillQp {
        let rq = Arc::downgrade(&self.rq);
        let alive = self.peer.as_ref().and_then(|p| p.alive.try_clone().ok());
        let peer = self.peer.as_ref().map(|p| p.node);
        Box::new(move || {
            let Some(rq) = rq.upgrade() else { return };
            rq.word(RQ_STATE).store(1, Ordering::SeqCst);
            // The handshake (module docs): a WR the peer began before it could see the
            // state word lands before the fence returns.
            let t0 = std::time::Instant::now();
            let mut said = false;
            while rq.word(RQ_BUSY).load(Ordering::SeqCst) != 0 {
                if alive.as_ref().is_none_or(|f| try_lock(f, libc::LOCK_SH)) {
                    break; // the peer is dead: its store never comes
                }
                if !said && t0.elapsed() > std::time::Duration::from_secs(1) {
                    said = true;
                    tracing::warn!(?peer, "fence waits for a one-sided WR the fenced peer is executing (is the process stopped?)");
                }
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        })
    }

    /// The peer's state and busy words for [`guard_wr`]: `Ok(None)` without a peer
    /// receive queue (nothing to fence); `Err(())` when the peer destroyed its end (its
    /// receive queue is unmapped: a fenced QP the peer's node reaped), which fails the WR
    /// as a fence does.
    fn fence_guard(&self, keep: bool) -> std::result::Result<Option<FenceGuard>, ()> {
        let Some((m, state)) = self.peer_state.as_ref() else {
            return Ok(None);
        };
        if !m.live() {
            return Err(());
        }
        let s = m.ptr(*state, 8).ok_or(())? as usize;
        let b = m
            .ptr(*state - RQ_STATE as u64 + RQ_BUSY as u64, 8)
            .ok_or(())? as usize;
        Ok(Some(FenceGuard {
            map: keep.then(|| m.clone()),
            state: s,
            busy: b,
        }))
    }

    /// Whether the peer's end of this QP is down: moved to the error state by a fence,
    /// or destroyed (its receive queue deregistered; the peer's node reaps fenced and
    /// failed QPs). A NIC's requests to such a QP go unanswered.
    fn peer_fenced(&self) -> bool {
        self.peer_state.as_ref().is_some_and(|(m, addr)| {
            m.ptr(*addr, 8).is_none_or(|p| {
                // SAFETY: `p` is 8 bytes inside the peer's live, page-aligned receive
                // queue mapping (bounds-checked by `ptr`), RQ_STATE is 8-byte aligned,
                // and AtomicU64 has u64's layout.
                unsafe { &*(p as *const AtomicU64) }.load(Ordering::Acquire) != 0
            })
        })
    }

    /// Post receive buffers. Errors: more than the free slots of the receive queue.
    pub fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<()> {
        let rq = &self.rq;
        let posted = rq.posted.load(Ordering::Relaxed);
        let completed = rq.word(RQ_COMPLETED).load(Ordering::Acquire);
        if posted - completed + wrs.len() as u64 > RQ_DEPTH {
            return Err(FabricError::InvalidArgument {
                op: "post_recv",
                what: format!(
                    "receive queue full: {} posted, {} asked, depth {RQ_DEPTH}",
                    posted - completed,
                    wrs.len()
                ),
            });
        }
        for (i, w) in wrs.iter().enumerate() {
            let off = RQ_DESC + ((posted + i as u64) % RQ_DEPTH) as usize * RQ_DESC_BYTES;
            let d = [
                w.wr_id,
                w.sge.addr,
                u64::from(w.sge.len) | u64::from(w.sge.lkey) << 32,
            ];
            // SAFETY: the slot is inside the MR and free (its previous completion was
            // written, checked above); the sender reads it only after `posted` says so.
            unsafe {
                std::ptr::copy_nonoverlapping(d.as_ptr(), rq.mr.as_ptr().add(off) as *mut u64, 3)
            };
        }
        let now = posted + wrs.len() as u64;
        rq.posted.store(now, Ordering::Relaxed);
        rq.word(RQ_POSTED).store(now, Ordering::Release);
        Ok(())
    }

    /// Connect to the peer's endpoint: open its liveness file.
    pub fn connect(&mut self, remote: &QpEndpoint) -> Result<()> {
        let path = self.fabric.dir.join(format!("n{}.alive", remote.node));
        let alive = open_checked(
            &path,
            OpenOptions::new().read(true),
            "connect QP: open peer liveness file",
        )?;
        if try_lock(&alive, libc::LOCK_SH) {
            return Err(FabricError::QpError {
                peer: remote.node,
                why: "peer process is not running",
            });
        }
        self.peer = Some(Peer {
            node: remote.node,
            alive,
            remote: HashMap::default(),
        });
        self.peer_rq = remote.recv_queue;
        self.peer_state = remote.recv_queue.and_then(|rq| {
            let m = self.remote_mr(rq.rkey)?;
            Some((m, rq.addr + RQ_STATE as u64))
        });
        if let Some(t) = &mut self.timing {
            let fabric = ShmFabric {
                inner: self.fabric.clone(),
            };
            t.peer_nic = Some(fabric.nic(remote.node)?);
        }
        self.state = QpState::ReadyToSend;
        Ok(())
    }

    /// Peer node id, or `NodeId::MAX` before connect.
    pub fn peer(&self) -> NodeId {
        self.peer.as_ref().map_or(NodeId::MAX, |p| p.node)
    }

    /// State as last probed ([`ShmQp::probe`]; the QP wrapper probes at most once a
    /// millisecond).
    pub fn state(&mut self) -> QpState {
        if self
            .timing
            .as_ref()
            .is_some_and(|t| t.error.load(Ordering::Relaxed))
            || self.rq.word(RQ_STATE).load(Ordering::Acquire) != 0
        {
            self.set_error();
        }
        self.state
    }

    fn set_error(&mut self) {
        self.state = QpState::Error;
        if let Some(t) = &self.timing {
            t.error.store(true, Ordering::Relaxed);
        }
    }

    /// Check the peer's liveness lock now: a peer that exited puts the QP in error.
    /// Also lets go of mappings of MRs their owners deregistered (all of them once the QP
    /// is in error), so that a mapping unused since does not pin the memory.
    pub fn probe(&mut self) {
        if self.state == QpState::ReadyToSend {
            if let Some(p) = &self.peer {
                if try_lock(&p.alive, libc::LOCK_SH) {
                    self.set_error();
                }
            }
        }
        let error = self.state() == QpState::Error;
        if let Some(p) = &mut self.peer {
            if error {
                p.remote.clear();
            } else {
                p.remote.retain(|_, m| m.live());
            }
        }
    }

    /// Send-queue depth in WRs.
    pub fn sq_depth(&self) -> usize {
        self.sq_depth
    }

    /// Move the QP to the error state; later posts are refused. Without a timing model
    /// work already posted was executed at post time (the requester executes it), so
    /// nothing is flushed; under one, WRs not yet executed complete with
    /// [`WcStatus::Flushed`].
    pub fn to_error(&mut self) {
        self.set_error();
    }

    /// Execute the list in order (the caller checked state and depth); see
    /// [`super::QueuePair::post_send`].
    pub fn post_send(&mut self, wrs: &[SendWr]) -> Result<()> {
        if self.timing.is_some() {
            self.post_timed(wrs);
            return Ok(());
        }
        for wr in wrs {
            let status = if self.state == QpState::Error {
                WcStatus::Flushed
            } else {
                // The responder's QP fenced: a NIC's requests go unanswered
                // (`RetryExceeded`); else the WR, under the fence handshake.
                match self.fence_guard(false) {
                    Ok(guard) => guard_wr(guard.as_ref(), || self.execute(wr)),
                    Err(()) => WcStatus::RetryExceeded,
                }
            };
            if status != WcStatus::Success {
                self.state = QpState::Error;
            }
            if wr.signaled || status != WcStatus::Success {
                self.cq.push(send_wc(wr, status));
            }
        }
        Ok(())
    }

    fn local_ptr(&mut self, addr: u64, len: usize, lkey: u32) -> Option<*mut u8> {
        // A deregistration since the cache was filled may have made an entry stale (a
        // pointer into an unmapped region): start over.
        let gen = self.fabric.local_gen.load(Ordering::Acquire);
        if gen != self.local_gen {
            self.local_cache.clear();
            self.local_gen = gen;
        }
        let (base, mr_len) = match self.local_cache.get(&lkey) {
            Some(&v) => v,
            None => {
                let t = self.fabric.local.read().ok()?;
                let m = t.get(&lkey)?;
                self.local_cache.insert(lkey, (m.base, m.len));
                (m.base, m.len)
            }
        };
        let off = addr.checked_sub(base)? as usize;
        (off.checked_add(len)? <= mr_len).then_some(addr as *mut u8)
    }

    /// The peer's MR `rkey`, through this QP's mappings (bounded by [`QP_MAPPINGS_MAX`]).
    /// `None`: no such MR, or deregistered (then its mapping is dropped).
    fn remote_mr(&mut self, rkey: u32) -> Option<Arc<RemoteMr>> {
        let peer = self.peer.as_mut()?;
        if let Some(r) = peer.remote.get(&rkey) {
            if r.live() {
                return Some(r.clone());
            }
            peer.remote.remove(&rkey);
            return None;
        }
        let fabric = ShmFabric {
            inner: self.fabric.clone(),
        };
        let r = fabric.map_remote(peer.node, rkey)?;
        if peer.remote.len() >= QP_MAPPINGS_MAX {
            peer.remote.retain(|_, m| m.live());
            if peer.remote.len() >= QP_MAPPINGS_MAX {
                peer.remote.clear();
            }
        }
        peer.remote.insert(rkey, r.clone());
        Some(r)
    }

    fn remote_ptr(&mut self, addr: u64, len: usize, rkey: u32) -> Option<*mut u8> {
        // A mapping already cached: no reference count taken (the map keeps it alive).
        if let Some(r) = self.peer.as_ref().and_then(|p| p.remote.get(&rkey)) {
            if let Some(p) = r.ptr(addr, len) {
                return Some(p);
            }
        }
        self.remote_mr(rkey)?.ptr(addr, len)
    }

    /// Where a WR's remote side is, resolved at post time (a NIC resolves the rkey when
    /// the request arrives; mapping it early only saves the lookup later).
    fn resolve(&mut self, wr: &SendWr) -> Target {
        if wr.opcode == WrOpcode::Send {
            let Some(rq) = self.peer_rq else {
                return Target::Failed(WcStatus::RemoteInvalidRequest);
            };
            let Some(peer) = self.peer.as_ref().map(|p| p.node) else {
                return Target::Failed(WcStatus::RemoteAccess);
            };
            return match self.remote_mr(rq.rkey) {
                Some(map) => match map.ptr(rq.addr, RQ_BYTES) {
                    Some(base) => Target::Send {
                        _map: map,
                        base,
                        peer,
                    },
                    None => Target::Failed(WcStatus::RemoteAccess),
                },
                None => Target::Failed(WcStatus::RemoteAccess),
            };
        }
        if malformed_atomic(wr) {
            return Target::Failed(WcStatus::RemoteInvalidRequest);
        }
        match self.remote_mr(wr.remote.rkey) {
            Some(map) => match map.ptr(wr.remote.addr, op_len(wr)) {
                Some(ptr) => Target::Remote { map, ptr },
                None => Target::Failed(WcStatus::RemoteAccess),
            },
            None => Target::Failed(WcStatus::RemoteAccess),
        }
    }

    /// Under the timing model: pay the doorbell, plan each WR and queue it on the CQ, to
    /// execute and complete at its modeled times (the CQ's poll drives them).
    fn post_timed(&mut self, wrs: &[SendWr]) {
        if wrs.is_empty() {
            return;
        }
        let t = self.timing.as_ref().expect("timed QP");
        let posted = model::now_ns() + t.model.doorbell_ns();
        model::spin_until(posted);
        let mut queued = Vec::with_capacity(wrs.len());
        for wr in wrs {
            let len = op_len(wr);
            let local = self.local_ptr(wr.sge.addr, len, wr.sge.lkey);
            let target = match local {
                _ if self.state == QpState::Error => Target::Failed(WcStatus::Flushed),
                _ if self.peer_fenced() => Target::Failed(WcStatus::RetryExceeded),
                None => Target::Failed(WcStatus::LocalProtection),
                Some(_) => self.resolve(wr),
            };
            // WRITE and SEND payloads the caller may reuse at once: inline ones, and small
            // ones (the verbs backend inlines up to 64 bytes unasked).
            let data = match (&target, wr.opcode, local) {
                (
                    Target::Remote { .. } | Target::Send { .. },
                    WrOpcode::Write | WrOpcode::Send,
                    Some(src),
                ) if wr.inline || len <= 64 => {
                    // SAFETY: bounds-checked against the local MR by `local_ptr` above.
                    Some(Payload::copy(unsafe {
                        std::slice::from_raw_parts(src, len)
                    }))
                }
                _ => None,
            };
            let t = self.timing.as_mut().expect("timed QP");
            let local_failure = matches!(
                target,
                Target::Failed(WcStatus::Flushed | WcStatus::LocalProtection)
            );
            let plan = match &t.peer_nic {
                Some(peer) if !local_failure => {
                    let op = match (wr.opcode, &target) {
                        (WrOpcode::Read, _) => ModelOp::Read(len as u64),
                        (
                            WrOpcode::CmpSwap { .. } | WrOpcode::FetchAdd { .. },
                            Target::Remote { map, .. },
                        ) => ModelOp::Atomic {
                            dm: map.dm,
                            slot: model::addr_slot(wr.remote.rkey, wr.remote.addr),
                        },
                        _ => ModelOp::Write(len as u64),
                    };
                    t.model
                        .plan(op, posted, t.local_nic.nic(), peer.nic(), t.last)
                }
                // Fails in the requester: after the WRs before it, without a round trip.
                _ => model::Plan {
                    exec_ns: posted.max(t.last.0),
                    complete_ns: posted.max(t.last.1),
                },
            };
            t.last = (plan.exec_ns, plan.complete_ns);
            if local_failure {
                // Later WRs of the list are flushed; the error flag is set when this one
                // executes, after the WRs before it.
                self.state = QpState::Error;
            }
            let t = self.timing.as_ref().expect("timed QP");
            queued.push(Pending {
                exec_ns: plan.exec_ns,
                complete_ns: plan.complete_ns,
                wr: *wr,
                data,
                target,
                error: t.error.clone(),
                // A peer end already gone failed the WR above (`peer_fenced`).
                guard: self.fence_guard(true).ok().flatten(),
            });
        }
        let timed = self
            .cq
            .timed
            .as_ref()
            .expect("a timed QP completes into a timed CQ");
        let mut timed = timed.lock().expect("CQ poisoned");
        for p in queued {
            timed.queue(p);
        }
        timed.drive(model::now_ns(), &self.cq.queue);
    }

    fn execute(&mut self, wr: &SendWr) -> WcStatus {
        if wr.opcode == WrOpcode::Send {
            return self.send(wr);
        }
        let len = op_len(wr);
        if malformed_atomic(wr) {
            return WcStatus::RemoteInvalidRequest;
        }
        let Some(local) = self.local_ptr(wr.sge.addr, len, wr.sge.lkey) else {
            return WcStatus::LocalProtection;
        };
        let Some(remote) = self.remote_ptr(wr.remote.addr, len, wr.remote.rkey) else {
            return WcStatus::RemoteAccess;
        };
        // SAFETY: both ranges were bounds-checked against their MRs above; the mappings
        // stay alive while cached; atomics target 8-byte aligned words (checked above, and
        // mappings are page aligned).
        unsafe { perform(wr.opcode, local, remote, len) };
        WcStatus::Success
    }

    /// SEND: copy the payload into the peer's next posted receive buffer and write its
    /// receive completion.
    fn send(&mut self, wr: &SendWr) -> WcStatus {
        let len = wr.sge.len as usize;
        let Some(local) = self.local_ptr(wr.sge.addr, len, wr.sge.lkey) else {
            return WcStatus::LocalProtection;
        };
        let Some(rq) = self.peer_rq else {
            return WcStatus::RemoteInvalidRequest;
        };
        let Some(base) = self.remote_ptr(rq.addr, RQ_BYTES, rq.rkey) else {
            return WcStatus::RemoteAccess;
        };
        // SAFETY: `base` maps the peer's whole receive queue and `local` holds `len` bytes
        // (both bounds-checked just above); destinations come from `remote_ptr`, whose
        // mappings stay cached while the QP lives.
        unsafe {
            deliver_send(base, local, len, |addr, n, key| {
                self.remote_ptr(addr, n, key)
            })
        }
    }
}

fn is_atomic(op: WrOpcode) -> bool {
    matches!(op, WrOpcode::CmpSwap { .. } | WrOpcode::FetchAdd { .. })
}

/// Bytes a WR moves: 8 for atomics, the SGE's length otherwise.
fn op_len(wr: &SendWr) -> usize {
    if is_atomic(wr.opcode) {
        8
    } else {
        wr.sge.len as usize
    }
}

/// An atomic the responder must refuse: not 8 bytes at an 8-byte aligned address.
fn malformed_atomic(wr: &SendWr) -> bool {
    is_atomic(wr.opcode) && (wr.sge.len < 8 || !wr.remote.addr.is_multiple_of(8))
}

/// The completion of a send-queue WR.
fn send_wc(wr: &SendWr, status: WcStatus) -> Wc {
    Wc {
        wr_id: wr.wr_id,
        status,
        byte_len: op_len(wr) as u32,
        recv: false,
    }
}

/// Execute a READ, WRITE or atomic between `local` and `remote` (`len` bytes; 8 for
/// atomics).
///
/// # Safety
/// `local..local+len` and `remote..remote+len` are valid mappings (they may be shared with
/// other processes); atomics' `remote` is 8-byte aligned and `local` holds 8 bytes.
unsafe fn perform(opcode: WrOpcode, local: *mut u8, remote: *mut u8, len: usize) {
    match opcode {
        // SAFETY: caller's contract; local and remote buffers may alias only if the caller
        // READs its own MR, which `copy` (memmove) tolerates.
        WrOpcode::Read => unsafe { std::ptr::copy(remote, local, len) },
        // SAFETY: caller's contract.
        WrOpcode::Write => unsafe { write_last_word_last(local, remote, len) },
        WrOpcode::CmpSwap { compare, swap } => {
            // SAFETY: caller's contract; AtomicU64 has u64's layout.
            let word = unsafe { &*(remote as *const AtomicU64) };
            let old =
                match word.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(v) | Err(v) => v,
                };
            // SAFETY: local holds at least 8 bytes (caller's contract).
            unsafe { std::ptr::write_unaligned(local as *mut u64, old) };
        }
        WrOpcode::FetchAdd { add } => {
            // SAFETY: caller's contract; AtomicU64 has u64's layout.
            let word = unsafe { &*(remote as *const AtomicU64) };
            let old = word.fetch_add(add, Ordering::AcqRel);
            // SAFETY: local holds at least 8 bytes (caller's contract).
            unsafe { std::ptr::write_unaligned(local as *mut u64, old) };
        }
        WrOpcode::Send => unreachable!("SEND goes through deliver_send"),
    }
}

/// SEND's responder side: take the next receive descriptor of the receive queue at `base`,
/// copy `len` bytes from `local` into its buffer (found through `dst(addr, len, lkey)`) and
/// write the receive completion.
///
/// # Safety
/// `base..base+RQ_BYTES` maps a receive queue, `local..local+len` is readable, and the
/// pointers `dst` returns stay valid until this returns.
unsafe fn deliver_send(
    base: *mut u8,
    local: *const u8,
    len: usize,
    mut dst: impl FnMut(u64, usize, u32) -> Option<*mut u8>,
) -> WcStatus {
    let word = |off: usize| {
        // SAFETY: `base` maps the whole receive queue (caller's contract); header words are
        // 8-byte aligned (page-aligned MR).
        unsafe { &*(base.add(off) as *const AtomicU64) }
    };
    let completed = word(RQ_COMPLETED).load(Ordering::Relaxed);
    if word(RQ_POSTED).load(Ordering::Acquire) <= completed {
        return WcStatus::RnrRetryExceeded;
    }
    let d =
        base.wrapping_add(RQ_DESC + (completed % RQ_DEPTH) as usize * RQ_DESC_BYTES) as *const u64;
    // SAFETY: see above; the descriptor was published by the owner's release store.
    let (wr_id, addr, len_key) = unsafe { (d.read(), d.add(1).read(), d.add(2).read()) };
    let (cap, lkey) = (len_key as u32 as usize, (len_key >> 32) as u32);
    let (status, delivered) = if len > cap {
        (WcStatus::RemoteInvalidRequest, 1u64 << 32)
    } else {
        match dst(addr, len, lkey) {
            Some(to) => {
                // SAFETY: `to` is bounds-checked against the peer's MR by `dst`.
                unsafe { std::ptr::copy_nonoverlapping(local, to, len) };
                (WcStatus::Success, len as u64)
            }
            None => (WcStatus::RemoteAccess, 1u64 << 32),
        }
    };
    let c = base.wrapping_add(RQ_CQE + (completed % RQ_DEPTH) as usize * RQ_CQE_BYTES) as *mut u64;
    // SAFETY: the completion slot is inside the receive queue; the owner reads it only
    // after the release store of `completed` below.
    unsafe {
        c.write(wr_id);
        c.add(1).write(delivered);
    }
    word(RQ_COMPLETED).store(completed + 1, Ordering::Release);
    status
}

/// Map `bytes` of the cluster file at `path`, creating it zeroed if it does not exist yet
/// (openers racing to create it set the same length). For words shared by every process
/// of the cluster and accessed only as atomics; `what` names the file in errors.
fn map_shared_words(path: &Path, bytes: usize, what: &'static str) -> Result<MmapMut> {
    let file = open_checked(
        path,
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600),
        what,
    )?;
    if file.metadata().map_err(io_err(what))?.len() < bytes as u64 {
        file.set_len(bytes as u64).map_err(io_err(what))?;
    }
    // SAFETY: a file of this cluster's shared memory, accessed only through atomics.
    unsafe { MmapOptions::new().len(bytes).map_mut(&file) }.map_err(io_err(what))
}

/// A node's NIC state under the timing model: [`NIC_WORDS`] words in `n<node>.nic`, mapped
/// by every process that posts to or from that node.
struct NicMap {
    map: MmapMut,
}

impl NicMap {
    fn open(path: &Path) -> Result<Self> {
        // Zeroes: every resource free since boot.
        let map = map_shared_words(path, NIC_BYTES, "NIC state file")?;
        Ok(Self { map })
    }

    fn nic(&self) -> Nic<'_> {
        // SAFETY: the mapping holds NIC_WORDS words, is page aligned, lives as long as
        // `self`, and AtomicU64 has u64's layout with every bit pattern valid.
        let words =
            unsafe { std::slice::from_raw_parts(self.map.as_ptr() as *const AtomicU64, NIC_WORDS) };
        Nic::new(words)
    }
}

/// Where a queued WR goes.
enum Target {
    /// READ, WRITE or atomic: this pointer in the peer's mapped MR.
    Remote { map: Arc<RemoteMr>, ptr: *mut u8 },
    /// SEND into the receive queue mapped at `base` (kept alive by `map`) of node `peer`.
    Send {
        _map: Arc<RemoteMr>,
        base: *mut u8,
        peer: NodeId,
    },
    /// Fails with this status when its time comes.
    Failed(WcStatus),
}

/// A WRITE's or SEND's payload, copied at post time: up to 64 bytes in place (the
/// common case, and no allocation), longer inline payloads on the heap.
enum Payload {
    Small([u8; 64]),
    Large(Box<[u8]>),
}

impl Payload {
    fn copy(src: &[u8]) -> Self {
        if src.len() <= 64 {
            let mut bytes = [0; 64];
            bytes[..src.len()].copy_from_slice(src);
            Self::Small(bytes)
        } else {
            Self::Large(src.into())
        }
    }
    fn as_ptr(&self) -> *const u8 {
        match self {
            Self::Small(bytes) => bytes.as_ptr(),
            Self::Large(b) => b.as_ptr(),
        }
    }
}

/// A WR waiting for its modeled execution.
struct Pending {
    exec_ns: u64,
    complete_ns: u64,
    wr: SendWr,
    /// The payload, copied at post time (inline and small WRITEs and SENDs).
    data: Option<Payload>,
    target: Target,
    /// The QP's error flag.
    error: Arc<std::sync::atomic::AtomicBool>,
    /// The responder's state and busy words, checked when the WR executes.
    guard: Option<FenceGuard>,
}

// SAFETY: the raw pointers point into mappings owned by the `Arc<RemoteMr>` beside them
// (shared memory, valid from any thread); the local buffer is looked up again, under the
// MR table's lock, when the WR executes.
unsafe impl Send for Pending {}

/// The timed WRs of one CQ: executed in order of their modeled execution times (RC order
/// per QP holds: a QP's times never decrease and ties keep posting order), completed in
/// order of their completion times. The WRs wait in a slab; the heaps order small keys
/// (time, sequence, slab index) so that sifting moves 24 bytes, not a WR.
struct Timed {
    fabric: Arc<FabricInner>,
    seq: u64,
    slab: Vec<Option<Pending>>,
    /// Free indexes of `slab`.
    free: Vec<usize>,
    /// (execution time, seq, slab index) of the WRs waiting to execute.
    exec: BinaryHeap<Reverse<(u64, u64, usize)>>,
    /// (completion time, seq, completion) of executed WRs that produce one.
    done: BinaryHeap<Reverse<(u64, u64, WcKey)>>,
}

/// A [`Wc`] ordered by nothing (the heap orders by time and sequence).
#[derive(Clone, Copy)]
struct WcKey(Wc);
impl PartialEq for WcKey {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for WcKey {}
impl PartialOrd for WcKey {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for WcKey {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl Timed {
    /// Queue `p` for its execution time, after the WRs queued before it at that time.
    fn queue(&mut self, p: Pending) {
        let key = (p.exec_ns, self.seq);
        self.seq += 1;
        let i = match self.free.pop() {
            Some(i) => {
                self.slab[i] = Some(p);
                i
            }
            None => {
                self.slab.push(Some(p));
                self.slab.len() - 1
            }
        };
        self.exec.push(Reverse((key.0, key.1, i)));
    }

    /// Execute the WRs due by `now` and move the completions due by `now` to `queue`.
    fn drive(&mut self, now: u64, queue: &Mutex<VecDeque<Wc>>) {
        while self.exec.peek().is_some_and(|k| k.0 .0 <= now) {
            let Reverse((_, seq, i)) = self.exec.pop().expect("peeked");
            let p = self.slab[i].take().expect("a queued WR is in the slab");
            self.free.push(i);
            let status = self.run(&p);
            if status != WcStatus::Success {
                p.error.store(true, Ordering::Relaxed);
            }
            if p.wr.signaled || status != WcStatus::Success {
                let wc = send_wc(&p.wr, status);
                self.done.push(Reverse((p.complete_ns, seq, WcKey(wc))));
            }
        }
        if self.done.peek().is_some_and(|d| d.0 .0 <= now) {
            let mut q = queue.lock().expect("CQ poisoned");
            while self.done.peek().is_some_and(|d| d.0 .0 <= now) {
                q.push_back(self.done.pop().expect("peeked").0 .2 .0);
            }
        }
    }

    /// Execute one WR now.
    fn run(&self, p: &Pending) -> WcStatus {
        if p.error.load(Ordering::Relaxed) {
            return WcStatus::Flushed;
        }
        let len = op_len(&p.wr);
        // The local MR must still be registered; holding the table's read lock keeps its
        // owner from unmapping it until the WR is done (a copied payload needs neither).
        let table;
        let local = match &p.data {
            Some(d) => d.as_ptr() as *mut u8,
            None => {
                table = self.fabric.local.read().expect("MR table poisoned");
                let Some(m) = table.get(&p.wr.sge.lkey) else {
                    return WcStatus::LocalProtection;
                };
                match p.wr.sge.addr.checked_sub(m.base) {
                    Some(off) if off as usize + len <= m.len => p.wr.sge.addr as *mut u8,
                    _ => return WcStatus::LocalProtection,
                }
            }
        };
        match &p.target {
            Target::Failed(s) => *s,
            Target::Remote { map, .. } if !map.live() => WcStatus::RemoteAccess,
            Target::Remote { ptr, .. } => guard_wr(p.guard.as_ref(), || {
                // SAFETY: `ptr..ptr+len` was bounds-checked against the remote MR, whose
                // mapping `p` keeps alive; `local` is either `p`'s own copy (never a READ or
                // atomic destination: those have no copy) or inside a registered local MR
                // (checked above, kept mapped by the lock held).
                unsafe { perform(p.wr.opcode, local, *ptr, len) };
                WcStatus::Success
            }),
            Target::Send { base, peer, .. } => {
                let fabric = ShmFabric {
                    inner: self.fabric.clone(),
                };
                let mut keep = None;
                // SAFETY: `base` maps the peer's receive queue (kept alive by `p`); `local`
                // as above; `keep` holds the destination's mapping until the copy is done.
                unsafe {
                    deliver_send(*base, local, len, |addr, n, key| {
                        let m = fabric.map_remote(*peer, key)?;
                        let to = m.ptr(addr, n);
                        keep = Some(m);
                        to
                    })
                }
            }
        }
    }
}

impl Drop for Timed {
    /// The CQ is gone with WRs still waiting: a NIC would still carry them out, so they
    /// execute at their times (microseconds away, or a line's backlog on a slow profile);
    /// their completions have nowhere to go.
    fn drop(&mut self) {
        while let Some(Reverse((exec_ns, _, i))) = self.exec.pop() {
            model::spin_until(exec_ns);
            if let Some(p) = self.slab[i].take() {
                let _ = self.run(&p);
            }
        }
    }
}

/// Copy `len` bytes so that the last 8 become visible after the rest (release ordering).
///
/// # Safety
/// `src..src+len` readable, `dst..dst+len` writable; the ranges may be shared with other
/// processes but must not overlap each other.
unsafe fn write_last_word_last(src: *const u8, dst: *mut u8, len: usize) {
    if len <= 8 {
        fence(Ordering::Release);
        // SAFETY: caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    let head = len - 8;
    // SAFETY: caller's contract; head < len.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    // SAFETY: src + head .. src + len is in range.
    let last = unsafe { std::ptr::read_unaligned(src.add(head) as *const u64) };
    let tail = dst.wrapping_add(head);
    if (tail as usize).is_multiple_of(8) {
        // SAFETY: aligned, in range, and AtomicU64 has u64's layout.
        unsafe { (*(tail as *const AtomicU64)).store(last, Ordering::Release) };
    } else {
        fence(Ordering::Release);
        // SAFETY: in range.
        unsafe { std::ptr::write_unaligned(tail as *mut u64, last) };
    }
}

const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ShmFabric>();
    send_sync::<ShmMr>();
    send_sync::<ShmQp>();
    send_sync::<ShmCq>();
};
