//! Embeds the commit the binary is built from (`EMBER_COMMIT`: `git rev-parse
//! --short HEAD`, or "unknown" without git or outside a repository), so that every
//! benchmark row can name it. Never fails the build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// Reruns this script when HEAD moves: HEAD itself (a checkout), the branch it
/// points at (a commit) and packed-refs (the last two live in the common
/// directory of a worktree). Only files that exist are named (a missing one
/// would rerun the script on every build).
fn watch_head(git_dir: &Path, common_dir: &Path) {
    let mut files = vec![git_dir.join("HEAD"), common_dir.join("packed-refs")];
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        files.push(common_dir.join(r));
    }
    for f in files.into_iter().filter(|f| f.exists()) {
        println!("cargo:rerun-if-changed={}", f.display());
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let dir = PathBuf::from(dir);
        let common = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.clone());
        watch_head(&dir, &common);
    }
    println!("cargo:rustc-env=EMBER_COMMIT={commit}");
}
