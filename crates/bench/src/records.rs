//! Per-request records as JSON lines (`--records FILE`): the raw measurements behind the
//! summaries, so a run can be re-analysed (inter-send gaps, per-request TPOT against its ITLs,
//! cold against cached TTFT) without trusting the percentiles.
//!
//! One line per request and target, in report order (rate, then target, then scheduled time):
//! `{"target", "offered_rate", "scheduled_s", "sent_s", "lag_ms", "ttft_ms", "tpot_ms", "e2e_ms",
//! "itl_ms", "output_tokens", "prompt_tokens", "cached_tokens", "error", "session", "endpoint"}`.
//! `tpot_ms` is (E2E - TTFT) / (output tokens - 1) (vLLM's benchmark definition), `null` when
//! undefined; `cached_tokens` is `null` when the server did not report it; `error` is the error
//! kind's JSON key or `null`; `session` is the request's session (the body's `user`: the agentic
//! and tenants workloads) and `endpoint` the one a kvgate gateway named in `x-kvgate-endpoint`,
//! each `null` when there is none. With both, a run through the gateway can be cut by session and
//! endpoint (say, the first turn of each session whose last turn went to an engine that was then
//! killed).

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::client::{ErrorKind, Record};
use crate::error::BenchError;

/// One JSON line.
#[derive(Debug, Serialize)]
struct Line<'a> {
    target: &'a str,
    offered_rate: Option<f64>,
    scheduled_s: f64,
    sent_s: f64,
    lag_ms: f64,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    e2e_ms: f64,
    itl_ms: &'a [f32],
    output_tokens: u64,
    prompt_tokens: u64,
    cached_tokens: Option<u64>,
    error: Option<&'static str>,
    session: Option<&'a str>,
    endpoint: Option<&'a str>,
}

/// One JSON line read back (`tpot_ms` is derived, so it is not read).
#[derive(Debug, Deserialize)]
struct OwnedLine {
    target: String,
    offered_rate: Option<f64>,
    scheduled_s: f64,
    sent_s: f64,
    lag_ms: f64,
    ttft_ms: Option<f64>,
    e2e_ms: f64,
    #[serde(default)]
    itl_ms: Vec<f32>,
    output_tokens: u64,
    prompt_tokens: u64,
    cached_tokens: Option<u64>,
    error: Option<String>,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    endpoint: Option<String>,
}

/// One record read back with its target and offered rate.
pub type Labelled = (String, Option<f64>, Record);

/// Reads a records file back (blank lines skipped).
pub fn read(path: &Path) -> Result<Vec<Labelled>, BenchError> {
    let io = |source| BenchError::Io {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: String| BenchError::Config(format!("{}:{}: {why}", path.display(), i + 1));
        let l: OwnedLine = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
        let error = match l.error.as_deref() {
            None => None,
            Some(name) => Some(
                ErrorKind::ALL
                    .into_iter()
                    .find(|k| k.name() == name)
                    .ok_or_else(|| bad(format!("unknown error kind {name:?}")))?,
            ),
        };
        let record = Record {
            scheduled_s: l.scheduled_s,
            sent_s: l.sent_s,
            lag_ms: l.lag_ms,
            ttft_ms: l.ttft_ms,
            e2e_ms: l.e2e_ms,
            itl_ms: l.itl_ms,
            output_tokens: l.output_tokens,
            prompt_tokens: l.prompt_tokens,
            cached_tokens: l.cached_tokens,
            error,
            session: l.session,
            endpoint: l.endpoint,
        };
        out.push((l.target, l.offered_rate, record));
    }
    Ok(out)
}

/// Writes records to a JSON-lines file as each rate finishes.
#[derive(Debug)]
pub struct RecordsFile {
    path: PathBuf,
    out: BufWriter<File>,
}

impl RecordsFile {
    /// Creates (truncates) `path`.
    pub fn create(path: &Path) -> Result<Self, BenchError> {
        let file = File::create(path).map_err(|source| BenchError::Io {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            path: path.to_owned(),
            out: BufWriter::new(file),
        })
    }

    /// Appends the records of one target at one offered rate.
    pub fn write(
        &mut self,
        target: &str,
        offered_rate: Option<f64>,
        records: &[Record],
    ) -> Result<(), BenchError> {
        for r in records {
            let line = Line {
                target,
                offered_rate,
                scheduled_s: r.scheduled_s,
                sent_s: r.sent_s,
                lag_ms: r.lag_ms,
                ttft_ms: r.ttft_ms,
                tpot_ms: r.tpot_ms(),
                e2e_ms: r.e2e_ms,
                itl_ms: &r.itl_ms,
                output_tokens: r.output_tokens,
                prompt_tokens: r.prompt_tokens,
                cached_tokens: r.cached_tokens,
                error: r.error.map(|e| e.name()),
                session: r.session.as_deref(),
                endpoint: r.endpoint.as_deref(),
            };
            serde_json::to_writer(&mut self.out, &line).map_err(BenchError::Json)?;
            self.out.write_all(b"\n").map_err(|e| self.io(e))?;
        }
        Ok(())
    }

    /// Flushes the file.
    pub fn finish(mut self) -> Result<(), BenchError> {
        self.out.flush().map_err(|e| self.io(e))
    }

    fn io(&self, source: std::io::Error) -> BenchError {
        BenchError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_json_line_per_record() {
        let dir = std::env::temp_dir().join(format!("kvgate-records-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.jsonl");
        let ok = Record {
            scheduled_s: 0.5,
            sent_s: 0.501,
            lag_ms: 1.0,
            ttft_ms: Some(10.0),
            e2e_ms: 40.0,
            itl_ms: vec![15.0, 15.0],
            output_tokens: 3,
            prompt_tokens: 100,
            cached_tokens: Some(64),
            error: None,
            session: Some("s7".into()),
            endpoint: Some("engine-1".into()),
        };
        let failed = Record {
            error: Some(ErrorKind::Timeout),
            ..Record::default()
        };
        let mut file = RecordsFile::create(&path).unwrap();
        file.write("http://a", Some(5.0), &[ok, failed]).unwrap();
        file.finish().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let back = read(&path).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!((back[0].0.as_str(), back[0].1), ("http://a", Some(5.0)));
        assert_eq!(back[0].2.tpot_ms(), Some(15.0));
        assert_eq!(back[0].2.cached_tokens, Some(64));
        assert_eq!(back[1].2.error, Some(ErrorKind::Timeout));
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["target"], "http://a");
        assert_eq!(lines[0]["offered_rate"], 5.0);
        assert_eq!(lines[0]["tpot_ms"], 15.0);
        assert_eq!(lines[0]["cached_tokens"], 64);
        assert_eq!(lines[0]["itl_ms"].as_array().unwrap().len(), 2);
        assert!(lines[0]["error"].is_null());
        assert_eq!(lines[0]["session"], "s7");
        assert_eq!(lines[0]["endpoint"], "engine-1");
        assert!(lines[1]["session"].is_null() && lines[1]["endpoint"].is_null());
        assert_eq!(lines[1]["error"], "timeout");
        assert!(lines[1]["tpot_ms"].is_null());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
