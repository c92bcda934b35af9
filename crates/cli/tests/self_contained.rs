//! The repository stands alone: no comment, doc, script or configuration file cites the project's
//! notes kept outside it (its domain, design and style notes, or its shared folder) or an issue
//! tracker number. A reader of a checkout cannot follow either; the facts they pointed at belong
//! in `docs/background.md` and `docs/architecture.md`, and a behaviour is described, not
//! referred to by ticket.
//!
//! The patterns are assembled from pieces so that this file does not match itself.

use std::fs;
use std::path::{Path, PathBuf};

/// Directories that are not the project's own text: build output, version control, other
/// checkouts, virtualenvs and engine installs, and engine output captured verbatim as fixtures.
fn skipped_dir(relative: &Path) -> bool {
    let name = relative
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    matches!(
        name,
        "target" | ".git" | ".worktrees" | ".real-vllm" | "node_modules"
    ) || name.starts_with(".venv")
        || relative == Path::new("test-data/vllm")
}

fn walk(root: &Path, dir: &Path, files: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let relative = path
            .strip_prefix(root)
            .expect("under the root")
            .to_path_buf();
        if path.is_dir() {
            if !skipped_dir(&relative) {
                walk(root, &path, files);
            }
        } else if path.is_file() {
            files.push(relative);
        }
    }
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The outside notes by file name.
fn cites_notes(line: &str) -> Option<String> {
    let suffix = [".", "md"].concat();
    ["DOMAIN", "DESIGN", "STYLE"]
        .iter()
        .map(|name| format!("{name}{suffix}"))
        .find(|note| line.contains(note.as_str()))
}

/// The shared folder as a path component (the folder's name, a slash, and a path beside the
/// checkout or inside it), not a word that merely ends in it.
fn cites_shared_folder(line: &str) -> bool {
    let needle = ["shared", "/"].concat();
    line.match_indices(needle.as_str()).any(|(at, _)| {
        line[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !is_word_char(c) && c != '-')
    })
}

/// The word for a tracker entry followed by its number (with a space, hash or hyphen between),
/// or a bare reference in parentheses: a hash and digits.
fn cites_issue(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    let word = ["iss", "ue"].concat();
    let by_word = lower.match_indices(word.as_str()).any(|(at, _)| {
        let before = lower[..at].chars().next_back();
        if before.is_some_and(is_word_char) {
            return false;
        }
        let rest = lower[at + word.len()..].trim_start_matches('s');
        let number = rest.trim_start_matches([' ', '#', '-']);
        number.len() < rest.len() && number.starts_with(|c: char| c.is_ascii_digit())
    });
    let by_reference = lower.match_indices("(#").any(|(at, _)| {
        let digits: String = lower[at + 2..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        !digits.is_empty() && lower[at + 2 + digits.len()..].starts_with(')')
    });
    by_word || by_reference
}

fn citation(line: &str) -> Option<String> {
    if let Some(note) = cites_notes(line) {
        return Some(note);
    }
    if cites_shared_folder(line) {
        return Some("the shared folder".into());
    }
    cites_issue(line).then(|| "an issue number".into())
}

#[test]
fn the_patterns_catch_what_they_mean_and_nothing_else() {
    let notes = ["DOMAIN", ".md §4"].concat();
    assert!(citation(&notes).is_some());
    let shared = ["see ../", "shared", "/real-vllm"].concat();
    assert!(citation(&shared).is_some());
    let word = ["Iss", "ue"].concat();
    let issues = [
        format!("({word} 10)"),
        format!("{}s 5 and 6", word.to_lowercase()),
        format!("{word} #3"),
        format!("an {word}-14 note"),
        format!("fixed (#{})", 23),
    ];
    for issue in &issues {
        assert!(citation(issue).is_some(), "{issue}");
    }
    let paths = ["unshared", "/ or pre-shared", "/ paths"].concat();
    for fine in [
        "the shared prefix",
        paths.as_str(),
        "a tissue 10 cm wide",
        "an issue with the scrape",
        "PKCS#8 keys",
        "colour #263241",
        "docs/background.md#stale-signals-and-herding",
    ] {
        assert_eq!(citation(fine), None, "{fine}");
    }
}

#[test]
fn no_file_cites_notes_outside_the_repository_or_an_issue_number() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().expect("repository root");
    let mut files = Vec::new();
    walk(&root, &root, &mut files);
    assert!(
        files.iter().any(|f| f == Path::new("README.md")),
        "{} is not the repository root",
        root.display()
    );
    let mut findings = Vec::new();
    for relative in &files {
        let Ok(bytes) = fs::read(root.join(relative)) else {
            continue;
        };
        // Binary files (images, fonts) are not text to cite anything in.
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        if text.contains('\0') {
            continue;
        }
        for (number, line) in text.lines().enumerate() {
            if let Some(what) = citation(line) {
                let shown: String = line.trim().chars().take(160).collect();
                findings.push(format!(
                    "{}:{}: cites {what}: {shown}",
                    relative.display(),
                    number + 1
                ));
            }
        }
    }
    assert!(
        findings.is_empty(),
        "{} line(s) cite what a reader of the repository cannot follow; write the fact down \
         (docs/background.md, docs/architecture.md) or describe the behaviour instead:\n{}",
        findings.len(),
        findings.join("\n")
    );
}
