//! Fault injection: the failures a router meets in production, on demand.
//!
//! A fault is written `KIND[:key=value[,key=value]...]`; every kind accepts `p=P` (the probability
//! that a request meets it, default 1). Kinds (overload looks like 429 with Retry-After or silent
//! slowness; the time to first token is the window in which a router can still retry):
//!
//! | kind | keys | effect |
//! |---|---|---|
//! | `429` | `retry_after=S` (1) | HTTP 429 with `Retry-After: S` and an OpenAI-style body |
//! | `500` | | HTTP 500 |
//! | `503` | | HTTP 503 |
//! | `reset` | | the TCP connection is reset before any response byte |
//! | `stall_first` | `ms=N` (forever) | response headers sent, no token for N ms |
//! | `stall_mid` | `after=K` (1), `ms=N` (forever) | the stream pauses after K tokens |
//! | `disconnect_mid` | `after=K` (1) | the connection is reset after K streamed tokens |
//! | `slow_decode` | `factor=F` (4) | every engine iteration that decodes takes F times longer |
//! | `drain` | | new requests get 503 and `/health` reports 503; running ones finish |
//! | `kv_drop` | | each KV-event batch is lost with probability `p` (its sequence number is used, so subscribers see the gap) |
//! | `stall_embed` | `ms=N` (forever) | `/v1/embeddings` answers after N ms |
//! | `low_confidence` | | the answer's token logprobs (when asked for) are those of a model unsure of every token, so a cascade in front escalates it |
//!
//! `slow_decode` and `drain` act on the whole engine (`p` is ignored), `kv_drop` on KV-event
//! batches; the others are drawn per
//! request from a seeded random source, in the order listed by the operator, and the first
//! error-response fault drawn wins. Non-streamed requests meet the stream faults too: stalls
//! delay the response, `disconnect_mid` resets once K tokens were generated.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

/// One kind of failure. See the module documentation for the spec syntax.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FaultKind {
    /// HTTP 429 with a `Retry-After` of this many seconds.
    RateLimited {
        /// Seconds announced in `Retry-After`.
        retry_after_secs: u64,
    },
    /// HTTP 500.
    InternalError,
    /// HTTP 503.
    Unavailable,
    /// TCP reset before the first response byte.
    ResetBeforeFirstByte,
    /// Headers sent, then no token for a while (`None`: until the client gives up).
    StallBeforeFirstToken {
        /// How long.
        stall: Option<Duration>,
    },
    /// The stream pauses after some tokens.
    StallMidStream {
        /// Tokens streamed before the pause.
        after_tokens: u32,
        /// How long (`None`: until the client gives up).
        stall: Option<Duration>,
    },
    /// The connection is reset after some streamed tokens.
    DisconnectMidStream {
        /// Tokens streamed before the reset.
        after_tokens: u32,
    },
    /// Iterations that decode take `factor` times longer.
    SlowDecode {
        /// Slow-down factor (>= 1).
        factor: f64,
    },
    /// Refuse new requests with 503; finish running ones.
    Draining,
    /// KV-event batches are lost (drawn per batch with the fault's probability).
    DropKvEvents,
    /// `/v1/embeddings` answers late (`None`: never), drawn per embeddings request.
    StallEmbeddings {
        /// How long.
        stall: Option<Duration>,
    },
    /// Returned token logprobs are low (a degraded model, for escalation storms).
    LowConfidence,
    /// A decode engine's read of this prefill engine's held KV fails (drawn per read).
    KvTransferFail,
}

/// A fault and the probability that a request meets it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fault {
    /// What happens.
    pub kind: FaultKind,
    /// Probability in `[0, 1]` per request (ignored by engine-wide kinds).
    pub probability: f64,
}

/// A malformed fault spec.
#[derive(Debug, thiserror::Error)]
#[error("bad fault spec `{spec}`: {reason}")]
pub struct FaultSpecError {
    spec: String,
    reason: String,
}

/// The `key=value` settings after a fault spec's kind; `None` where not given.
#[derive(Debug)]
struct FaultParams {
    probability: f64,
    /// `retry_after`, seconds.
    secs: Option<u64>,
    ms: Option<u64>,
    after: Option<u32>,
    factor: Option<f64>,
}

