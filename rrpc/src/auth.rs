//! The cluster secret and the mutual challenge every control (bootstrap) connection
//! starts with when one is configured.
//!
//! # Why
//!
//! Whoever reaches a node's control plane can connect QPs to it, open Rocket pairs under
//! any node id, and so call every handler (release another node's locks, install a
//! shard map) and read or write every exported region. A cluster secret, shared by the
//! cluster's processes and nobody else, lets a node refuse connections from outside.
//!
//! # The challenge
//!
//! Two request/response pairs on the connection, before any control request, each body
//! JSON under the key `"auth"` (so never taken for a control request, which has `"op"`):
//!
//! 1. the client sends [`Hello`]: protocol version, a fresh random nonce `Nc`
//!    ([`NONCE_BYTES`]) and the identity it claims ([`Identity`]: node id, role); the
//!    server answers [`Challenge`]: its own fresh nonce `Ns` and identity;
//! 2. the client sends [`Proof`] `HMAC-SHA256(secret, "client" | Nc | Ns | client id |
//!    server id)`; the server checks it and answers its own [`Proof`], the same MAC with
//!    the label `"server"`, which the client checks in turn.
//!
//! The client proves first, so a server gives an unauthenticated peer no MAC at all.
//! Each MAC covers both fresh nonces, so a recorded transcript replayed on a new
//! connection fails (the other side's nonce is new), and its direction, so a proof
//! reflected back to its sender (a server's proof offered as a client's, or the other
//! way round) fails. Fields are length-prefixed, so no two transcripts encode alike.
//! Proofs are compared in constant time.
//!
//! # What it does not do
//!
//! It proves that a peer holds the cluster secret, nothing more. Every process with the
//! secret can claim any node id and any role: roles cannot be proven with one shared
//! secret, so every authenticated peer is trusted (the failure model has no Byzantine
//! peers). A node checks what it can: a Rocket pair's node id must be the node id its
//! connection authenticated as. The connection is neither encrypted nor integrity
//! protected after the challenge: an attacker who can inject into the TCP stream can
//! take it over, so run the control plane on a network only the cluster reaches.
//!
//! # Where the secret comes from
//!
//! A process belongs to one cluster, so the secret is process-wide: services install
//! it from `--secret-file` (environment variable [`SECRET_FILE_ENV`]) or the topology
//! file; any other process (a benchmark driver, an embedding application) calls
//! [`install`], or sets [`SECRET_FILE_ENV`], which [`process_secret`] reads on first
//! use. Without a secret, control connections are not authenticated, as before; a node
//! listening beyond loopback then says so once in its log.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hmac::{KeyInit, Mac};
use serde::{Deserialize, Serialize};

/// Bytes of each side's random nonce.
pub const NONCE_BYTES: usize = 32;
/// Bytes of a proof (an HMAC-SHA256 tag).
pub const MAC_BYTES: usize = 32;
/// Fewest bytes a cluster secret may have (after trailing white space is removed from a
/// file's contents).
pub const MIN_SECRET_BYTES: usize = 16;
/// The challenge's version, in [`Hello::v`].
pub const VERSION: u32 = 1;
/// The environment variable naming the secret file ([`process_secret`], and the
/// services' `--secret-file`).
pub const SECRET_FILE_ENV: &str = "RRPC_SECRET_FILE";

/// Domain separation: what every MAC starts with.
const LABEL: &[u8] = b"rrpc control-plane challenge v1";

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// A cluster's shared secret: at least [`MIN_SECRET_BYTES`] bytes. Cheap to clone; its
/// `Debug` output never shows the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(Arc<[u8]>);

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterSecret({} bytes)", self.0.len())
    }
}

/// Why a cluster secret cannot be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The secret file could not be read.
    #[error("cluster secret file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The secret is shorter than [`MIN_SECRET_BYTES`].
    #[error(
        "cluster secret {from}: {len} bytes, need at least {MIN_SECRET_BYTES} (for example \
         `head -c 32 /dev/urandom | base64 > cluster.secret`)"
    )]
    TooShort {
        /// Where it came from (a file, or "given inline").
        from: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The operating system's random source failed (no nonce can be drawn).
    #[error("random nonce: {0}")]
    Random(String),
}

