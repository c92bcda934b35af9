//! `kvgate stats` as scripts use it: numbers on stdin or a field of JSON lines, summarised by
//! the one percentile definition (NumPy's linear interpolation); nothing to summarise is null,
//! never 0.

use std::io::Write;
use std::process::{Command, Stdio};

fn stats(args: &[&str], input: &str) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .arg("stats")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kvgate runs");
    let written = child.stdin.take().unwrap().write_all(input.as_bytes());
    // A command that refuses its arguments may exit before it reads its input.
    if let Err(e) = written {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(if out.status.success() {
        &out.stdout
    } else {
        &out.stderr
    })
    .into_owned();
    (out.status.success(), text)
}

#[test]
fn percentiles_of_numbers_and_of_a_filtered_field() {
    let (ok, out) = stats(
        &["--json", "--percentiles", "10", "--within", "0.8,1.2"],
        "1\n0.9\n1.1\n2\n",
    );
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    // numpy.percentile([0.9, 1, 1.1, 2], [50, 95, 10]) = [1.05, 1.865, 0.93]
    assert!((v["p50"].as_f64().unwrap() - 1.05).abs() < 1e-9, "{v}");
    assert!((v["p95"].as_f64().unwrap() - 1.865).abs() < 1e-9, "{v}");
    assert!((v["p10"].as_f64().unwrap() - 0.93).abs() < 1e-9, "{v}");
    assert_eq!(v["within"], 0.75);
    let log = "{\"tenant\":\"light\",\"queue_ms\":4}\n{\"tenant\":\"heavy\",\"queue_ms\":90}\n";
    let (ok, out) = stats(
        &["--field", "queue_ms", "--where", "tenant=light", "--json"],
        log,
    );
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["count"].as_u64(), v["max"].as_f64()),
        (Some(1), Some(4.0))
    );
}

#[test]
fn nothing_to_summarise_is_null_and_bad_input_is_an_error() {
    let (ok, out) = stats(&["--json", "--within", "0,1"], "");
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["count"], 0);
    assert!(
        v["p50"].is_null() && v["mean"].is_null() && v["within"].is_null(),
        "{v}"
    );
    let (ok, err) = stats(&[], "1\nfast\n");
    assert!(!ok && err.contains("line 2"), "{err}");
    let (ok, err) = stats(&["--where", "tenant"], "{}\n");
    assert!(!ok && err.contains("KEY=VALUE"), "{err}");
}
