//! Build script: the git revision the benchmark binaries were built from, for the
//! metadata record of their `--json` output (`BENCH_GIT_REV`; `unknown` when git or the
//! repository is missing, as in a source tarball).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    let rev = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BENCH_GIT_REV={rev}");
    println!("cargo:rerun-if-changed=build.rs");
    // A new commit moves HEAD (or the branch it names): rebuild then, not on every edit.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        for f in ["HEAD", "logs/HEAD"] {
            let p = std::path::Path::new(&dir).join(f);
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
}
