//! Dependency rules between the crate's layers, checked on the source text.
//!
//! The streaming models (online EM, online SGA, VIFA, mini-batch fitting and the engine they share), the
//! linear-algebra layer and the shared foundations (scalars, scaling, schedules, state maps and their
//! checks, initialisation, noise, queries, errors, fork handling) must not depend on the VB-FA or
//! group-FA packages: those build on the lower layers, never the other way round. The engine (`engine/`)
//! names no model, and neither does the checkpoint layer (`state.rs`, `state_checks.rs`): the models call
//! them, never the reverse. Every listed path must exist, so a renamed file cannot drop out of the check
//! unnoticed.

use std::fs;
use std::path::{Path, PathBuf};

/// Files and folders (relative to `rust/`) of the layers below VB-FA.
const LOWER_LAYERS: [&str; 18] = [
    "config_checks.rs",
    "online_em",
    "online_sga",
    "vifa",
    "minibatch",
    "engine",
    "linalg.rs",
    "linalg",
    "query.rs",
    "scalar.rs",
    "scaling.rs",
    "schedule.rs",
    "state.rs",
    "state_checks.rs",
    "init.rs",
    "noise.rs",
    "error.rs",
    "fork.rs",
];

/// Paths a lower layer must not name.
const FORBIDDEN: [&str; 4] = ["crate::vbfa", "crate::gfa", "super::vbfa", "super::gfa"];

/// Paths the engine must not name: every model, and the crate root's re-exports of them.
const MODELS: [&str; 9] = [
    "crate::online_em",
    "crate::online_sga",
    "crate::vifa",
    "crate::minibatch",
    "crate::query",
    "crate::state_checks",
    "crate::vbfa",
    "crate::gfa",
    "crate::{",
];

/// Every `.rs` file at `path` (the file itself, or the files of the folder and its sub-folders).
fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        out.push(path.to_path_buf());
    } else if let Ok(entries) = fs::read_dir(path) {
        for entry in entries.flatten() {
            let p = entry.path();
            if p.is_dir() || p.extension().is_some_and(|e| e == "rs") {
                rust_files(&p, out);
            }
        }
    }
}

/// Every line of the files under `parts` (paths relative to `rust/`, each holding at least one file) that
/// names one of `forbidden`, as "file:line: path".
fn violations(parts: &[&str], forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("rust");
    let mut files = Vec::new();
    for part in parts {
        let before = files.len();
        rust_files(&root.join(part), &mut files);
        assert!(
            files.len() > before,
            "rust/{part} holds no Rust file: update the layer list"
        );
    }
    let mut found = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("readable source file");
        for (number, line) in text.lines().enumerate() {
            for path in forbidden.iter().filter(|path| line.contains(*path)) {
                found.push(format!("{}:{}: {path}", file.display(), number + 1));
            }
        }
    }
    found
}

#[test]
fn streaming_and_linear_algebra_do_not_use_vbfa_or_gfa() {
    let found = violations(&LOWER_LAYERS, &FORBIDDEN);
    assert!(found.is_empty(), "a lower layer names VB-FA or group FA: {found:?}");
}

#[test]
fn the_engine_names_no_model() {
    let found = violations(&["engine"], &MODELS);
    assert!(found.is_empty(), "the engine names a model: {found:?}");
}

#[test]
fn the_state_layer_names_no_model() {
    let found = violations(&["state.rs", "state_checks.rs"], &MODELS);
    assert!(found.is_empty(), "the checkpoint layer names a model: {found:?}");
}

#[test]
fn the_model_check_sees_a_model() {
    // The engine rule must be able to fail: the query layer names the models it answers for.
    assert!(!violations(&["query.rs"], &MODELS).is_empty());
}

#[test]
fn the_check_sees_a_forbidden_import() {
    // The scan above must be able to fail: the VB-FA package itself names the linear-algebra layer and
    // group FA names VB-FA, so scanning gfa/ for `crate::vbfa` finds it.
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("rust").join("gfa"),
        &mut files,
    );
    let found = files
        .iter()
        .any(|f| fs::read_to_string(f).is_ok_and(|t| t.contains("crate::vbfa")));
    assert!(found, "gfa/ should import from crate::vbfa");
}