impl FaultParams {
    /// Parses `params`, the comma-separated settings of `spec`, each checked for its range.
    fn parse(spec: &str, params: &str) -> Result<Self, FaultSpecError> {
        let err = |reason: &str| FaultSpecError {
            spec: spec.to_owned(),
            reason: reason.to_owned(),
        };
        let mut probability = 1.0;
        let (mut secs, mut ms, mut after, mut factor) = (None, None, None, None);
        for pair in params.split(',').filter(|p| !p.trim().is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| err("expected key=value"))?;
            let value = value.trim();
            match key.trim() {
                "p" => {
                    probability = value
                        .parse::<f64>()
                        .map_err(|_| err("p must be a number"))?;
                    if !(0.0..=1.0).contains(&probability) {
                        return Err(err("p must be in [0, 1]"));
                    }
                }
                "retry_after" => {
                    secs = Some(
                        value
                            .parse::<u64>()
                            .map_err(|_| err("retry_after must be whole seconds"))?,
                    )
                }
                "ms" => {
                    ms = Some(
                        value
                            .parse::<u64>()
                            .map_err(|_| err("ms must be whole milliseconds"))?,
                    )
                }
                "after" => {
                    let k = value
                        .parse::<u32>()
                        .ok()
                        .filter(|&k| k >= 1)
                        .ok_or_else(|| err("after must be a token count >= 1"))?;
                    after = Some(k);
                }
                "factor" => {
                    let f = value
                        .parse::<f64>()
                        .map_err(|_| err("factor must be a number"))?;
                    if !(f.is_finite() && f >= 1.0) {
                        return Err(err("factor must be >= 1"));
                    }
                    factor = Some(f);
                }
                other => return Err(err(&format!("unknown key `{other}`"))),
            }
        }
        Ok(FaultParams {
            probability,
            secs,
            ms,
            after,
            factor,
        })
    }
}

impl FromStr for Fault {
    type Err = FaultSpecError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| FaultSpecError {
            spec: spec.to_owned(),
            reason: reason.to_owned(),
        };
        let (name, params) = spec.trim().split_once(':').unwrap_or((spec.trim(), ""));
        let FaultParams {
            probability,
            secs,
            ms,
            after,
            factor,
        } = FaultParams::parse(spec, params)?;
        let stall = ms.map(Duration::from_millis);
        let kind = match name {
            "429" => FaultKind::RateLimited { retry_after_secs: secs.unwrap_or(1) },
            "500" => FaultKind::InternalError,
            "503" => FaultKind::Unavailable,
            "reset" => FaultKind::ResetBeforeFirstByte,
            "stall_first" => FaultKind::StallBeforeFirstToken { stall },
            "stall_mid" => FaultKind::StallMidStream { after_tokens: after.unwrap_or(1), stall },
            "disconnect_mid" => FaultKind::DisconnectMidStream { after_tokens: after.unwrap_or(1) },
            "slow_decode" => FaultKind::SlowDecode { factor: factor.unwrap_or(4.0) },
            "drain" => FaultKind::Draining,
            "kv_drop" => FaultKind::DropKvEvents,
            "stall_embed" => FaultKind::StallEmbeddings { stall },
            "low_confidence" => FaultKind::LowConfidence,
            "kv_fail" => FaultKind::KvTransferFail,
            _ => return Err(err("unknown kind (429, 500, 503, reset, stall_first, stall_mid, disconnect_mid, slow_decode, drain, kv_drop, kv_fail, stall_embed, low_confidence)")),
        };
        let used_keys_ok = match kind {
            FaultKind::RateLimited { .. } => ms.is_none() && after.is_none() && factor.is_none(),
            FaultKind::StallBeforeFirstToken { .. } | FaultKind::StallEmbeddings { .. } => {
                secs.is_none() && after.is_none() && factor.is_none()
            }
            FaultKind::StallMidStream { .. } => secs.is_none() && factor.is_none(),
            FaultKind::DisconnectMidStream { .. } => {
                secs.is_none() && ms.is_none() && factor.is_none()
            }
            FaultKind::SlowDecode { .. } => secs.is_none() && ms.is_none() && after.is_none(),
            _ => secs.is_none() && ms.is_none() && after.is_none() && factor.is_none(),
        };
        if !used_keys_ok {
            return Err(err("key not valid for this kind"));
        }
        Ok(Fault { kind, probability })
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut params: Vec<String> = Vec::new();
        let name = match self.kind {
            FaultKind::RateLimited { retry_after_secs } => {
                params.push(format!("retry_after={retry_after_secs}"));
                "429"
            }
            FaultKind::InternalError => "500",
            FaultKind::Unavailable => "503",
            FaultKind::ResetBeforeFirstByte => "reset",
            FaultKind::StallBeforeFirstToken { stall } => {
                params.extend(stall.map(|d| format!("ms={}", d.as_millis())));
                "stall_first"
            }
            FaultKind::StallMidStream {
                after_tokens,
                stall,
            } => {
                params.push(format!("after={after_tokens}"));
                params.extend(stall.map(|d| format!("ms={}", d.as_millis())));
                "stall_mid"
            }
            FaultKind::DisconnectMidStream { after_tokens } => {
                params.push(format!("after={after_tokens}"));
                "disconnect_mid"
            }
            FaultKind::SlowDecode { factor } => {
                params.push(format!("factor={factor}"));
                "slow_decode"
            }
            FaultKind::Draining => "drain",
            FaultKind::DropKvEvents => "kv_drop",
            FaultKind::StallEmbeddings { stall } => {
                params.extend(stall.map(|d| format!("ms={}", d.as_millis())));
                "stall_embed"
            }
            FaultKind::LowConfidence => "low_confidence",
            FaultKind::KvTransferFail => "kv_fail",
        };
        if self.probability < 1.0 {
            params.push(format!("p={}", self.probability));
        }
        if params.is_empty() {
            f.write_str(name)
        } else {
            write!(f, "{name}:{}", params.join(","))
        }
    }
}

