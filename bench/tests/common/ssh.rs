//! The launcher's ssh path on one host: an ssh stand-in and free loopback ports for
//! topology files whose "remote" host is this one.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A free loopback port (free when asked; a service binds it a moment later).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An ssh stand-in (for `$RRPC_SSH`) written into `dir`: it skips ssh's options and the
/// destination, and hands the command to a shell as sshd would.
pub fn ssh_shim(dir: &Path) -> PathBuf {
    let p = dir.join("ssh-shim");
    std::fs::write(
        &p,
        "#!/bin/sh\nwhile [ \"$1\" = \"-o\" ]; do shift 2; done\nshift\n[ \"$1\" = \"--\" ] && shift\nexec sh -c \"$*\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}
