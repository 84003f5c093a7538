//! rrpc as a third party sees it: a fresh crate outside this workspace depends on
//! `rrpc` by path with default features, builds offline (the lock file is this
//! workspace's, so the cached versions are picked), pulls no clap, ctrlc or
//! tracing-subscriber, and runs the typed key-value example (its `main.rs` is
//! `examples/kv_typed.rs`, which starts its own server) to the end.
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

#[test]
fn a_crate_outside_the_workspace_builds_without_clap_and_runs_the_typed_example() {
    let rrpc = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("rrpc-embed-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_crate(&dir, &rrpc);
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| rrpc.join("../target"))
        .join("embed-check");
    let manifest = dir.join("Cargo.toml");

    let tree = cargo()
        .args([
            "tree",
            "--offline",
            "--edges",
            "normal",
            "--prefix",
            "none",
            "--manifest-path",
        ])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    let tree_out = String::from_utf8_lossy(&tree.stdout);
    assert!(
        tree.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&tree.stderr)
    );
    assert!(
        tree_out.lines().any(|l| l.starts_with("rrpc v")),
        "{tree_out}"
    );
    for banned in ["clap", "ctrlc", "tracing-subscriber"] {
        assert!(
            !tree_out
                .lines()
                .any(|l| l.starts_with(&format!("{banned} v"))),
            "{banned} in the default dependency tree:\n{tree_out}"
        );
    }

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
