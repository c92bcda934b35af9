//! The semantic cache (`semantic_cache:`, off by default): complete answers kept per tenant and
//! served again to the same request, or to one whose last user message means the same.
//!
//! A lookup runs after the request is identified and parsed and before admission, so a hit
//! takes no queue slot and makes no upstream call, and a miss is admitted like any request:
//! a cache whose hit ratio collapses (a flush, an embedder outage) hands the pool no more than
//! the admission cap lets through. The key is the request's scope (tenant or key), the
//! fingerprint of everything but its last user message ([`key`]) and that message; the store
//! and the guards against false hits are `kvgate_core::semcache`'s.
//!
//! 1. exact: the same scope, fingerprint and message;
//! 2. singleflight: an identical request already on its way is waited for ([`flights`]);
//! 3. semantic: the message is embedded within `embed_deadline_ms` ([`embed`]) and the most
//!    similar stored message of the same scope and fingerprint above `threshold` that passes
//!    the guards is a hit; a failed or late embedding is a miss;
//! 4. a miss goes upstream and its answer, recorded as the client is sent it, is stored once
//!    it is complete ([`answer`]) and published to the other replicas.
//!
//! Clients steer it with `cache-control` or `x-kvgate-cache-control`: `no-cache` (do not
//! answer from the cache), `no-store` (do not store the answer); both mean bypass.

mod answer;
mod config;
mod embed;
mod flights;
mod key;
mod metrics;
mod record;
pub(crate) mod static_model;

pub use config::{CacheScope, EmbedderConfig, SemanticCacheConfig};
pub use static_model::{LoadError, StaticModel};

pub(crate) use answer::Answer;
pub(crate) use embed::normalised;
pub(crate) use metrics::SemCacheMetrics;
pub(crate) use record::Recording;

use crate::clock::Clock;
use crate::parse::Api;
use crate::upstream::HttpClient;
use axum::http::HeaderMap;
use embed::Embedder;
use flights::{Flight, Flights, Joined};
use kvgate_core::semcache::{Fingerprint, Key, Store};
use kvgate_core::Nanos;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The response header saying how the cache served a request: `hit`, `miss` or `bypass`.
pub const CACHE_HEADER: &str = "x-kvgate-cache";
/// On a semantic hit, the similarity of the stored message to the asked one.
pub const SIMILARITY_HEADER: &str = "x-kvgate-cache-similarity";
/// A request header with `cache-control`'s `no-cache` and `no-store`, for clients whose
/// `cache-control` a proxy rewrites.
pub const CONTROL_HEADER: &str = "x-kvgate-cache-control";

/// An entry as the replicas share it: the key, the embedding and the answer, with how long it
/// has left to live.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct SharedEntry {
    pub(crate) scope: String,
    /// The fingerprint, 64 hex digits.
    pub(crate) fingerprint: String,
    pub(crate) message: String,
    #[serde(default)]
    pub(crate) embedding: Option<Vec<f32>>,
    pub(crate) sse: bool,
    /// The answer's bytes (UTF-8: JSON or an event stream).
    pub(crate) body: String,
    pub(crate) ttl_left_ms: u64,
}

/// Where stored entries go to reach the other replicas: the cluster's link implements it, so
/// the cache knows nothing of how replicas talk. It must not block.
pub(crate) trait Publisher: std::fmt::Debug + Send + Sync {
    /// Queues `entry` for the peers.
    fn publish(&self, entry: SharedEntry);
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct SemCache {
    config: SemanticCacheConfig,
    store: Mutex<Store<Arc<Answer>>>,
    flights: Arc<Flights>,
    embedder: Option<Embedder>,
    metrics: Arc<SemCacheMetrics>,
    clock: Clock,
    publisher: OnceLock<Arc<dyn Publisher>>,
}

/// What the client asked of the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Controls {
    /// Do not answer from the cache.
    pub(crate) no_cache: bool,
    /// Do not store the answer.
    pub(crate) no_store: bool,
}

