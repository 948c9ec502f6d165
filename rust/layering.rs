//! Dependency rules between the crate's layers, checked on the source text.
//!
//! The streaming models (online EM, online SGA, VIFA, mini-batch fitting and the engine they share), the
//! linear-algebra layer and the shared foundations (scalars, scaling, schedules, state maps and their
//! checks, initialisation, noise, queries, errors, fork handling) must not depend on the VB-FA or
//! group-FA packages: those build on the lower layers, never the other way round. The engine (`engine/`)
//! names no model, and neither does the checkpoint layer (`state.rs`, `state_checks.rs`): the models call
//! them, never the reverse, and the query layer (`query.rs`) names no model either: each model's
//! `GaussianRows` impl lives in its own folder. No two of the crate's top-level units (its folders and
//! top-level files) import each other in a cycle, and no folder's files do. The lists of units and folders
//! are read from the tree, so a new file or folder is checked without being listed; the few named paths
//! must exist, so a renamed file cannot drop out of the check unnoticed.

use std::fs;
use std::path::{Path, PathBuf};

/// The units that build on every other (VB-FA, group FA), and the binding, which may use everything.
const UPPER_UNITS: [&str; 3] = ["vbfa", "gfa", "python"];

/// Top-level files that are not units of the layering: the crate root, this check, crate-level tests.
const NOT_UNITS: [&str; 3] = ["lib", "layering", "trait_parts_tests"];

/// The crate's top-level units by module name: every folder of `rust/` and every `.rs` file at its top
/// (a file `x.rs` and a folder `x/` are one unit), sorted, without [`NOT_UNITS`].
fn crate_units() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("rust");
    let mut units: Vec<String> = fs::read_dir(&root)
        .expect("rust/ exists")
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            let name = p.file_stem()?.to_str()?.to_string();
            (p.is_dir() || p.extension().is_some_and(|x| x == "rs")).then_some(name)
        })
        .filter(|name| !NOT_UNITS.contains(&name.as_str()))
        .collect();
    units.sort();
    units.dedup();
    units
}

/// The paths (relative to `rust/`) of a unit: `name.rs` and the folder `name/`, those that exist.
fn unit_paths(name: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("rust");
    [format!("{name}.rs"), name.to_string()]
        .into_iter()
        .filter(|part| root.join(part).exists())
        .collect()
}

/// The units below VB-FA: every unit but [`UPPER_UNITS`], as paths relative to `rust/`.
fn lower_layers() -> Vec<String> {
    crate_units()
        .iter()
        .filter(|u| !UPPER_UNITS.contains(&u.as_str()))
        .flat_map(|u| unit_paths(u))
        .collect()
}

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
    let layers = lower_layers();
    assert!(layers.len() > 15, "the unit list was read from the tree: {layers:?}");
    let parts: Vec<&str> = layers.iter().map(String::as_str).collect();
    let found = violations(&parts, &FORBIDDEN);
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
    // The engine rule must be able to fail: the crate-level tests name the models they test.
    assert!(!violations(&["trait_parts_tests.rs"], &MODELS).is_empty());
}

/// The lines of `text` that are code outside tests: up to its first `#[cfg(test)]`, comments left out.
fn non_test_code(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim_start)
        .take_while(|code| !code.starts_with("#[cfg(test)]"))
        .filter(|code| !code.starts_with("//"))
}

/// The models the query layer must not name: it answers for any `GaussianRows`, and each model's impl
/// lives in the model's own folder.
const QUERY_MUST_NOT_NAME: [&str; 6] = [
    "crate::online_em",
    "crate::online_sga",
    "crate::vifa",
    "crate::minibatch",
    "crate::vbfa",
    "crate::gfa",
];

#[test]
fn the_query_layer_names_no_model() {
    let text =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("rust/query.rs")).expect("rust/query.rs exists");
    let found: Vec<&str> = non_test_code(&text)
        .filter(|code| QUERY_MUST_NOT_NAME.iter().any(|m| code.contains(m)))
        .collect();
    assert!(found.is_empty(), "query.rs names a model: {found:?}");
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
/// the files, and they may use what it defines): every folder of `rust/`, read from the tree.
fn acyclic_folders() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("rust");
    crate_units().into_iter().filter(|u| root.join(u).is_dir()).collect()
}