impl ClusterSecret {
    /// A secret of these bytes.
    ///
    /// Errors: [`SecretError::TooShort`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SecretError> {
        Self::checked(bytes, "given inline")
    }

    fn checked(bytes: &[u8], from: &str) -> Result<Self, SecretError> {
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort {
                from: from.into(),
                len: bytes.len(),
            });
        }
        Ok(Self(bytes.into()))
    }

    /// The secret in the file at `path`: its bytes without trailing white space (so a
    /// final newline does not matter). A file that group or others may read is used,
    /// with a warning.
    ///
    /// Errors: [`SecretError::Read`], [`SecretError::TooShort`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, SecretError> {
        let path = path.as_ref();
        let read = |source| SecretError::Read {
            path: path.to_path_buf(),
            source,
        };
        let bytes = std::fs::read(path).map_err(read)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            if let Ok(m) = std::fs::metadata(path) {
                if m.permissions().mode() & 0o077 != 0 {
                    tracing::warn!(
                        path = %path.display(),
                        "the cluster secret file may be read by other users; chmod 600 it"
                    );
                }
            }
        }
        let end = bytes
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(0, |i| i + 1);
        Self::checked(&bytes[..end], &path.display().to_string())
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes keys of any length: this cannot fail.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts keys of every length"),
        }
    }
}

/// What one end of a control connection claims to be, bound into both proofs. A claim
/// only: any holder of the secret can claim any identity (see the module's
/// documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The node id, if the end has one (a node, or a runtime with a fabric).
    #[serde(default)]
    pub node: Option<u32>,
    /// The role ("lockd", "memnode", "client", ...), for logs.
    #[serde(default)]
    pub role: String,
}

impl Identity {
    /// An identity with `node` and `role`.
    pub fn new(node: Option<u32>, role: impl Into<String>) -> Self {
        Self {
            node,
            role: role.into(),
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.node {
            Some(n) => write!(f, "node {n} ({})", self.role),
            None => write!(f, "{}", self.role),
        }
    }
}

/// The client's first message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The challenge version ([`VERSION`]).
    pub v: u32,
    /// The client's nonce, hex ([`NONCE_BYTES`] bytes).
    pub nonce: String,
    /// Who the client claims to be.
    pub id: Identity,
}

/// The server's answer to [`Hello`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    /// The server's nonce, hex ([`NONCE_BYTES`] bytes).
    pub nonce: String,
    /// Who the server claims to be.
    pub id: Identity,
}

/// A proof of the secret: an HMAC-SHA256 tag, hex ([`MAC_BYTES`] bytes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    /// The tag.
    pub mac: String,
}

/// The messages of the challenge as control-plane bodies: `{"auth": {"hello": ..}}`
/// and so on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMsg {
    /// Client to server, first.
    Hello(Hello),
    /// Client to server, second.
    Proof(Proof),
}

/// The key under which a control-plane body carries an [`AuthMsg`].
pub const AUTH_KEY: &str = "auth";

/// Why a challenge failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The peer speaks another version of the challenge.
    #[error("challenge version {got}, this side speaks {VERSION}")]
    Version {
        /// The peer's version.
        got: u32,
    },
    /// A nonce or proof is not hex of the right length.
    #[error("malformed {what}")]
    Malformed {
        /// Which field.
        what: &'static str,
    },
    /// Both sides drew the same nonce: a reflected hello.
    #[error("the peer's nonce is this side's own (a reflected challenge)")]
    Reflected,
    /// The proof is wrong: the peer does not hold this cluster's secret, or replays or
    /// reflects another connection's proof.
    #[error("wrong proof (wrong cluster secret, or a replayed or reflected transcript)")]
    BadProof,
    /// No random nonce could be drawn.
    #[error("random nonce: {0}")]
    Random(String),
}

/// A fresh random nonce from the operating system.
///
/// Errors: [`AuthError::Random`] when the OS source fails.
pub fn fresh_nonce() -> Result<[u8; NONCE_BYTES], AuthError> {
    let mut n = [0u8; NONCE_BYTES];
    getrandom::fill(&mut n).map_err(|e| AuthError::Random(e.to_string()))?;
    Ok(n)
}

/// Which side's proof a MAC is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

