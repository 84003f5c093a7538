//! Fabric floor: one RDMA WRITE each way through the fabric's own QPs, no RPC protocol.

use super::{run_pair, Meter, Patience, PeerConfig, RttSamples};
use anyhow::{bail, Context as _, Result};
use rrpc::fabric::{CompletionQueue, Fabric, MemoryRegion, QueuePair, SendWr, Wc, WrOpcode};

/// Every this many WRITEs one is signaled, so a real NIC's send queue is drained
/// (selective signaling, as rrpc's channels do).
const SIGNAL_EVERY: u64 = 32;

/// Send-queue depth of each QP (more than the WRITEs between two signaled ones).
const SQ_DEPTH: usize = 128;

/// Bytes of a message in flight: the payload, then an 8-byte sequence word written
/// last, which the receiver spins on.
fn message_bytes(payload: usize) -> usize {
    payload.next_multiple_of(8) + 8
}

/// One side: its fabric (kept alive), a send buffer, the MR the peer WRITEs into, and
/// one QP connected to the peer's.
struct Side {
    _fabric: Fabric,
    send: MemoryRegion,
    recv: MemoryRegion,
    cq: CompletionQueue,
    qp: QueuePair,
    /// Signaled WRITEs not yet seen on the CQ.
    unreaped: u64,
    /// WRITEs posted.
    posted: u64,
    /// Whether the fabric runs a timing model, whose WRs execute only as the CQ is polled.
    timed: bool,
    wcs: Vec<Wc>,
}

impl Side {
    fn new(fabric: Fabric, bytes: usize) -> Result<Self> {
        let send = fabric.alloc_mr(bytes).context("allocate the send buffer")?;
        let recv = fabric
            .alloc_mr(bytes)
            .context("allocate the receive buffer")?;
        let cq = fabric.create_cq(SQ_DEPTH).context("create the CQ")?;
        let qp = fabric.create_qp(&cq, SQ_DEPTH).context("create the QP")?;
        let timed = fabric.model_name() != "none";
        Ok(Self {
            _fabric: fabric,
            send,
            recv,
            cq,
            qp,
            unreaped: 0,
            posted: 0,
            timed,
            wcs: Vec::with_capacity(SQ_DEPTH),
        })
    }

    /// WRITE `msg` (its last 8 bytes the sequence word) into the peer's receive buffer.
    fn write(&mut self, peer: &rrpc::fabric::MrDesc, msg: &[u8]) -> Result<()> {
        self.send.write(0, msg);
        self.posted += 1;
        let signaled = self.posted.is_multiple_of(SIGNAL_EVERY);
        self.qp
            .post_send(&[SendWr {
                wr_id: self.posted,
                opcode: WrOpcode::Write,
                sge: self.send.sge(0, msg.len()),
                remote: peer.at(0),
                signaled,
                // Rewritten only after the peer answered, when the WRITE has landed;
                // the backend inlines small WRITEs on its own.
                inline: false,
            }])
            .context("post the WRITE")?;
        self.unreaped += u64::from(signaled);
        Ok(())
    }

    /// Reap completions while waiting (and, under a timing model, let the posted WRs
    /// execute). Errors on a failed WR.
    fn reap(&mut self) -> Result<()> {
        if self.unreaped == 0 && !self.timed {
            return Ok(());
        }
        self.wcs.clear();
        self.cq.poll(&mut self.wcs, SQ_DEPTH);
        for wc in &self.wcs {
            if wc.status != rrpc::fabric::WcStatus::Success {
                bail!("WRITE {} failed: {:?}", wc.wr_id, wc.status);
            }
            self.unreaped = self.unreaped.saturating_sub(1);
        }
        Ok(())
    }

    /// The round counter in the first 8 bytes (little endian) of the message in the
    /// receive buffer.
    fn counter(&self) -> u64 {
        let mut head = [0u8; 8];
        self.recv.read(0, &mut head);
        u64::from_le_bytes(head)
    }

    /// The sequence word of the message in the receive buffer.
    fn seq(&self, at: usize) -> u64 {
        self.recv.load_u64(at)
    }

    /// Whether message `want` has landed whole: its sequence word (at byte `at`) and its
    /// counter both read `want`. A NIC promises no order in which a WRITE's bytes land,
    /// and Soft-RoCE places them with `memcpy`, which may store the tail first and can
    /// tear a word. So a sequence word that reads anything else, or a counter still
    /// holding the last message's value, means "not yet", not an error; a message that
    /// never lands whole shows as a reply timeout.
    fn arrived(&self, at: usize, want: u64) -> bool {
        self.seq(at) == want && self.counter() == want
    }
}