/// The names among `candidates` that the non-test code of `text` ([`non_test_code`]) names right after one of
/// `prefixes` (e.g. `super::name`, `crate::name`), each once, in order of first appearance.
fn names_after(text: &str, prefixes: &[&str], candidates: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for code in non_test_code(text) {
        for prefix in prefixes {
            for (at, _) in code.match_indices(prefix) {
                let rest = &code[at + prefix.len()..];
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if candidates.contains(&name) && !found.contains(&name) {
                    found.push(name);
                }
            }
        }
    }
    found
}

/// The sibling files (by module name) that `text`, a file of folder `folder`, imports from: every
/// `super::name` or `crate::folder::name` outside comments, up to the file's first `#[cfg(test)]` (an inner
/// test module's `super::` is the file itself).
fn sibling_imports(text: &str, folder: &str, siblings: &[String]) -> Vec<String> {
    names_after(text, &["super::", &format!("crate::{folder}::")], siblings)
}

/// The cycles of the graph with nodes `names` and edges `edges[i]` (names of nodes), each as
/// "a -> b -> ... -> a", reported once, from its alphabetically first node (`names` sorted).
fn cycles_of(names: &[String], edges: &[Vec<String>]) -> Vec<String> {
    let index = |n: &str| names.iter().position(|m| m == n).expect("a node");
    let mut cycles = Vec::new();
    // A depth-first search from every node; a path that returns to its start is a cycle.
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
    cycles_of(&names, &edges)
}

#[test]
fn no_folder_has_an_import_cycle() {
    let folders = acyclic_folders();
    assert!(
        folders.len() >= 9,
        "the folder list was read from the tree: {folders:?}"
    );
    let cycles: Vec<String> = folders
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

/// Is `file` (a path under `rust/`) test-only code: `tests.rs` or a `*_tests.rs`?
fn is_test_file(file: &Path) -> bool {
    file.file_stem()
        .and_then(|s| s.to_str())
        .is_some_and(|s| s == "tests" || s.ends_with("_tests"))
}

/// The other units that `text`, non-test code of unit `unit`, names: `crate::name` anywhere, and
/// `super::name` in a top-level file (where `super` is the crate root).
fn unit_imports(text: &str, unit: &str, top_level: bool, units: &[String]) -> Vec<String> {
    let prefixes: &[&str] = if top_level {
        &["crate::", "super::"]
    } else {
        &["crate::"]
    };
    let mut found = names_after(text, prefixes, units);
    found.retain(|name| name != unit);
    found
}

/// Import cycles among the crate's top-level units (their non-test code), each as "a -> b -> ... -> a".
fn unit_cycles() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("rust");
    let units = crate_units();
    let edges: Vec<Vec<String>> = units
        .iter()
        .map(|unit| {
            let mut found = Vec::new();
            for part in unit_paths(unit) {
                let mut files = Vec::new();
                rust_files(&root.join(&part), &mut files);
                for file in files.iter().filter(|f| !is_test_file(f)) {
                    let text = fs::read_to_string(file).expect("readable source file");
                    for name in unit_imports(&text, unit, part.ends_with(".rs"), &units) {
                        if !found.contains(&name) {
                            found.push(name);
                        }
                    }
                }
            }
            found
        })
        .collect();
    cycles_of(&units, &edges)
}

#[test]
fn no_two_units_import_each_other_in_a_cycle() {
    assert!(crate_units().len() > 15, "the unit list was read from the tree");
    let cycles = unit_cycles();
    assert!(cycles.is_empty(), "import cycles between units: {cycles:#?}");
}

#[test]
fn the_unit_check_sees_a_cycle() {
    // The scan must be able to fail: it reads `crate::` paths, and `super::` only at the top level.
    let units = vec!["a".to_string(), "b".to_string()];
    assert_eq!(
        unit_imports("use crate::b::X;\n// crate::a\n", "a", false, &units),
        vec!["b"]
    );
    assert_eq!(
        unit_imports("use super::b::X;\n", "a", false, &units),
        Vec::<String>::new()
    );
    assert_eq!(unit_imports("use super::b::X;\n", "a", true, &units), vec!["b"]);
    assert_eq!(
        unit_imports("#[cfg(test)]\nuse crate::b;\n", "a", false, &units),
        Vec::<String>::new()
    );
    let edges = vec![vec!["b".to_string()], vec!["a".to_string()]];
    assert_eq!(cycles_of(&units, &edges), vec!["a -> b -> a"]);
}
