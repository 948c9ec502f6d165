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
const LOWER_LAYERS: [&str; 19] = [
    "config_checks.rs",
    "online_em",
    "online_sga",
    "vifa",
    "minibatch",
    "engine",
    "linalg.rs",
    "m_step.rs",
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

/// Folders whose files must not import each other in a cycle (the folder's `mod.rs` excepted: it declares
/// the files, and they may use what it defines).
const ACYCLIC_FOLDERS: [&str; 9] = [
    "engine",
    "online_em",
    "online_sga",
    "vifa",
    "minibatch",
    "vbfa",
    "gfa",
    "linalg",
    "python",
];

/// The sibling files (by module name) that `text`, a file of folder `folder`, imports from: every
/// `super::name` or `crate::folder::name` outside comments, up to the file's first `#[cfg(test)]` (an inner
/// test module's `super::` is the file itself).
fn sibling_imports(text: &str, folder: &str, siblings: &[String]) -> Vec<String> {
    let crate_prefix = format!("crate::{folder}::");
    let mut found = Vec::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("#[cfg(test)]") {
            break;
        }
        if code.starts_with("//") {
            continue;
        }
        for prefix in ["super::", crate_prefix.as_str()] {
            for (at, _) in code.match_indices(prefix) {
                let rest = &code[at + prefix.len()..];
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if siblings.contains(&name) && !found.contains(&name) {
                    found.push(name);
                }
            }
        }
    }
    found
}

/// Import cycles among the files of `folder` (relative to `rust/`), each as "a -> b -> ... -> a".
fn import_cycles(folder: &str) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("rust").join(folder);
    let mut names: Vec<String> = fs::read_dir(&dir)
        .expect("listed folder exists")
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            let stem = p.file_stem()?.to_str()?.to_string();
            (p.extension().is_some_and(|x| x == "rs") && stem != "mod").then_some(stem)
        })
        .collect();
    names.sort();
    assert!(
        !names.is_empty(),
        "rust/{folder} holds no Rust file: update the folder list"
    );
    let edges: Vec<Vec<String>> = names
        .iter()
        .map(|n| {
            let text = fs::read_to_string(dir.join(format!("{n}.rs"))).expect("readable source file");
            let mut found = sibling_imports(&text, folder, &names);
            found.retain(|m| m != n); // a macro naming its own module is no cycle
            found
        })
        .collect();
    let index = |n: &str| names.iter().position(|m| m == n).expect("a sibling");
    let mut cycles = Vec::new();
    // A depth-first search from every file; a path that returns to its start is a cycle (reported once, from
    // its alphabetically first file).
    for start in 0..names.len() {
        let mut stack = vec![(start, vec![start])];
        while let Some((at, path)) = stack.pop() {
            for next in edges[at].iter().map(|n| index(n)) {
                if next == start {
                    let mut names_on: Vec<&str> = path.iter().map(|&i| names[i].as_str()).collect();
                    names_on.push(&names[start]);
                    cycles.push(names_on.join(" -> "));
                } else if next > start && !path.contains(&next) {
                    let mut longer = path.clone();
                    longer.push(next);
                    stack.push((next, longer));
                }
            }
        }
    }
    cycles
}

#[test]
fn no_folder_has_an_import_cycle() {
    let cycles: Vec<String> = ACYCLIC_FOLDERS
        .iter()
        .flat_map(|folder| import_cycles(folder).into_iter().map(move |c| format!("{folder}: {c}")))
        .collect();
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}

#[test]
fn the_cycle_check_sees_a_cycle() {
    // The scan must be able to fail: two files naming each other form a cycle.
    let siblings = vec!["a".to_string(), "b".to_string()];
    assert_eq!(
        sibling_imports("use super::b::X;\n// super::a\n", "f", &siblings),
        vec!["b"]
    );
    assert_eq!(
        sibling_imports("#[cfg(test)]\nuse super::b;\n", "f", &siblings),
        Vec::<String>::new()
    );
    assert_eq!(
        sibling_imports("let y = crate::f::a::g();\n", "f", &siblings),
        vec!["a"]
    );
}
