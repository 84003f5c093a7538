//! The local etcd itself (no etcd client needed): it starts on free loopback ports, answers,
//! and is killed on drop; and without the `etcd` feature, joining says how to get it.

mod common;

use std::path::Path;

use common::etcd_or_skip;

#[test]
fn local_etcd_starts_answers_and_dies_on_drop() {
    let Some(env) = etcd_or_skip("local_etcd_starts_answers_and_dies_on_drop") else {
        return;
    };
    let endpoint = env.etcd.endpoint();
    assert!(endpoint.starts_with("http://127.0.0.1:"), "{endpoint}");
    let pid = env.etcd.pid();
    let proc_dir = format!("/proc/{pid}");
    assert!(Path::new(&proc_dir).exists());
    // A second one in parallel gets ports of its own.
    let Some(other) = etcd_or_skip("local_etcd_starts_answers_and_dies_on_drop (2nd)") else {
        return;
    };
    assert_ne!(other.etcd.endpoint(), endpoint);
    drop(env);
    // Killed and reaped (waited for), so its pid is gone.
    assert!(
        !Path::new(&proc_dir).exists(),
        "etcd {pid} outlived its LocalEtcd"
    );
}

#[cfg(not(feature = "etcd"))]
#[test]
fn join_without_the_feature_is_no_etcd_support() {
    use member::{Member, MemberError, Role};
    let Some(env) = etcd_or_skip("join_without_the_feature_is_no_etcd_support") else {
        return;
    };
    let e = Member::join(
        &env.endpoints(),
        "c",
        Role::Cnode,
        1,
        std::time::Duration::from_secs(1),
    )
    .unwrap_err();
    assert!(matches!(e, MemberError::NoEtcdSupport), "{e}");
}

#[test]
fn missing_etcd_says_what_to_install() {
    assert_eq!(
        member::MemberError::EtcdMissing.to_string(),
        "etcd not found on PATH or in /usr/bin: install Debian's etcd-server (apt-get install etcd-server)"
    );
}