impl Controls {
    /// `no-cache` and `no-store` in `cache-control` or [`CONTROL_HEADER`]; `bypass` in the
    /// latter means both.
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        let mut c = Controls::default();
        for value in headers
            .get_all(axum::http::header::CACHE_CONTROL)
            .iter()
            .chain(headers.get_all(CONTROL_HEADER).iter())
        {
            for token in value.to_str().unwrap_or_default().split(',') {
                match token.trim().to_ascii_lowercase().as_str() {
                    "no-cache" => c.no_cache = true,
                    "no-store" => c.no_store = true,
                    "bypass" => (c.no_cache, c.no_store) = (true, true),
                    _ => {}
                }
            }
        }
        c
    }
}

/// The scope of a tenant's entries (`scope: tenant`).
pub(crate) fn tenant_scope(tenant: &str) -> String {
    format!("tenant:{tenant}")
}

/// The scope of one gateway key's entries (`scope: key`).
pub(crate) fn key_scope(key: &str) -> String {
    format!("key:{key}")
}

/// What a lookup found.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// Served from the cache; `similarity` on a semantic hit.
    Hit {
        answer: Arc<Answer>,
        similarity: Option<f32>,
    },
    /// Go upstream; the [`Miss`] records and stores the answer.
    Miss(Miss),
    /// The cache does not take part, for this reason.
    Bypass(&'static str),
}

/// A miss on its way upstream: what storing its answer needs, and its flight (identical
/// requests wait until it drops).
#[derive(Debug)]
pub(crate) struct Miss {
    cache: Arc<SemCache>,
    key: Key,
    embedding: Option<Vec<f32>>,
    store: bool,
    _flight: Option<Flight>,
}

impl SemCache {
    /// The cache `config` describes, embedding with `client` when its embedder is remote.
    pub(crate) fn new(
        config: &SemanticCacheConfig,
        client: HttpClient,
        metrics: Arc<SemCacheMetrics>,
        clock: Clock,
    ) -> Result<Self, crate::error::ConfigError> {
        let embedder = match (&config.embedder, config.enabled) {
            (Some(e), true) => Some(Embedder::new(e, client)?),
            _ => None,
        };
        Ok(SemCache {
            store: Mutex::new(Store::new(config.limits())),
            config: config.clone(),
            flights: Arc::default(),
            embedder,
            metrics,
            clock,
            publisher: OnceLock::new(),
        })
    }

    /// Whether lookups run at all.
    pub(crate) fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// From now on, stored entries also go to `publisher`.
    pub(crate) fn join_cluster(&self, publisher: Arc<dyn Publisher>) {
        if self.config.share {
            let _ = self.publisher.set(publisher);
        }
    }

    fn store(&self) -> MutexGuard<'_, Store<Arc<Answer>>> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks `body` (of `api`, `stripped_usage` as parsed) up in `scope`, as `controls` allow.
    pub(crate) async fn lookup(
        self: &Arc<Self>,
        (api, body, stripped_usage): (Api, &[u8], bool),
        scope: String,
        controls: Controls,
    ) -> Lookup {
        let found = self.find(api, body, stripped_usage, scope, controls).await;
        let result = match &found {
            Lookup::Hit {
                similarity: None, ..
            } => "hit_exact",
            Lookup::Hit { .. } => "hit_semantic",
            Lookup::Miss(_) => "miss",
            Lookup::Bypass(reason) => {
                SemCacheMetrics::count(&self.metrics.bypasses, reason);
                "bypass"
            }
        };
        self.metrics
            .lookups
            .get_or_create(&metrics::LookupLabel { result })
            .inc();
        found
    }

