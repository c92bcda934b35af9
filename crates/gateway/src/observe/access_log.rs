//! The access log: one JSON line per request, written by a thread of its own.
//!
//! A request handler never blocks on the log and never makes a system call for it: it
//! serialises its line straight into a shared buffer under a mutex held for about a
//! microsecond. The writer thread swaps the buffer out every [`PERIOD`] (or at once when it
//! passes [`EAGER_BYTES`]) and writes it in one call, so a line reaches the file within about
//! 20 ms, and a busy gateway pays one `write` per period instead of a wake-up and a `write` per
//! request (nginx's `buffer=`/`flush=` do the same). Past [`MAX_PENDING_BYTES`] unwritten (a
//! stalled pipe, a full disk), lines are dropped and counted in
//! `kvgate_access_log_dropped_total` rather than slowing traffic or growing without bound.

use serde::Serialize;
use std::io::{self, Write};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the writer writes what accumulated.
const PERIOD: Duration = Duration::from_millis(20);

/// A buffer this large is written without waiting for the period.
const EAGER_BYTES: usize = 1 << 20;

/// Unwritten bytes beyond which lines are dropped (about 64,000 lines).
const MAX_PENDING_BYTES: usize = 64 << 20;

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
    /// Upstream attempts (retries, hedges and continuations included).
    pub(crate) attempts: u32,
    /// Streams continued on another endpoint after breaking (absent when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) resumes: u32,
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
    /// Time per output token after the first, `(e2e - ttft) / (output tokens - 1)` as vLLM's
    /// benchmark defines it (streams with two tokens or more).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tpot_ms: Option<f64>,
    /// Arrival to the end of the response.
    pub(crate) e2e_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prompt_tokens: Option<u32>,
    /// Prompt tokens the engine's prefix cache served, when it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cached_tokens: Option<u32>,
    /// What the gateway predicted the engine would serve from its cache (with the engine's
    /// usage, to compare).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) predicted_cached_tokens: Option<u32>,
    /// Usage times the deployment's price, dollars (when a price is configured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cost_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) output_tokens: Option<u32>,
    /// The last pick's reason label (`affinity`, `miss`, `escape`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<&'static str>,
    /// The last pick's reason with its numbers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) why: Option<String>,
    /// How the semantic cache took part: `hit_exact`, `hit_semantic`, `miss` or `bypass`
    /// (absent when it is off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cache: Option<&'static str>,
    /// For a request to a routed name: its tier and why (score, threshold, confidence,
    /// escalation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) route: Option<&'a str>,
    /// Prefill/decode disaggregation: `local`, `remote`, `fallback` or `rejected`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) disagg: Option<&'static str>,
    /// Why the prefill went where it went (`kvgate_core::disagg::Why`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) disagg_why: Option<&'static str>,
    /// The endpoint that prefilled, when a prefill endpoint did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prefill_endpoint: Option<&'a str>,
    /// The prefill leg's time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prefill_ms: Option<f64>,
    /// The prompt tokens the decision expected the prefill endpoint not to hold (what the
    /// prefix index believed of its cache), when a prefill endpoint prefilled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prefill_uncached_tokens: Option<u32>,
}

/// Where lines go; the default writes nothing.
#[derive(Debug, Default)]
pub(crate) struct AccessLog {
    pending: Option<Arc<Mutex<Vec<u8>>>>,
    /// Wakes the writer early (a full buffer) or, dropped, tells it to drain and stop.
    wake: Option<SyncSender<()>>,
    writer: Option<JoinHandle<()>>,
}

impl AccessLog {
    /// Opens `target`: `stdout`, `stderr`, `off`, or a file appended to.
    pub(crate) fn open(target: &str) -> io::Result<Self> {
        let out: Box<dyn Write + Send> = match target {
            "off" => return Ok(AccessLog::default()),
            "stdout" => Box::new(io::stdout()),
            "stderr" => Box::new(io::stderr()),
            path => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        };
        let pending = Arc::new(Mutex::new(Vec::with_capacity(64 * 1024)));
        let (wake, woken) = mpsc::sync_channel(1);
        let buffer = pending.clone();
        let writer = std::thread::Builder::new()
            .name("kvgate-access-log".into())
            .spawn(move || {
                let mut out = out;
                let mut spare = Vec::with_capacity(64 * 1024);
                loop {
                    let last = matches!(
                        woken.recv_timeout(PERIOD),
                        Err(RecvTimeoutError::Disconnected)
                    );
                    std::mem::swap(&mut *lock(&buffer), &mut spare);
                    if !spare.is_empty() {
                        // An error (a closed pipe, a full disk) loses lines, never the gateway.
                        let _ = out.write_all(&spare);
                        let _ = out.flush();
                        spare.clear();
                    }
                    if last {
                        return;
                    }
                }
            })?;
        Ok(AccessLog {
            pending: Some(pending),
            wake: Some(wake),
            writer: Some(writer),
        })
    }

    /// Whether lines are written at all (callers skip building them otherwise).
    pub(crate) fn enabled(&self) -> bool {
        self.pending.is_some()
    }

    /// Appends `record`'s line; returns false when it had to be dropped.
    pub(crate) fn write(&self, record: &AccessRecord<'_>) -> bool {
        let Some(pending) = &self.pending else {
            return true;
        };
        let mut buf = lock(pending);
        if buf.len() > MAX_PENDING_BYTES {
            return false;
        }
        let before = buf.len();
        if serde_json::to_writer(&mut *buf, record).is_err() {
            buf.truncate(before);
            return false;
        }
        buf.push(b'\n');
        let eager = buf.len() > EAGER_BYTES;
        drop(buf);
        if eager {
            if let Some(w) = &self.wake {
                let _ = w.try_send(());
            }
        }
        true
    }
}

fn lock(buffer: &Mutex<Vec<u8>>) -> std::sync::MutexGuard<'_, Vec<u8>> {
    buffer.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for AccessLog {
    /// Lets the writer write what is pending, so no line of a finished request is lost when the
    /// gateway stops.
    fn drop(&mut self) {
        self.wake = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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
            resumes: 0,
            outcome: "ok",
            status: Some(200),
            queue_ms: Some(0.01),
            ttft_ms: None,
            tpot_ms: None,
            e2e_ms: 3.5,
            prompt_tokens: Some(10),
            cached_tokens: None,
            predicted_cached_tokens: None,
            cost_usd: None,
            output_tokens: Some(2),
            reason: Some("miss"),
            why: Some("low match (0/40), least loaded".into()),
            cache: None,
            route: None,
            disagg: None,
            disagg_why: None,
            prefill_endpoint: None,
            prefill_ms: None,
            prefill_uncached_tokens: None,
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
