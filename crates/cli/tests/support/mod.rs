//! Real `kvgate engine` and `kvgate serve` processes on free loopback ports, and small HTTP/SSE
//! helpers. Readiness is the line each process prints once it listens, read with a deadline.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running `kvgate` process, killed on drop.
pub struct Proc {
    pub child: Child,
    pub url: String,
    /// The readiness line.
    pub line: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "process did not exit in {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts `kvgate ARGS` and waits (30 s at most) for the stdout line containing `marker`, whose
/// `http://...` (or `https://...`) word is the process's URL.
pub fn spawn(args: &[&str], marker: &str) -> Proc {
    spawn_with(args, marker, None)
}

fn spawn_with(args: &[&str], marker: &str, log: Option<Log>) -> Proc {
    let stderr = if log.is_some() {
        Stdio::piped()
    } else {
        Stdio::inherit()
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start kvgate");
    if let Some(log) = log {
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                eprintln!("{line}");
                log.0.lock().unwrap().push(line);
            }
        });
    }
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let marker = marker.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if line.contains(&marker) {
                let url = line
                    .split_whitespace()
                    .find(|w| w.starts_with("http://") || w.starts_with("https://"))
                    .map(str::to_string);
                let _ = tx.send(url.map(|u| (u, line)));
            }
        }
    });
    let (url, line) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("process did not report its address in time")
        .expect("no URL in the readiness line");
    Proc { child, url, line }
}

/// What a process wrote to stderr so far, line by line (its logs).
#[derive(Clone, Default)]
pub struct Log(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Log {
    /// Waits (20 s at most) for a line containing every one of `needles`, and returns it.
    pub fn wait_for(&self, needles: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let lines = self.0.lock().unwrap();
            if let Some(line) = lines.iter().find(|l| needles.iter().all(|n| l.contains(n))) {
                return line.clone();
            }
            drop(lines);
            assert!(
                Instant::now() < deadline,
                "no log line with {needles:?} in time"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The lines containing `needle` so far.
    pub fn count(&self, needle: &str) -> usize {
        let lines = self.0.lock().unwrap();
        lines.iter().filter(|l| l.contains(needle)).count()
    }
}

/// [`spawn`], keeping what the process writes to stderr (also echoed to the test's stderr).
pub fn spawn_logged(args: &[&str], marker: &str) -> (Proc, Log) {
    let log = Log::default();
    let proc = spawn_with(args, marker, Some(log.clone()));
    (proc, log)
}

/// `kvgate engine` with a name, time scale and extra flags.
pub fn engine(id: &str, time_scale: &str, extra: &[&str]) -> Proc {
    engine_at("127.0.0.1:0", id, time_scale, extra)
}

/// `kvgate engine` listening on `listen` (say, the address of one that was stopped).
pub fn engine_at(listen: &str, id: &str, time_scale: &str, extra: &[&str]) -> Proc {
    let mut args = vec![
        "engine",
        "--listen",
        listen,
        "--id",
        id,
        "--model",
        "test-model",
        "--time-scale",
        time_scale,
        "--seed",
        "7",
    ];
    args.extend_from_slice(extra);
    spawn(&args, "listening on")
}

/// Writes `yaml` to a fresh `serve.yaml` for the test called `name`, and returns its path.
pub fn config_file(name: &str, yaml: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgate-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("serve.yaml");
    std::fs::write(&config, yaml).unwrap();
    config
}

/// `kvgate serve --config` with `yaml` (written for the test called `name`), which must refuse
/// to start: its error output.
pub fn serve_refuses(name: &str, yaml: &str) -> String {
    let path = config_file(name, yaml);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{yaml} was accepted");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `kvgate serve` in front of `engines` with the configuration `yaml` (written for the test
/// called `name`); waits until `/ready`.
pub async fn gateway_with_config(engines: &[&Proc], name: &str, yaml: &str) -> Proc {
    let config = config_file(name, yaml);
    gateway(engines, &["--config", config.to_str().unwrap()]).await
}

/// `kvgate serve` in front of `engines` with extra flags; waits until `/ready`.
pub async fn gateway(engines: &[&Proc], extra: &[&str]) -> Proc {
    let mut args = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--scrape-interval-ms",
        "100",
    ];
    for e in engines {
        args.push("--endpoint");
        args.push(&e.url);
    }
    args.extend_from_slice(extra);
    let proc = spawn(&args, "kvgate serve listening on");
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = client.get(format!("{}/ready", proc.url)).send().await {
            if r.status() == 200 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "gateway never became ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proc
}

/// The body of `GET {base}{path}` as text (for example `/metrics`).
pub async fn get_text(http: &reqwest::Client, base: &str, path: &str) -> String {
    http.get(format!("{base}{path}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

pub fn chat(messages: serde_json::Value, max_tokens: u32, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": "test-model",
        "messages": messages,
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": stream,
    })
}

/// A two-token completion of `model` through `gateway` (question `n`, so prompts differ).
pub async fn complete(gateway: &str, model: &str, n: u32) -> reqwest::Response {
    client()
        .post(format!("{gateway}/v1/completions"))
        .json(&serde_json::json!({
            "model": model,
            "prompt": format!("question {n} for {model}"),
            "max_tokens": 2,
            "ignore_eos": true,
        }))
        .send()
        .await
        .unwrap()
}

pub fn user(text: &str) -> serde_json::Value {
    serde_json::json!([{"role": "user", "content": text}])
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .filter_map(|e| e.strip_prefix("data: ").map(str::to_string))
        .collect()
}

/// A sample's value in a Prometheus text exposition (first line starting with `prefix`).
pub fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Polls `url` until `check(body)` holds, failing after 15 s.
pub async fn wait_for(url: &str, what: &str, check: impl Fn(&str) -> bool) {
    let client = client();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(r) = client.get(url).send().await {
            if check(&r.text().await.unwrap_or_default()) {
                return;
            }
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET {base}{path}` with the admin `token`, as JSON.
pub async fn admin_json(base: &str, path: &str, token: &str) -> serde_json::Value {
    client()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A response header's value as text.
pub fn header(response: &reqwest::Response, name: &str) -> String {
    response.headers()[name].to_str().unwrap().to_owned()
}

/// A test CA with a server certificate for 127.0.0.1 and a client certificate, as PEM.
pub struct Pki {
    pub ca: rcgen::Certificate,
    pub ca_key: rcgen::KeyPair,
}

impl Pki {
    pub fn new() -> Self {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kvgate test CA");
        let ca = params.self_signed(&ca_key).unwrap();
        Pki { ca, ca_key }
    }

    /// (certificate PEM, key PEM, certificate DER) signed by the CA.
    pub fn issue(&self, names: &[&str], client: bool) -> (String, String, Vec<u8>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        if client {
            params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        }
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().to_vec())
    }
}

/// A loopback port free a moment ago (for a process that must be restarted on the same address).
/// A loopback port free now, for a process started later to bind. Taken below the kernel's
/// ephemeral range (32768-60999 on Linux): a port the kernel hands out for `:0` could, once
/// released, become the local end of some process's outgoing connection before the intended
/// process binds it (seen in CI: an engine's KV-event connection held the gateway's port).
/// Each test binary starts at its own offset and walks on, so concurrent tests do not collide.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7_919);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < SPAN, "no free loopback port below the ephemeral range");
        let port = (LOW + start.wrapping_add(n) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A key's SHA-256 in hex, as `tenancy.keys[].key_sha256` holds it.
pub fn sha256(key: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}