/// The proof of `side` over one connection's transcript.
fn proof_mac(
    secret: &ClusterSecret,
    side: Side,
    client_nonce: &[u8; NONCE_BYTES],
    server_nonce: &[u8; NONCE_BYTES],
    client: &Identity,
    server: &Identity,
) -> HmacSha256 {
    let mut m = secret.mac();
    let mut field = |b: &[u8]| {
        m.update(&(b.len() as u64).to_be_bytes());
        m.update(b);
    };
    field(LABEL);
    field(match side {
        Side::Client => b"client",
        Side::Server => b"server",
    });
    field(client_nonce);
    field(server_nonce);
    for id in [client, server] {
        match id.node {
            Some(n) => field(&(u64::from(n) | 1 << 32).to_be_bytes()),
            None => field(&[]),
        }
        field(id.role.as_bytes());
    }
    m
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

fn unhex<const N: usize>(s: &str, what: &'static str) -> Result<[u8; N], AuthError> {
    let bad = || AuthError::Malformed { what };
    let s = s.as_bytes();
    if s.len() != 2 * N {
        return Err(bad());
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err(bad()),
    };
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = digit(s[2 * i])? << 4 | digit(s[2 * i + 1])?;
    }
    Ok(out)
}

fn check(mac: HmacSha256, proof: &Proof) -> Result<(), AuthError> {
    let tag: [u8; MAC_BYTES] = unhex(&proof.mac, "proof")?;
    mac.verify_slice(&tag).map_err(|_| AuthError::BadProof)
}

fn tag(mac: HmacSha256) -> Proof {
    Proof {
        mac: hex(&mac.finalize().into_bytes()),
    }
}

/// The client's side of the challenge, a state machine without I/O: [`start`] gives
/// the [`Hello`] to send, [`on_challenge`] the [`Proof`] to send, [`finish`] checks the
/// server's proof.
///
/// [`start`]: ClientHandshake::start
/// [`on_challenge`]: ClientHandshake::on_challenge
/// [`finish`]: ClientHandshake::finish
#[derive(Debug)]
pub struct ClientHandshake {
    secret: ClusterSecret,
    me: Identity,
    nonce: [u8; NONCE_BYTES],
    server: Option<([u8; NONCE_BYTES], Identity)>,
}

impl ClientHandshake {
    /// Begin as `me`, with a fresh nonce.
    ///
    /// Errors: [`AuthError::Random`].
    pub fn start(secret: ClusterSecret, me: Identity) -> Result<(Self, Hello), AuthError> {
        Ok(Self::with_nonce(secret, me, fresh_nonce()?))
    }

    /// Begin as `me` with nonce `nonce` (tests; real nonces come from [`Self::start`]).
    pub fn with_nonce(
        secret: ClusterSecret,
        me: Identity,
        nonce: [u8; NONCE_BYTES],
    ) -> (Self, Hello) {
        let hello = Hello {
            v: VERSION,
            nonce: hex(&nonce),
            id: me.clone(),
        };
        (
            Self {
                secret,
                me,
                nonce,
                server: None,
            },
            hello,
        )
    }

    /// The server's challenge: the proof to send.
    ///
    /// Errors: [`AuthError::Malformed`], [`AuthError::Reflected`] (the server's nonce is
    /// this side's own).
    pub fn on_challenge(&mut self, c: &Challenge) -> Result<Proof, AuthError> {
        let ns: [u8; NONCE_BYTES] = unhex(&c.nonce, "server nonce")?;
        if ns == self.nonce {
            return Err(AuthError::Reflected);
        }
        let p = tag(proof_mac(
            &self.secret,
            Side::Client,
            &self.nonce,
            &ns,
            &self.me,
            &c.id,
        ));
        self.server = Some((ns, c.id.clone()));
        Ok(p)
    }

    /// The server's proof: the server's identity if it holds the secret.
    ///
    /// Errors: [`AuthError::BadProof`] (also before [`Self::on_challenge`]),
    /// [`AuthError::Malformed`].
    pub fn finish(self, p: &Proof) -> Result<Identity, AuthError> {
        let Some((ns, server)) = self.server else {
            return Err(AuthError::BadProof);
        };
        check(
            proof_mac(
                &self.secret,
                Side::Server,
                &self.nonce,
                &ns,
                &self.me,
                &server,
            ),
            p,
        )?;
        Ok(server)
    }
}

