//! The access log: one JSON line per request, written by a thread of its own.
//!
//! A request handler never blocks on the log: it serialises its line and hands it over a
//! bounded channel; the writer thread writes whatever is queued through one buffer and flushes
//! whenever the queue runs dry, so a line reaches the file within one write of the request's
//! end and a burst costs one system call per buffer, not per line (nginx's `buffer=` does the
//! same). When the writer falls behind by [`QUEUE`] lines (a stalled pipe), lines are dropped
//! and counted in `kvgate_access_log_dropped_total` rather than slowing traffic.

use serde::Serialize;
use std::io::{self, Write};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;

/// Lines queued for the writer at most (about 64 MiB at 1 KiB a line).
const QUEUE: usize = 65_536;

/// One request as the access log records it. Durations are milliseconds; a field the request
/// never reached (no TTFT for a request refused in admission) is absent, not zero.
#[derive(Debug, Serialize)]
pub(crate) struct AccessRecord<'a> {
    /// End of the request, RFC 3339.
    pub(crate) ts: String,
    /// The gateway's id (the `x-kvgate-request-id` response header).
    pub(crate) request_id: u64,
    /// The client's own `x-request-id`, if it sent one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) client_request_id: Option<&'a str>,
    /// `chat` or `completions`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) api: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tenant: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) session: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) model: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stream: Option<bool>,
    /// The endpoint that answered, or the last one tried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) endpoint: Option<&'a str>,
    /// Upstream attempts (retries and hedges included).
    pub(crate) attempts: u32,
    /// `ok`, `upstream_error`, `client_error`, `queue_full`, `deadline`, `cancelled`, ...
    pub(crate) outcome: &'static str,
    /// The status sent to the client.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<u16>,
    /// Time waiting for admission.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) queue_ms: Option<f64>,
    /// Arrival to the first token the client received (streams only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ttft_ms: Option<f64>,
    /// Time per output token after the first (DOMAIN.md §2; streams with two tokens or more).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tpot_ms: Option<f64>,
    /// Arrival to the end of the response.
    pub(crate) e2e_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prompt_tokens: Option<u32>,
    /// Prompt tokens the engine's prefix cache served, when it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cached_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) output_tokens: Option<u32>,
    /// The last pick's reason label (`affinity`, `miss`, `escape`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<&'static str>,
    /// The last pick's reason with its numbers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) why: Option<&'a str>,
}

/// Where lines go.
#[derive(Debug)]
pub(crate) struct AccessLog {
    tx: Option<SyncSender<Vec<u8>>>,
    writer: Option<JoinHandle<()>>,
}

impl AccessLog {
    /// A log that writes nothing.
    pub(crate) fn off() -> Self {
        AccessLog {
            tx: None,
            writer: None,
        }
    }

    /// Opens `target`: `stdout`, `stderr`, `off`, or a file appended to.
    pub(crate) fn open(target: &str) -> io::Result<Self> {
        let out: Box<dyn Write + Send> = match target {
            "off" => return Ok(AccessLog::off()),
            "stdout" => Box::new(io::stdout()),
            "stderr" => Box::new(io::stderr()),
            path => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        };
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let writer = std::thread::Builder::new()
            .name("kvgate-access-log".into())
            .spawn(move || write_lines(&rx, out))?;
        Ok(AccessLog {
            tx: Some(tx),
            writer: Some(writer),
        })
    }

    /// Whether lines are written at all (callers skip building them otherwise).
    pub(crate) fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues `record`; returns false when the line had to be dropped.
    pub(crate) fn write(&self, record: &AccessRecord<'_>) -> bool {
        let Some(tx) = &self.tx else {
            return true;
        };
        let mut line = Vec::with_capacity(512);
        if serde_json::to_writer(&mut line, record).is_err() {
            return false;
        }
        line.push(b'\n');
        match tx.try_send(line) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }
}

impl Drop for AccessLog {
    /// Lets the writer drain what is queued, so no line of a finished request is lost when the
    /// gateway stops.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

fn write_lines(rx: &Receiver<Vec<u8>>, out: Box<dyn Write + Send>) {
    let mut out = io::BufWriter::with_capacity(64 * 1024, out);
    // An error (a closed pipe, a full disk) loses lines, never the gateway.
    while let Ok(line) = rx.recv() {
        let _ = out.write_all(&line);
        while let Ok(line) = rx.try_recv() {
            let _ = out.write_all(&line);
        }
        let _ = out.flush();
    }
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64) -> AccessRecord<'static> {
        AccessRecord {
            ts: "2026-12-01T00:00:00.000Z".into(),
            request_id: id,
            client_request_id: None,
            api: Some("chat"),
            tenant: None,
            session: Some("s\"1"),
            model: Some("m"),
            stream: Some(true),
            endpoint: Some("e0"),
            attempts: 1,
            outcome: "ok",
            status: Some(200),
            queue_ms: Some(0.01),
            ttft_ms: None,
            tpot_ms: None,
            e2e_ms: 3.5,
            prompt_tokens: Some(10),
            cached_tokens: None,
            output_tokens: Some(2),
            reason: Some("miss"),
            why: Some("low match (0/40), least loaded"),
        }
    }

    #[test]
    fn one_json_line_per_record_and_absent_fields_are_absent() {
        let path = std::env::temp_dir().join(format!("kvgate-access-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let log = AccessLog::open(path.to_str().unwrap()).unwrap();
        assert!(log.enabled());
        for id in 0..1000 {
            assert!(log.write(&record(id)));
        }
        drop(log); // drains
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 1000);
        assert_eq!(lines[999]["request_id"], 999);
        assert_eq!(lines[0]["session"], "s\"1");
        assert!(lines[0].get("ttft_ms").is_none() && lines[0].get("tenant").is_none());
        assert_eq!(lines[0]["e2e_ms"], 3.5);
    }

    #[test]
    fn off_writes_nothing() {
        let log = AccessLog::open("off").unwrap();
        assert!(!log.enabled());
        assert!(log.write(&record(1)));
    }
}
