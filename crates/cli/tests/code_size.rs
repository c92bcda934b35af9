//! No source file of any crate is over 500 lines, tests aside: a file that long does more than
//! one job. Test code (`tests/`, benches, `tests.rs` and `*_tests.rs`, and modules declared
//! under `#[cfg(test)]`) may be longer. Functions are held to 80 lines by clippy
//! (`too_many_lines`, denied in Cargo.toml with its threshold in clippy.toml).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 500;

fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// The files and directories of modules declared `#[cfg(test)] mod name;` (with an optional
/// `#[path = "..."]` between), as paths without their `.rs`.
fn test_modules(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for file in files {
        let text = fs::read_to_string(file).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let dir = match file.file_stem().and_then(|s| s.to_str()) {
            Some("mod" | "lib" | "main") => file.parent().unwrap().to_path_buf(),
            _ => file.with_extension(""),
        };
        for (i, line) in lines.iter().enumerate() {
            if *line != "#[cfg(test)]" {
                continue;
            }
            let mut next = i + 1;
            let mut path = None;
            if let Some(p) = lines.get(next).and_then(|l| l.strip_prefix("#[path = \"")) {
                path = p.strip_suffix("\"]").map(str::to_owned);
                next += 1;
            }
            let Some(name) = lines
                .get(next)
                .and_then(|l| l.strip_prefix("mod "))
                .and_then(|l| l.strip_suffix(';'))
            else {
                continue;
            };
            let target = match path {
                Some(p) => file.parent().unwrap().join(p),
                None => dir.join(name),
            };
            out.insert(target.with_extension(""));
        }
    }
    out
}

fn is_test(path: &Path, root: &Path, test_modules: &BTreeSet<PathBuf>) -> bool {
    let relative = path.strip_prefix(root).unwrap();
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let in_tests_dir = relative.components().any(|c| {
        matches!(
            c.as_os_str().to_str(),
            Some("tests" | "benches" | "examples")
        )
    });
    in_tests_dir
        || stem == "tests"
        || stem.ends_with("_tests")
        || test_modules
            .iter()
            .any(|m| path.with_extension("") == *m || path.starts_with(m))
}

#[test]
fn no_source_file_is_over_500_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.retain(|f| !f.components().any(|c| c.as_os_str() == "target"));
    let tests = test_modules(&files);
    let mut long = Vec::new();
    let mut checked = 0;
    for file in &files {
        if is_test(file, &root, &tests) {
            continue;
        }
        checked += 1;
        let lines = fs::read_to_string(file).unwrap().lines().count();
        if lines > MAX_LINES {
            long.push(format!(
                "{} ({lines} lines)",
                file.strip_prefix(&root).unwrap().display()
            ));
        }
    }
    assert!(checked > 200, "only {checked} files checked");
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:#?}");
}
