//! `kvgate probe` (the container image's HEALTHCHECK) against real listeners: a 2xx exits 0,
//! any other status exits 1 naming it, and a port nobody listens on exits 1 saying so; then
//! against a real `kvgate serve`'s `/health` and `/ready`.

mod support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A listener that answers every connection with `response` after reading the request.
fn canned(response: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = stream.write_all(response.as_bytes());
        }
    });
    format!("http://{addr}")
}

fn probe(url: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["probe", url, "--timeout-secs", "5"])
        .env("KVGATE_LOG", "off")
        .output()
        .expect("kvgate runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_2xx_exits_0_and_anything_else_exits_1_with_the_status() {
    let ok = canned("HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nready");
    let out = probe(&format!("{ok}/ready"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("200 OK"));

    let down = canned(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 18\r\nconnection: close\r\n\r\n\
         no healthy endpoint",
    );
    let out = probe(&format!("{down}/ready"));
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("503 Service Unavailable") && err.contains("no healthy endpoint"),
        "{err}"
    );
}

#[test]
fn a_port_nobody_listens_on_exits_1_saying_so() {
    // Free a moment ago and below the ephemeral range: nothing listens there now.
    let addr = format!("127.0.0.1:{}", support::free_port());
    let out = probe(&format!("http://{addr}/health"));
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("cannot connect to {addr}")) && err.contains("refused"),
        "{err}"
    );
    let out = probe("https://127.0.0.1:1/health");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("only http://"), "{}", stderr(&out));
}

#[test]
fn the_gateways_health_and_ready_pass() {
    let gateway = support::spawn(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--embedded-time-scale",
            "0",
        ],
        "kvgate serve listening on",
    );
    let out = probe(&format!("{}/health", gateway.url));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Ready once the first scrape of the embedded engines found them healthy.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = probe(&format!("{}/ready", gateway.url));
        if out.status.code() == Some(0) {
            break;
        }
        assert!(Instant::now() < deadline, "never ready: {}", stderr(&out));
        std::thread::sleep(Duration::from_millis(50));
    }
}