/// What the faults decided for one request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct RequestFaults {
    /// Answer with an error (or a reset) instead of serving.
    pub(crate) refuse: Option<FaultKind>,
    /// Hold the first token back.
    pub(crate) stall_first: Option<Option<Duration>>,
    /// Pause after this many tokens.
    pub(crate) stall_mid: Option<(u32, Option<Duration>)>,
    /// Reset the connection after this many tokens.
    pub(crate) disconnect_after: Option<u32>,
    /// Return low token logprobs.
    pub(crate) low_confidence: bool,
}

/// The active faults, changeable at runtime, with their seeded random source.
#[derive(Debug)]
pub(crate) struct FaultState {
    active: RwLock<Vec<Fault>>,
    rng: Mutex<ChaCha8Rng>,
}

impl FaultState {
    pub(crate) fn new(faults: Vec<Fault>, seed: u64) -> Self {
        FaultState {
            active: RwLock::new(faults),
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
        }
    }

    /// Replaces the active faults.
    pub(crate) fn set(&self, faults: Vec<Fault>) {
        *self.active.write().unwrap_or_else(|e| e.into_inner()) = faults;
    }

    /// The active faults.
    pub(crate) fn list(&self) -> Vec<Fault> {
        self.active
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether the engine refuses new requests.
    pub(crate) fn draining(&self) -> bool {
        self.active
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|f| f.kind == FaultKind::Draining)
    }

    /// The decode slow-down factor (1 without `slow_decode`).
    pub(crate) fn decode_factor(&self) -> f64 {
        self.active
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|f| match f.kind {
                FaultKind::SlowDecode { factor } => Some(factor),
                _ => None,
            })
            .fold(1.0, f64::max)
    }

    /// Whether the next KV-event batch is lost (`kv_drop`).
    /// The stall an embeddings request meets, if one is drawn (`Some(None)`: forever).
    pub(crate) fn embed_stall(&self) -> Option<Option<Duration>> {
        let active = self.active.read().unwrap_or_else(|e| e.into_inner());
        let (p, stall) = active.iter().find_map(|f| match f.kind {
            FaultKind::StallEmbeddings { stall } => Some((f.probability, stall)),
            _ => None,
        })?;
        let drawn = p >= 1.0
            || self
                .rng
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .random::<f64>()
                < p;
        drawn.then_some(stall)
    }

    pub(crate) fn drop_kv_batch(&self) -> bool {
        self.engine_wide(FaultKind::DropKvEvents)
    }

    /// Whether the next read of held KV fails (`kv_fail`).
    pub(crate) fn fail_transfer(&self) -> bool {
        self.engine_wide(FaultKind::KvTransferFail)
    }

    /// Whether a draw of the active fault of `kind` hits (never without one).
    fn engine_wide(&self, kind: FaultKind) -> bool {
        let active = self.active.read().unwrap_or_else(|e| e.into_inner());
        let Some(p) = active
            .iter()
            .find(|f| f.kind == kind)
            .map(|f| f.probability)
        else {
            return false;
        };
        p >= 1.0
            || self
                .rng
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .random::<f64>()
                < p
    }

    /// Draws the faults one new request meets.
    pub(crate) fn draw(&self) -> RequestFaults {
        let active = self.active.read().unwrap_or_else(|e| e.into_inner());
        let mut out = RequestFaults::default();
        if active.is_empty() {
            return out;
        }
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        for fault in active.iter() {
            let hit = |rng: &mut ChaCha8Rng| {
                fault.probability >= 1.0 || rng.random::<f64>() < fault.probability
            };
            match fault.kind {
                FaultKind::Draining => out.refuse = out.refuse.or(Some(FaultKind::Draining)),
                FaultKind::SlowDecode { .. }
                | FaultKind::DropKvEvents
                | FaultKind::StallEmbeddings { .. } => {}
                FaultKind::KvTransferFail => {}
                FaultKind::RateLimited { .. }
                | FaultKind::InternalError
                | FaultKind::Unavailable
                | FaultKind::ResetBeforeFirstByte => {
                    if hit(&mut rng) && out.refuse.is_none() {
                        out.refuse = Some(fault.kind);
                    }
                }
                FaultKind::StallBeforeFirstToken { stall } => {
                    if hit(&mut rng) {
                        out.stall_first.get_or_insert(stall);
                    }
                }
                FaultKind::StallMidStream {
                    after_tokens,
                    stall,
                } => {
                    if hit(&mut rng) {
                        out.stall_mid.get_or_insert((after_tokens, stall));
                    }
                }
                FaultKind::DisconnectMidStream { after_tokens } => {
                    if hit(&mut rng) {
                        out.disconnect_after.get_or_insert(after_tokens);
                    }
                }
                FaultKind::LowConfidence => out.low_confidence |= hit(&mut rng),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
