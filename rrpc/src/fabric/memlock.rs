//! The locked-memory limit and what registering memory needs of it: a verbs MR pins its
//! pages, which counts against `RLIMIT_MEMLOCK` unless the process has `CAP_IPC_LOCK`.
//! A non-root user with a distribution's default limit (64 KiB or 8 MiB) otherwise gets
//! a bare `ibv_reg_mr: Cannot allocate memory`; these functions turn that into a
//! message that says the limit, the need and the fix.

/// The least memory an rrpc process registers: one client thread's buffers (32 MiB,
/// [`crate::runtime::RuntimeConfig::buffer_bytes`]); a server thread registers 64 MiB
/// ([`crate::server::ServerConfig::buffer_bytes`]), services their tables on top.
pub const FLOOR_BYTES: u64 = 32 << 20;

/// The soft `RLIMIT_MEMLOCK` in bytes; `None` when unlimited (or unreadable).
pub fn limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, which lives across the call.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// Whether the process may lock memory beyond the limit (`CAP_IPC_LOCK` in its
/// effective set, as root has).
pub fn exempt() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status_field(&status, "CapEff:")
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

/// Bytes this process has pinned now (`VmPin` of `/proc/self/status`; 0 if unknown).
pub fn pinned_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status_field(&status, "VmPin:")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
}

fn mib(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// The message for a memlock limit of `limit` bytes where `needed` bytes must be
/// locked: the limit, the need and the three usual fixes.
pub fn advice(limit: u64, needed: u64) -> String {
    format!(
        "RLIMIT_MEMLOCK is {} ({limit} bytes) but registering RDMA memory needs at least {} \
         ({needed} bytes; a client thread registers 32 MiB, a server thread 64 MiB, \
         services their tables on top). Raise the limit: `ulimit -l unlimited` in the shell \
         that starts the process (up to the hard limit, `ulimit -H -l`), a line \
         `* - memlock unlimited` in /etc/security/limits.conf (then log in again), or \
         LimitMEMLOCK=infinity in the systemd unit",
        mib(limit),
        mib(needed)
    )
}

/// The check made when the verbs fabric opens: `Err(advice)` when the limit is below
/// [`FLOOR_BYTES`] and the process is not exempt.
pub fn check_at_open(limit: Option<u64>, exempt: bool) -> Result<(), String> {
    match limit {
        Some(l) if !exempt && l < FLOOR_BYTES => Err(advice(l, FLOOR_BYTES)),
        _ => Ok(()),
    }
}

/// The message for a registration of `len` bytes that failed with `err`: when it is
/// ENOMEM and the limit (not exempt) is below what is pinned plus `len`, the memlock
/// advice; else `None` (the verb's own error stands).
pub fn explain_reg_failure(
    errno: Option<i32>,
    len: u64,
    limit: Option<u64>,
    exempt: bool,
    pinned: u64,
) -> Option<String> {
    let l = limit?;
    let needed = pinned.saturating_add(len);
    (errno == Some(libc::ENOMEM) && !exempt && needed > l).then(|| {
        format!(
            "registering {len} bytes with {pinned} bytes already pinned: {}",
            advice(l, needed)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_names_limit_need_and_fixes() {
        let e = check_at_open(Some(8 << 20), false).unwrap_err();
        for want in [
            "RLIMIT_MEMLOCK is 8 MiB (8388608 bytes)",
            "at least 32 MiB",
            "ulimit -l unlimited",
            "/etc/security/limits.conf",
            "LimitMEMLOCK=infinity",
        ] {
            assert!(e.contains(want), "{e} lacks {want}");
        }
        assert!(check_at_open(Some(8 << 20), true).is_ok(), "CAP_IPC_LOCK");
        assert!(check_at_open(None, false).is_ok(), "unlimited");
        assert!(check_at_open(Some(FLOOR_BYTES), false).is_ok());
        let m = explain_reg_failure(Some(libc::ENOMEM), 64 << 20, Some(64 << 20), false, 1 << 20)
            .unwrap();
        assert!(
            m.contains("registering 67108864 bytes with 1048576 bytes already pinned"),
            "{m}"
        );
        assert!(m.contains("needs at least 65 MiB"), "{m}");
        assert!(explain_reg_failure(Some(libc::EINVAL), 1 << 30, Some(1), false, 0).is_none());
        assert!(explain_reg_failure(Some(libc::ENOMEM), 1 << 30, None, false, 0).is_none());
        assert!(explain_reg_failure(Some(libc::ENOMEM), 1, Some(1 << 30), false, 0).is_none());
    }

    #[test]
    fn reads_this_process() {
        let _ = (limit(), exempt(), pinned_bytes());
        assert_eq!(status_field("VmPin:\t  12 kB\n", "VmPin:"), Some("12 kB"));
    }
}