/// The server's side of the challenge, a state machine without I/O: [`on_hello`] gives
/// the [`Challenge`] to answer, [`on_proof`] checks the client's proof and gives the
/// server's.
///
/// [`on_hello`]: ServerHandshake::on_hello
/// [`on_proof`]: ServerHandshake::on_proof
#[derive(Debug)]
pub struct ServerHandshake {
    secret: ClusterSecret,
    me: Identity,
    nonce: [u8; NONCE_BYTES],
    client_nonce: [u8; NONCE_BYTES],
    client: Identity,
}

impl ServerHandshake {
    /// A client's hello, answered as `me` with a fresh nonce.
    ///
    /// Errors: [`AuthError::Version`], [`AuthError::Malformed`],
    /// [`AuthError::Reflected`], [`AuthError::Random`].
    pub fn on_hello(
        secret: ClusterSecret,
        me: Identity,
        hello: &Hello,
    ) -> Result<(Self, Challenge), AuthError> {
        Self::on_hello_with_nonce(secret, me, hello, fresh_nonce()?)
    }

    /// As [`Self::on_hello`] with nonce `nonce` (tests).
    ///
    /// Errors: as [`Self::on_hello`].
    pub fn on_hello_with_nonce(
        secret: ClusterSecret,
        me: Identity,
        hello: &Hello,
        nonce: [u8; NONCE_BYTES],
    ) -> Result<(Self, Challenge), AuthError> {
        if hello.v != VERSION {
            return Err(AuthError::Version { got: hello.v });
        }
        let client_nonce: [u8; NONCE_BYTES] = unhex(&hello.nonce, "client nonce")?;
        if client_nonce == nonce {
            return Err(AuthError::Reflected);
        }
        let challenge = Challenge {
            nonce: hex(&nonce),
            id: me.clone(),
        };
        Ok((
            Self {
                secret,
                me,
                nonce,
                client_nonce,
                client: hello.id.clone(),
            },
            challenge,
        ))
    }

    /// The client's proof: its identity and the server's proof to answer with, if it
    /// holds the secret.
    ///
    /// Errors: [`AuthError::BadProof`], [`AuthError::Malformed`].
    pub fn on_proof(self, p: &Proof) -> Result<(Identity, Proof), AuthError> {
        check(
            proof_mac(
                &self.secret,
                Side::Client,
                &self.client_nonce,
                &self.nonce,
                &self.client,
                &self.me,
            ),
            p,
        )?;
        let mine = tag(proof_mac(
            &self.secret,
            Side::Server,
            &self.client_nonce,
            &self.nonce,
            &self.client,
            &self.me,
        ));
        Ok((self.client, mine))
    }
}

// ---------------------------------------------------------------------------------------
// The process's secret.
// ---------------------------------------------------------------------------------------

/// `None` until [`install`] or the first [`process_secret`] that found one or found the
/// variable unset; then the process's secret (`Some(None)`: none).
static PROCESS: Mutex<Option<Option<ClusterSecret>>> = Mutex::new(None);

/// Make `secret` this process's cluster secret (`None`: no secret), replacing any
/// earlier one: control connections made or accepted from now on use it.
pub fn install(secret: Option<ClusterSecret>) {
    *PROCESS.lock().unwrap_or_else(|e| e.into_inner()) = Some(secret);
}