    async fn find(
        self: &Arc<Self>,
        api: Api,
        body: &[u8],
        stripped_usage: bool,
        scope: String,
        controls: Controls,
    ) -> Lookup {
        let Some(k) = key::of(api, body, stripped_usage) else {
            return Lookup::Bypass("unparsed");
        };
        if k.temperature > self.config.max_temperature {
            return Lookup::Bypass("temperature");
        }
        if controls.no_cache && controls.no_store {
            return Lookup::Bypass("client");
        }
        let key = Key {
            scope,
            fingerprint: k.fingerprint,
            message: k.message,
        };
        let read = !controls.no_cache;
        if read {
            if let Some(answer) = self.exact(&key) {
                return Lookup::Hit {
                    answer,
                    similarity: None,
                };
            }
        }
        let mut flight = None;
        if read && !controls.no_store && self.config.singleflight_wait_ms > 0 {
            match self.fly(&key).await {
                Ok(f) => flight = f,
                Err(answer) => {
                    return Lookup::Hit {
                        answer,
                        similarity: None,
                    }
                }
            }
        }
        let embedding = self.embed(&key.message).await;
        if let (true, Some(e)) = (read, &embedding) {
            if let Some(hit) = self.similar(&key, e) {
                return hit;
            }
        }
        Lookup::Miss(Miss {
            cache: self.clone(),
            key,
            embedding,
            store: !controls.no_store,
            _flight: flight,
        })
    }

    /// Leads `key`'s flight (`Ok(Some)`), or follows the one under way and returns its
    /// answer (`Err`) or nothing (`Ok(None)`: the leader stored none, or the wait ran out).
    async fn fly(&self, key: &Key) -> Result<Option<Flight>, Arc<Answer>> {
        match self.flights.join(key) {
            // A leader's answer may have been stored between the first look and the flight.
            Joined::Leader(flight) => match self.exact(key) {
                Some(answer) => Err(answer),
                None => Ok(Some(flight)),
            },
            Joined::Follower(rx) => {
                let wait = Duration::from_millis(self.config.singleflight_wait_ms);
                let ended = flights::follow(rx, wait).await;
                let answer = self.exact(key);
                let result = match (&answer, ended) {
                    (Some(_), _) => "answered",
                    (None, true) => "missed",
                    (None, false) => "timed_out",
                };
                SemCacheMetrics::count(&self.metrics.singleflight, result);
                answer.map_or(Ok(None), Err)
            }
        }
    }

    /// The semantic hit for `key`'s message embedded as `embedding`, if there is one.
    fn similar(&self, key: &Key, embedding: &[f32]) -> Option<Lookup> {
        let now = self.clock.now();
        let search = {
            let mut store = self.store();
            let search = store.similar(key, embedding, now);
            self.held(&store);
            search
        };
        for guard in &search.stopped {
            SemCacheMetrics::count(&self.metrics.guard_stops, guard.name());
        }
        search.hit.map(|hit| Lookup::Hit {
            answer: hit.answer,
            similarity: Some(hit.similarity),
        })
    }

    fn exact(&self, key: &Key) -> Option<Arc<Answer>> {
        let now = self.clock.now();
        let mut store = self.store();
        let answer = store.exact(key, now);
        self.held(&store);
        answer
    }

    /// Drops the entries of `scope` (every scope when `None`) on this replica; returns how many.
    pub(crate) fn flush(&self, scope: Option<&str>) -> usize {
        let mut store = self.store();
        let n = store.clear(scope);
        self.held(&store);
        n
    }

    /// Publishes what the store holds (lookups drop expired entries too).
    fn held(&self, store: &Store<Arc<Answer>>) {
        self.metrics.entries.set(store.len() as i64);
        self.metrics.bytes.set(store.bytes() as i64);
    }

