//! `kvgate config check`, `kvgate serve --check` and `kvgate completions`, run as an operator
//! runs them: on the README's own example, on files with a mistake, and with flags.

mod support;

use std::process::{Command, Output};

fn kvgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The YAML example under the README's "Configuration" heading.
fn readme_example() -> String {
    let readme = include_str!("../../../README.md");
    let section = &readme[readme.find("## Configuration").unwrap()..];
    let start = section.find("```yaml\n").unwrap() + "```yaml\n".len();
    section[start..][..section[start..].find("```").unwrap()].to_owned()
}

#[test]
fn the_readme_example_is_valid_and_prints_with_every_default() {
    let path = support::config_file("check-readme", &readme_example());
    let out = kvgate(&["config", "check", path.to_str().unwrap()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(": valid"), "{stderr}");
    // Its own values, and defaults it does not state.
    for expected in [
        "balance_abs_threshold: 64.0",
        "interval_ms: 500",
        "max_attempts: 3",
    ] {
        assert!(
            stdout.contains(expected),
            "{expected} missing from:\n{stdout}"
        );
    }
    // What it prints is a configuration that means the same.
    let again = support::config_file("check-readme-again", &stdout);
    assert!(kvgate(&["config", "check", "-q", again.to_str().unwrap()])
        .status
        .success());
}

#[test]
fn mistakes_fail_with_the_field_and_why() {
    let cases = [
        (
            "policy: {name: cache_aware, cache_threshold: 2}\n",
            "cache_threshold must be within 0..=1",
        ),
        (
            "endpoints: [{url: 'http://a:1', wieght: 2}]\n",
            "unknown field `wieght`",
        ),
        (
            "endpoints: [{url: 'https://a:1', ca_file: /no/such/ca.pem}]\n",
            "endpoints[].ca_file: /no/such/ca.pem",
        ),
        (
            "tls: {cert_file: /no/cert.pem, key_file: /no/key.pem}\n",
            "/no/cert.pem",
        ),
    ];
    for (i, (yaml, says)) in cases.iter().enumerate() {
        let path = support::config_file(&format!("check-bad-{i}"), yaml);
        let out = kvgate(&["config", "check", path.to_str().unwrap()]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{yaml} passed");
        assert!(
            stderr.contains("is not a valid configuration") && stderr.contains(says),
            "{yaml}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "nothing printed for an invalid file");
    }
}

#[test]
fn serve_check_applies_the_flags_masks_secrets_and_does_not_serve() {
    let out = kvgate(&[
        "serve",
        "--check",
        "--listen",
        "127.0.0.1:1",
        "--endpoint",
        "http://10.1.2.3:8000",
        "--policy",
        "round_robin",
        "--admin-token",
        "s3cret",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("the flags: valid"), "{stderr}");
    assert!(
        stdout.contains("url: http://10.1.2.3:8000") && stdout.contains("name: round_robin"),
        "{stdout}"
    );
    assert!(
        stdout.contains("admin_token: <masked>") && !stdout.contains("s3cret"),
        "{stdout}"
    );
    let out = kvgate(&[
        "epp",
        "--check",
        "--policy",
        "no_such_policy",
        "--endpoint",
        "http://10.1.2.3:8000",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no_such_policy"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn completions_cover_every_subcommand() {
    let out = kvgate(&["completions", "bash"]);
    assert!(out.status.success());
    let script = text(&out.stdout);
    for sub in [
        "serve",
        "epp",
        "engine",
        "sim",
        "bench",
        "config",
        "completions",
    ] {
        assert!(script.contains(sub), "{sub} missing");
    }
    assert!(kvgate(&["completions", "zsh"]).status.success());
    assert!(!kvgate(&["completions", "tcsh"]).status.success());
}