/// This process's cluster secret: the one [`install`]ed, else the one in the file that
/// [`SECRET_FILE_ENV`] names (read once, on first use), else none.
///
/// Errors: the variable names a file that cannot be read or is too short (asked again
/// on the next call, so a fixed file is picked up).
pub fn process_secret() -> Result<Option<ClusterSecret>, SecretError> {
    let mut slot = PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = &*slot {
        return Ok(s.clone());
    }
    let s = match std::env::var_os(SECRET_FILE_ENV) {
        Some(path) if !path.is_empty() => Some(ClusterSecret::from_file(PathBuf::from(path))?),
        _ => None,
    };
    *slot = Some(s.clone());
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> ClusterSecret {
        ClusterSecret::from_bytes(s.as_bytes()).unwrap()
    }

    const RIGHT: &str = "right secret, 32 bytes long......";
    const WRONG: &str = "wrong secret, 32 bytes long......";

    fn client_id() -> Identity {
        Identity::new(Some(100), "client")
    }

    fn server_id() -> Identity {
        Identity::new(Some(2), "lockd")
    }

    /// One whole challenge with these secrets: the server's view of the client and the
    /// client's view of the server, or the side that refused and why.
    fn run(client: &str, server: &str) -> Result<(Identity, Identity), (&'static str, AuthError)> {
        let (mut c, hello) = ClientHandshake::start(secret(client), client_id()).unwrap();
        let (s, challenge) = ServerHandshake::on_hello(secret(server), server_id(), &hello)
            .map_err(|e| ("server", e))?;
        let proof = c.on_challenge(&challenge).map_err(|e| ("client", e))?;
        let (who, server_proof) = s.on_proof(&proof).map_err(|e| ("server", e))?;
        let them = c.finish(&server_proof).map_err(|e| ("client", e))?;
        Ok((who, them))
    }

    #[test]
    fn the_right_secret_is_accepted_both_ways() {
        let (who, them) = run(RIGHT, RIGHT).unwrap();
        assert_eq!(who, client_id());
        assert_eq!(them, server_id());
    }

    #[test]
    fn a_wrong_secret_is_refused_by_the_server() {
        assert_eq!(
            run(WRONG, RIGHT).unwrap_err(),
            ("server", AuthError::BadProof)
        );
    }

    #[test]
    fn a_server_without_the_secret_is_refused_by_the_client() {
        // The server cannot make the client's proof check, so a fake server that
        // accepts any proof and answers with a made-up one is what the client sees.
        let (mut c, hello) = ClientHandshake::start(secret(RIGHT), client_id()).unwrap();
        let (s, challenge) = ServerHandshake::on_hello(secret(WRONG), server_id(), &hello).unwrap();
        let _ = c.on_challenge(&challenge).unwrap();
        let forged = tag(proof_mac(
            &secret(WRONG),
            Side::Server,
            &s.client_nonce,
            &s.nonce,
            &client_id(),
            &server_id(),
        ));
        assert_eq!(c.finish(&forged).unwrap_err(), AuthError::BadProof);
    }

    #[test]
    fn a_replayed_transcript_is_refused() {
        // An eavesdropper records a whole successful challenge...
        let (mut c, hello) = ClientHandshake::start(secret(RIGHT), client_id()).unwrap();
        let (s, challenge) = ServerHandshake::on_hello(secret(RIGHT), server_id(), &hello).unwrap();
        let proof = c.on_challenge(&challenge).unwrap();
        let (_, server_proof) = s.on_proof(&proof).unwrap();
        c.finish(&server_proof).unwrap();
        // ...and replays the client's messages on a new connection: the server's nonce
        // is new, so the old proof does not fit it.
        let (s2, challenge2) =
            ServerHandshake::on_hello(secret(RIGHT), server_id(), &hello).unwrap();
        assert_ne!(challenge2.nonce, challenge.nonce);
        assert_eq!(s2.on_proof(&proof).unwrap_err(), AuthError::BadProof);
        // Replaying the server's side to a new client fails the same way.
        let (mut c2, _) = ClientHandshake::start(secret(RIGHT), client_id()).unwrap();
        let _ = c2.on_challenge(&challenge).unwrap();
        assert_eq!(c2.finish(&server_proof).unwrap_err(), AuthError::BadProof);
    }

    #[test]
    fn a_reflected_challenge_is_refused() {
        // A fake server answers the client's hello with the client's own nonce: the
        // client refuses to prove anything over it.
        let (mut c, hello) = ClientHandshake::start(secret(RIGHT), client_id()).unwrap();
        let mirror = Challenge {
            nonce: hello.nonce.clone(),
            id: server_id(),
        };
        assert_eq!(c.on_challenge(&mirror).unwrap_err(), AuthError::Reflected);

        // A fake server hands the client's proof back as its own: the labels differ.
        let (mut c, hello) = ClientHandshake::start(secret(RIGHT), client_id()).unwrap();
        let (_, challenge) = ServerHandshake::on_hello(secret(RIGHT), server_id(), &hello).unwrap();
        let proof = c.on_challenge(&challenge).unwrap();
        assert_eq!(c.finish(&proof).unwrap_err(), AuthError::BadProof);

        // A fake client that learned a server's proof (here: from a real server, over
        // nonces of its choosing) offers it as a client's proof to another connection
        // with the same nonces: the labels differ again.
        let nc = [7u8; NONCE_BYTES];
        let ns = [9u8; NONCE_BYTES];
        let (mut c, hello) = ClientHandshake::with_nonce(secret(RIGHT), client_id(), nc);
        let (s, challenge) =
            ServerHandshake::on_hello_with_nonce(secret(RIGHT), server_id(), &hello, ns).unwrap();
        let proof = c.on_challenge(&challenge).unwrap();
        let (_, server_proof) = s.on_proof(&proof).unwrap();
        let (s2, _) =
            ServerHandshake::on_hello_with_nonce(secret(RIGHT), server_id(), &hello, ns).unwrap();
        assert_eq!(s2.on_proof(&server_proof).unwrap_err(), AuthError::BadProof);

        // A server refuses a hello carrying its own nonce.
        let own = ClientHandshake::with_nonce(secret(RIGHT), client_id(), ns).1;
        assert_eq!(
            ServerHandshake::on_hello_with_nonce(secret(RIGHT), server_id(), &own, ns).unwrap_err(),
            AuthError::Reflected
        );
    }

    #[test]
    fn identities_are_bound_into_the_proofs() {
        // A proof made for one claimed client identity does not pass for another.
        let nc = [1u8; NONCE_BYTES];
        let ns = [2u8; NONCE_BYTES];
        let (mut c, hello) = ClientHandshake::with_nonce(secret(RIGHT), client_id(), nc);
        let (_, challenge) =
            ServerHandshake::on_hello_with_nonce(secret(RIGHT), server_id(), &hello, ns).unwrap();
        let proof = c.on_challenge(&challenge).unwrap();
        let mut other = hello.clone();
        other.id.node = Some(101);
        let (s, _) =
            ServerHandshake::on_hello_with_nonce(secret(RIGHT), server_id(), &other, ns).unwrap();
        assert_eq!(s.on_proof(&proof).unwrap_err(), AuthError::BadProof);
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        let (mut c, mut hello) = ClientHandshake::start(secret(RIGHT), client_id()).unwrap();
        hello.v = 9;
        assert_eq!(
            ServerHandshake::on_hello(secret(RIGHT), server_id(), &hello).unwrap_err(),
            AuthError::Version { got: 9 }
        );
        hello.v = VERSION;
        for bad in ["", "zz", &"é".repeat(32), &"0".repeat(63)] {
            hello.nonce = bad.to_string();
            assert!(matches!(
                ServerHandshake::on_hello(secret(RIGHT), server_id(), &hello),
                Err(AuthError::Malformed { .. })
            ));
            let ch = Challenge {
                nonce: bad.to_string(),
                id: server_id(),
            };
            assert!(matches!(
                c.on_challenge(&ch),
                Err(AuthError::Malformed { .. })
            ));
        }
    }

    #[test]
    fn secrets_load_from_files_and_short_ones_are_refused() {
        let dir = std::env::temp_dir().join(format!("rrpc-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("secret");
        std::fs::write(&p, format!("{RIGHT}\n")).unwrap();
        assert_eq!(ClusterSecret::from_file(&p).unwrap(), secret(RIGHT));
        std::fs::write(&p, "short\n").unwrap();
        let e = ClusterSecret::from_file(&p).unwrap_err();
        assert!(matches!(e, SecretError::TooShort { len: 5, .. }), "{e}");
        let e = ClusterSecret::from_file(dir.join("missing")).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        assert!(!format!("{:?}", secret(RIGHT)).contains("right"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn hex_round_trips() {
        let n = [0u8, 1, 0x7f, 0x80, 0xff, 0x10, 0xab, 0xcd];
        assert_eq!(unhex::<8>(&hex(&n), "x").unwrap(), n);
        assert_eq!(unhex::<1>("Ab", "x").unwrap(), [0xab]);
    }
}
