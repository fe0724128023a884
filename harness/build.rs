//! Builds the git commit of the source into the crate (`SPECDEC_BUILD_COMMIT`,
//! `SPECDEC_BUILD_DIRTY`), so that `specdec version` and the provenance of every result name
//! the code that was compiled, not whatever repository the command later runs in. Without git
//! (a source tarball), `$SPECDEC_GIT_COMMIT` at build time, else `unknown`.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SPECDEC_GIT_COMMIT");
    let (commit, dirty) = match git(&["rev-parse", "HEAD"]) {
        Some(commit) if !commit.is_empty() => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .map_or("unknown".to_string(), |s| (!s.is_empty()).to_string());
            // rebuild when HEAD moves, the index changes, or a source folder does (the dirty flag)
            for dir in [
                "src",
                "../src",
                "../kernels/src",
                "../models/src",
                "../algorithms/src",
            ] {
                println!("cargo:rerun-if-changed={dir}");
            }
            for (what, file) in [("--git-dir", "HEAD"), ("--git-dir", "index")] {
                if let Some(dir) = git(&["rev-parse", what]) {
                    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                        .join(dir)
                        .join(file);
                    println!("cargo:rerun-if-changed={}", path.display());
                }
            }
            if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
                if let Some(path) = git(&["rev-parse", "--git-path", &reference]) {
                    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
                    println!("cargo:rerun-if-changed={}", path.display());
                }
            }
            (commit, dirty)
        }
        _ => (
            std::env::var("SPECDEC_GIT_COMMIT").unwrap_or_else(|_| "unknown".into()),
            "unknown".into(),
        ),
    };
    println!("cargo:rustc-env=SPECDEC_BUILD_COMMIT={commit}");
    println!("cargo:rustc-env=SPECDEC_BUILD_DIRTY={dirty}");
}