/// Round-trip time of the fabric alone: the client WRITEs `request_bytes` plus an 8-byte
/// sequence word into the server's MR through a connected QP; the server spins on that
/// word, copies the counter into its reply and WRITEs `reply_bytes` plus the word back.
/// No ring, call table, executor or credit: the cost of any RPC built on this fabric
/// includes this. `open(n)` opens node `n` (1: server, 2: client) of a cluster the caller
/// prepared; both fabrics are opened and their QPs connected before the threads start.
///
/// One WRITE in 32 is signaled and reaped while spinning. Under a timing
/// model the QP executes WRs as its CQ is polled, so both sides poll their CQ while
/// spinning. A side takes a message once its sequence word and its counter both hold
/// the value it expects, since a NIC may place a WRITE's bytes in any order. Errors: a
/// bad config (before anything is opened), a fabric that cannot be opened or connected,
/// a failed WRITE, or no whole reply within [`super::REPLY_TIMEOUT`] (the error names the
/// sequence word and counter the client last saw).
pub fn fabric_rtt(cfg: &PeerConfig, open: &dyn Fn(u32) -> Result<Fabric>) -> Result<RttSamples> {
    cfg.validate().context("fabric: invalid config")?;
    let (req, rep) = (
        message_bytes(cfg.request_bytes),
        message_bytes(cfg.reply_bytes),
    );
    let bytes = req.max(rep).next_multiple_of(4096);
    let mut server = Side::new(open(1).context("fabric: open the server's node")?, bytes)?;
    let mut client = Side::new(open(2).context("fabric: open the client's node")?, bytes)?;
    let (s_ep, c_ep) = (server.qp.endpoint(), client.qp.endpoint());
    server
        .qp
        .connect(&c_ep)
        .context("fabric: connect the server's QP")?;
    client
        .qp
        .connect(&s_ep)
        .context("fabric: connect the client's QP")?;
    let (to_server, to_client) = (server.recv.desc(), client.recv.desc());
    run_pair(
        "fabric",
        move |ctx| {
            ctx.rendezvous(super::pin_current(cfg.server_core))?;
            let mut msg = vec![0u8; rep];
            let mut want = 1u64;
            let mut patience = Patience::new();
            loop {
                if !server.arrived(req - 8, want) {
                    server.reap()?;
                    if patience.server_spin(ctx) {
                        return Ok(());
                    }
                    continue;
                }
                msg[..8].copy_from_slice(&want.to_le_bytes());
                msg[rep - 8..].copy_from_slice(&want.to_le_bytes());
                server.write(&to_client, &msg)?;
                want += 1;
            }
        },
        move |ctx| {
            let setup = super::pin_current(cfg.client_core).and_then(|()| Meter::new(cfg));
            let mut meter = ctx.rendezvous(setup)?;
            meter.arm();
            let mut msg = vec![0u8; req];
            let mut i = 0u64;
            loop {
                i += 1;
                let t0 = meter.now();
                super::fill_payload(&mut msg[..req - 8], i);
                msg[req - 8..].copy_from_slice(&i.to_le_bytes());
                client.write(&to_server, &msg)?;
                let mut patience = Patience::new();
                while !client.arrived(rep - 8, i) {
                    client.reap()?;
                    patience
                        .client_spin(ctx, "fabric: wait for the reply")
                        .with_context(|| {
                            format!(
                                "reply {i}: sequence word {}, counter {}",
                                client.seq(rep - 8),
                                client.counter()
                            )
                        })?;
                }
                if meter.record(t0) {
                    return Ok(meter.finish());
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rrpc::fabric::{shm::ClusterGuard, FabricConfig, FabricKind};

    /// A message counts only once both its words hold the expected value, whichever
    /// lands first, and a torn sequence word is "not yet". (Seen on Soft-RoCE: the server
    /// read a sequence word torn between 255 and 256 as 0 beside a counter of 256; taking
    /// any new sequence word as a whole message failed the run.)
    #[test]
    fn a_message_counts_once_both_its_words_landed_in_either_order() {
        let name = format!("bench-fabric-arrived-{}", std::process::id());
        let (_cluster, _) = ClusterGuard::new(&name).unwrap();
        let fabric =
            Fabric::open(&FabricConfig::new(FabricKind::Shm, &name, rrpc::NodeId(1))).unwrap();
        let side = Side::new(fabric, 4096).unwrap();
        let at = message_bytes(32) - 8;
        let put = |off: usize, v: u64| side.recv.write(off, &v.to_le_bytes());
        // Message 255 has landed.
        put(0, 255);
        put(at, 255);
        assert!(side.arrived(at, 255));
        assert!(!side.arrived(at, 256));
        // 256: the counter lands, then the sequence word is read torn between 255
        // (ff 00 ..) and 256 (00 01 ..): the new low byte beside the old second byte.
        put(0, 256);
        assert!(!side.arrived(at, 256), "counter alone");
        put(at, 0);
        assert!(!side.arrived(at, 256), "torn sequence word");
        put(at, 256);
        assert!(side.arrived(at, 256));
        // 257's sequence word first (tail-first placement): the counter still says 256.
        put(at, 257);
        assert!(!side.arrived(at, 257), "sequence word alone");
        put(0, 257);
        assert!(side.arrived(at, 257));
    }
}
