//! One task per endpoint with `kv_events`: a ZMQ SUB socket that reads the engine's batches,
//! decodes them outside every lock, and hands them to the pool's prefix cache.
//!
//! The task ends when its endpoint leaves the pool or the gateway stops. Errors never reach a
//! request: a socket that fails is reopened after a pause, a message that does not decode is
//! counted and skipped (the next batch then shows a gap, so the endpoint stops being trusted).

use super::EngineWatch;
use crate::engine_state::{decode, EventSource, StreamLabels};
use crate::metrics;
use futures_util::{Stream, StreamExt};
use kvgate_core::index::events::{BatchOutcome, Trust};
use kvgate_core::EndpointId;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zeromq::{Socket, SocketEvent, SocketRecv, SubSocket};

/// Pause before reopening a socket that failed to bind or connect.
const RETRY: Duration = Duration::from_millis(500);

/// Counts the socket's connections, made or accepted: an engine connecting to a bound socket
/// does so on its own schedule (retrying for up to several seconds), and batches it publishes
/// before are lost, so operators and tests need to see when it is there.
fn count_connections(
    mut monitor: impl Stream<Item = SocketEvent> + Unpin + Send + 'static,
    watch: &EngineWatch,
    label: metrics::EndpointLabel,
) {
    let counter = watch.engine_state.connections.get_or_create(&label).clone();
    tokio::spawn(async move {
        while let Some(event) = monitor.next().await {
            if matches!(
                event,
                SocketEvent::Accepted(..) | SocketEvent::Connected(..)
            ) {
                counter.inc();
            }
        }
    });
}

async fn open(
    source: &EventSource,
    watch: &EngineWatch,
    label: &metrics::EndpointLabel,
) -> Result<SubSocket, zeromq::ZmqError> {
    let mut socket = SubSocket::new();
    count_connections(socket.monitor(), watch, label.clone());
    match source {
        EventSource::Bind(address) => {
            socket.bind(address).await?;
        }
        EventSource::Connect(address) => socket.connect(address).await?,
    }
    socket.subscribe("").await?;
    Ok(socket)
}

/// Starts `id`'s subscriber when its configuration names a source.
pub(crate) fn spawn(watch: EngineWatch, id: EndpointId) {
    let Some(spec) = watch.pool.kv_events_of(id) else {
        return;
    };
    let Ok(source) = EventSource::parse(&spec) else {
        return;
    };
    let mut stop = watch.stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = run(&watch, id, &source) => {}
            _ = stop.changed() => {}
        }
    });
}

async fn run(watch: &EngineWatch, id: EndpointId, source: &EventSource) {
    let idle = Duration::from_millis(watch.kv_events.idle_reconnect_ms);
    let mut warned = false;
    while let Some(name) = watch.pool.name_of(id) {
        let label = metrics::endpoint(&name);
        let mut socket = match open(source, watch, &label).await {
            Ok(s) => s,
            Err(e) => {
                if !warned {
                    tracing::warn!(endpoint = %name, source = ?source, error = %e, "cannot open the KV-event socket; retrying");
                    warned = true;
                }
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        warned = false;
        loop {
            // The endpoint left the pool: stop (and free a bound address for its successor).
            if watch.pool.name_of(id).is_none() {
                return;
            }
            let message = match tokio::time::timeout(idle, socket.recv()).await {
                Ok(Ok(m)) => m,
                Ok(Err(e)) => {
                    tracing::info!(endpoint = %name, error = %e, "KV-event socket failed; reopening");
                    incident(watch, &label, "disconnect");
                    tokio::time::sleep(RETRY).await;
                    break;
                }
                // Quiet: a bound socket just waits; a connecting one reconnects, in case the
                // engine restarted behind it.
                Err(_) if matches!(source, EventSource::Connect(_)) => break,
                Err(_) => continue,
            };
            let frames: Vec<&[u8]> = message.iter().map(|f| f.as_ref()).collect();
            let batch = match decode(&frames) {
                Ok(b) => b,
                Err(e) => {
                    tracing::debug!(endpoint = %name, error = %e, "undecodable KV-event message");
                    incident(watch, &label, "decode_error");
                    continue;
                }
            };
            let m = &watch.engine_state;
            m.batches.get_or_create(&label).inc();
            m.events
                .get_or_create(&label)
                .inc_by(batch.events.len() as u64);
            if let Some(ts) = batch.ts {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                m.lag_seconds.observe((now - ts).max(0.0));
            }
            let Some((outcome, status)) = watch.pool.kv_batch(id, batch.seq, &batch.events) else {
                return;
            };
            let kind = match outcome {
                BatchOutcome::InOrder => None,
                BatchOutcome::JoinedLate => Some("joined_late"),
                BatchOutcome::Gap { expected, got } => {
                    tracing::info!(endpoint = %name, expected, got, "KV-event batches lost; the endpoint's entries are untrusted until resynced");
                    Some("gap")
                }
                BatchOutcome::Restarted => Some("restart"),
                BatchOutcome::Overflow => Some("overflow"),
                BatchOutcome::Stale => Some("stale"),
            };
            if let Some(kind) = kind {
                incident(watch, &label, kind);
            }
            m.entries
                .get_or_create(&label)
                .set(i64::try_from(status.entries).unwrap_or(i64::MAX));
            m.trusted
                .get_or_create(&label)
                .set(i64::from(status.trust == Trust::Live));
        }
        let _ = socket.close().await;
    }
}

fn incident(watch: &EngineWatch, label: &metrics::EndpointLabel, kind: &'static str) {
    watch
        .engine_state
        .incidents
        .get_or_create(&StreamLabels {
            endpoint: label.endpoint.clone(),
            kind,
        })
        .inc();
}
