//! rrpc as a third party sees it: a fresh crate outside this workspace depends on
//! `rrpc` by path with default features, builds offline (the lock file is this
//! workspace's, so the cached versions are picked), pulls no clap, ctrlc or
//! tracing-subscriber, and runs the typed key-value example (its `main.rs` is
//! `examples/kv_typed.rs`, which starts its own server) to the end.
//!
//! A second test resolves (without building) a crate that depends on the `lockd`, `tso`
//! and `txn` libraries with default features off: their `bin` features hold the service
//! binaries' dependencies, so none of clap, anyhow, ctrlc or tracing-subscriber appears.
//!
//! It builds in `$CARGO_TARGET_DIR/embed-check` (or `target/embed-check`), apart from the
//! target directory the running `cargo test` holds locked; the first run compiles rrpc's
//! dependencies there once.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `cargo` running this test (`$CARGO`), or the one on `PATH`.
fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Write the crate into `dir`.
fn write_crate(dir: &Path, rrpc: &Path) {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"rrpc-embed-check\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             publish = false\n\n[dependencies]\nrrpc = {{ path = {:?} }}\n\n[workspace]\n",
            rrpc.display().to_string()
        ),
    )
    .unwrap();
    std::fs::copy(rrpc.join("examples/kv_typed.rs"), dir.join("src/main.rs")).unwrap();
    std::fs::copy(rrpc.join("../Cargo.lock"), dir.join("Cargo.lock")).unwrap();
}

/// `cargo tree` of the crate at `manifest`: normal dependencies, one per line.
fn tree(manifest: &Path, target: &Path) -> String {
    let out = cargo()
        .args(["tree", "--offline", "--edges", "normal", "--prefix", "none"])
        .arg("--manifest-path")
        .arg(manifest)
        .env("CARGO_TARGET_DIR", target)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The dependencies only service binaries need are absent from `tree`.
fn assert_no_binary_deps(tree: &str) {
    for banned in ["clap", "ctrlc", "tracing-subscriber", "anyhow"] {
        assert!(
            !tree.lines().any(|l| l.starts_with(&format!("{banned} v"))),
            "{banned} in the dependency tree:\n{tree}"
        );
    }
}

/// The target directory of these builds: apart from the one `cargo test` holds locked.
fn target_dir(rrpc: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| rrpc.join("../target"))
        .join("embed-check")
}

#[test]
fn the_service_libraries_without_default_features_pull_no_binary_deps() {
    let rrpc = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let ws = rrpc.join("..");
    let dir = std::env::temp_dir().join(format!("rrpc-embed-libs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let dep = |name: &str| {
        format!(
            "{name} = {{ path = {:?}, default-features = false }}\n",
            ws.join(name).display().to_string()
        )
    };
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"rrpc-embed-libs\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             publish = false\n\n[dependencies]\n{}{}{}\n[workspace]\n",
            dep("lockd"),
            dep("tso"),
            dep("txn")
        ),
    )
    .unwrap();
    std::fs::write(dir.join("src/lib.rs"), "").unwrap();
    std::fs::copy(ws.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let t = tree(&dir.join("Cargo.toml"), &target_dir(&rrpc));
    for lib in ["lockd v", "tso v", "txn v", "rrpc v"] {
        assert!(t.lines().any(|l| l.starts_with(lib)), "{lib}: {t}");
    }
    assert_no_binary_deps(&t);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_crate_outside_the_workspace_builds_without_clap_and_runs_the_typed_example() {
    let rrpc = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("rrpc-embed-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_crate(&dir, &rrpc);
    let target = target_dir(&rrpc);
    let manifest = dir.join("Cargo.toml");

    let tree_out = tree(&manifest, &target);
    assert!(
        tree_out.lines().any(|l| l.starts_with("rrpc v")),
        "{tree_out}"
    );
    assert_no_binary_deps(&tree_out);

    let run = cargo()
        .args(["run", "--offline", "--quiet", "--manifest-path"])
        .arg(&manifest)
        .arg("--")
        .arg(format!("embed-check-{}", std::process::id()))
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RRPC_FABRIC")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "cargo run: {}\n{out}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(out.contains("get 1: Some(11)\n"), "{out}");
    assert!(out.contains("get 3: None\n"), "{out}");
    assert!(out.ends_with("kv_typed: ok\n"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