    /// `message`'s embedding, or `None` without an embedder, for an empty message, or when
    /// embedding failed (counted).
    async fn embed(&self, message: &str) -> Option<Vec<f32>> {
        let embedder = self.embedder.as_ref().filter(|_| !message.is_empty())?;
        let started = Instant::now();
        let deadline = Duration::from_millis(self.config.embed_deadline_ms);
        match embedder.embed(message, deadline).await {
            Ok(v) => {
                if let Some(h) = &self.metrics.embed_seconds {
                    h.observe(started.elapsed().as_secs_f64());
                }
                Some(v)
            }
            Err(e) => {
                tracing::debug!(error = %e, "embedding failed; the request goes upstream");
                SemCacheMetrics::count(&self.metrics.embed_failures, e.label());
                None
            }
        }
    }

    /// Stores `answer` under `key` until `expires` (the time to live at most), counting what
    /// it evicted.
    fn insert(
        &self,
        key: Key,
        embedding: Option<Vec<f32>>,
        answer: Answer,
        expires: Option<Nanos>,
    ) {
        let now = self.clock.now();
        let bytes = answer.body.len();
        let mut store = self.store();
        let evicted = store.insert(key, embedding, (Arc::new(answer), bytes), now, expires);
        self.metrics.evictions.inc_by(evicted as u64);
        self.held(&store);
    }

    /// Applies a peer's entry (unless this replica does not share): the same scope rules as a
    /// local one, its remaining life capped by the local time to live.
    pub(crate) fn apply_peer(&self, entry: SharedEntry) {
        let fingerprint = parse_hex(&entry.fingerprint);
        let usable = self.config.enabled
            && self.config.share
            && entry.ttl_left_ms > 0
            && entry.body.len() <= self.config.max_entry_bytes;
        let Some(fingerprint) = fingerprint.filter(|_| usable) else {
            SemCacheMetrics::count(&self.metrics.peer_entries, "rejected");
            return;
        };
        let key = Key {
            scope: entry.scope,
            fingerprint,
            message: entry.message,
        };
        let answer = Answer {
            sse: entry.sse,
            body: entry.body.into(),
        };
        let expires = self.clock.now() + Nanos::from_millis(entry.ttl_left_ms);
        let embedding = entry.embedding.map(embed::normalised);
        self.insert(key, embedding, answer, Some(expires));
        SemCacheMetrics::count(&self.metrics.peer_entries, "applied");
    }
}

impl Miss {
    /// Whether its answer is to be recorded.
    pub(crate) fn stores(&self) -> bool {
        self.store
    }

    /// The most bytes of answer recorded.
    pub(crate) fn max_entry_bytes(&self) -> usize {
        self.cache.config.max_entry_bytes
    }

    /// The answer came whole: store it and tell the peers (the flight ends after, when the
    /// miss drops, so waiting requests find it).
    pub(crate) fn complete(self, answer: Result<Answer, answer::Unstored>) {
        let metrics = &self.cache.metrics;
        let answer = match answer {
            Ok(a) => a,
            Err(why) => {
                SemCacheMetrics::count(&metrics.stores, why.label());
                return;
            }
        };
        SemCacheMetrics::count(&metrics.stores, "stored");
        if let Some(p) = self.cache.publisher.get() {
            // NATS messages are 1 MiB at most by default; a larger entry stays local.
            let body = std::str::from_utf8(&answer.body)
                .ok()
                .filter(|b| b.len() <= 512 * 1024);
            if let Some(body) = body {
                p.publish(SharedEntry {
                    scope: self.key.scope.clone(),
                    fingerprint: hex(&self.key.fingerprint),
                    message: self.key.message.clone(),
                    embedding: self.embedding.clone(),
                    sse: answer.sse,
                    body: body.to_owned(),
                    ttl_left_ms: self.cache.config.ttl_secs.saturating_mul(1000),
                });
            }
        }
        let Miss {
            cache,
            key,
            embedding,
            ..
        } = self;
        cache.insert(key, embedding, answer, None);
    }
}

fn hex(fingerprint: &Fingerprint) -> String {
    fingerprint.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex(text: &str) -> Option<Fingerprint> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(Fingerprint(out))
}

#[cfg(test)]
mod tests;
