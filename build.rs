//! Build script: says out loud that the release build is slow.
//!
//! The release profile links the core with fat LTO and one codegen unit, which takes minutes of
//! silence after the dependencies are compiled. Cargo prints a build script's `cargo:warning` lines,
//! and maturin passes them through, so `maturin build --release` (and `pip install -v .`) announce
//! the wait before it starts. Other profiles (`dev` for `cargo test`, `ci`) print nothing.

use std::env;
use std::path::Path;

/// Name of the Cargo profile being built, read from `OUT_DIR` = `<target>/<profile>/build/<crate>/out`
/// (Cargo sets `PROFILE` to "release" for every profile inheriting from release, `ci` included).
fn profile_dir_name() -> Option<String> {
    let out_dir = env::var_os("OUT_DIR")?;
    let profile_dir = Path::new(&out_dir).ancestors().nth(3)?;
    Some(profile_dir.file_name()?.to_string_lossy().into_owned())
}

fn main() {
    // Re-run only when the Rust sources change (the default is any file of the package, which would
    // recompile the core after every edit of a Python file or a doc).
    println!("cargo:rerun-if-changed=rust");
    println!("cargo:rerun-if-changed=build.rs");
    if profile_dir_name().as_deref() == Some("release") {
        println!(
            "cargo:warning=compiling the Rust core of onlinefa (release profile: fat LTO, one codegen \
             unit; several minutes on a small machine, with no output until it is done)"
        );
    }
}
