//! The NATS side: one connection per replica, a publisher task that batches this replica's
//! events (and answers warm-start requests), and a receiver task that applies its peers'.

use super::peers::PeerTable;
use super::receiver::Receiver;
use super::wire::{Batcher, Header, WireEvent};
use super::{ClusterConfig, ClusterMetrics, Local, Outbox, Sharing};
use crate::pool::Progress;
use crate::tenancy::Announcement;
use async_nats::connection::State;
use kvgate_core::{Nanos, Request};
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// A message's size at most: half of NATS's default `max_payload` (1 MiB), which a server
/// for a cluster must not lower.
const MESSAGE_BYTES: usize = 512 * 1024;

/// Events per batch at most, so one burst does not delay the first of them for long.
const MAX_BATCH_EVENTS: usize = 512;

/// Starts sharing when `cluster.url` is set: the pool's outbox is installed before the first
/// request, the connection and both tasks run until the gateway stops.
pub(crate) fn spawn(shared: Sharing) {
    let Some(url) = shared.config.url.clone() else {
        return;
    };
    let shared = Arc::new(shared);
    let config = shared.config.clone();
    let metrics = shared.metrics.clone();
    let (outbox, rx) = Outbox::new(&config, metrics.clone());
    let replica = rand::random::<u64>();
    if let Some(gate) = shared.tenancy.fanout() {
        gate.join_cluster(
            Arc::new(outbox.clone()),
            replica,
            Duration::from_millis(config.fanout_window_ms),
        );
    }
    shared.tenancy.join_cluster(Arc::new(outbox.clone()));
    shared.semcache.join_cluster(Arc::new(outbox.clone()));
    shared.pool.subscribe(Arc::new(outbox));
    let replica =
        shared.seed ^ u64::from(std::process::id()).rotate_left(32) ^ rand::random::<u64>();
    tokio::spawn(async move {
        if let Err(e) = run(shared, url, config, replica, rx).await {
            tracing::error!("cluster: not sharing state: {e}");
        }
    });
}

async fn run(
    shared: Arc<Sharing>,
    url: String,
    config: ClusterConfig,
    replica: u64,
    rx: mpsc::Receiver<Local>,
) -> Result<(), async_nats::Error> {
    let metrics = shared.metrics.clone();
    let (conn_tx, conn_rx) = watch::channel(false);
    let callback_metrics = metrics.clone();
    let options = async_nats::ConnectOptions::new()
        .name(format!("kvgate-{replica:016x}"))
        .no_echo()
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(2))
        .reconnect_delay_callback(|n| Duration::from_millis((100 * n as u64).min(2000)))
        .event_callback(move |event| {
            let up = match event {
                async_nats::Event::Connected => Some(true),
                async_nats::Event::Disconnected => Some(false),
                _ => None,
            };
            if let Some(up) = up {
                callback_metrics.connected.set(i64::from(up));
                if up {
                    tracing::info!("cluster: connected to NATS; sharing routing state");
                } else {
                    callback_metrics.disconnects.inc();
                    tracing::warn!(
                        "cluster: lost the NATS connection; routing on this replica's state \
                         alone until it is back"
                    );
                }
                conn_tx.send_if_modified(|v| std::mem::replace(v, up) != up);
            }
            async {}
        });
    let servers: Vec<async_nats::ServerAddr> = url
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let client = options.connect(servers).await?;
    let prefix = format!("kvgate.{}", config.name);
    let events = client.subscribe(format!("{prefix}.events")).await?;
    let warm = client
        .subscribe(format!("{prefix}.warm.{replica:016x}"))
        .await?;
    let nonce = Arc::new(AtomicU64::new(0));
    let (hello_tx, hello_rx) = mpsc::channel(64);
    let publisher = Publisher {
        batcher: Batcher::new(header(replica, 0, false), MESSAGE_BYTES),
        client: client.clone(),
        subject: format!("{prefix}.events"),
        prefix: prefix.clone(),
        replica,
        nonce: nonce.clone(),
        recent: VecDeque::new(),
        recent_bytes: 0,
        own: HashSet::new(),
        metrics: metrics.clone(),
        config: config.clone(),
        last_sent: Instant::now(),
    };
    tokio::spawn(publisher.run(rx, hello_rx, conn_rx, shared.stop.clone()));
    let receiver = Receiver {
        table: PeerTable::new(
            Nanos::from_millis(config.peer_timeout_ms),
            Nanos::from_secs(config.max_request_secs),
        ),
        shared,
        metrics,
        hello_tx,
        nonce,
        warm_from: None,
    };
    receiver.run(events, warm).await;
    Ok(())
}

fn header(replica: u64, hello: u64, last: bool) -> Header {
    Header {
        replica,
        hello,
        last,
        at_us: 0,
    }
}

/// Batches this replica's events onto the events subject; keeps recent dispatches for warm
/// starts.
struct Publisher {
    client: async_nats::Client,
    subject: String,
    prefix: String,
    replica: u64,
    batcher: Batcher,
    /// The nonce of this replica's latest hello, shared with the receiver.
    nonce: Arc<AtomicU64>,
    /// Recent dispatches, oldest first, and their prompt bytes.
    recent: VecDeque<(Arc<str>, Request, usize)>,
    recent_bytes: usize,
    /// This replica's requests in flight (id, endpoint).
    own: HashSet<(u64, Arc<str>)>,
    metrics: Arc<ClusterMetrics>,
    config: ClusterConfig,
    last_sent: Instant,
}

impl Publisher {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Local>,
        mut hellos: mpsc::Receiver<(u64, u64)>,
        mut conn: watch::Receiver<bool>,
        mut stop: watch::Receiver<bool>,
    ) {
        let heartbeat = Duration::from_millis(self.config.heartbeat_ms);
        let mut tick = tokio::time::interval(heartbeat / 2);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        if *conn.borrow_and_update() {
            self.hello().await;
        }
        loop {
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                Some(first) = rx.recv() => {
                    self.take(first).await;
                    while self.batcher.len() < MAX_BATCH_EVENTS {
                        match rx.try_recv() {
                            Ok(more) => self.take(more).await,
                            Err(_) => break,
                        }
                    }
                    if let Some(message) = self.batcher.take() {
                        self.send(self.subject.clone(), message).await;
                    }
                }
                Ok(()) = conn.changed() => {
                    if *conn.borrow_and_update() {
                        self.hello().await;
                    }
                }
                Some((joiner, nonce)) = hellos.recv() => self.warm(joiner, nonce).await,
                _ = tick.tick() => {
                    if self.last_sent.elapsed() >= heartbeat {
                        let beat = self.batcher.heartbeat();
                        self.send(self.subject.clone(), beat).await;
                    }
                }
            }
        }
        self.event(WireEvent::Bye).await;
        if let Some(message) = self.batcher.take() {
            self.send(self.subject.clone(), message).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), self.client.flush()).await;
    }

    /// Turns one of the pool's events into a wire event, remembering dispatches for warm
    /// starts.
    async fn take(&mut self, local: Local) {
        let event = match local {
            Local::Dispatched { endpoint, request } => {
                self.remember(&endpoint, &request);
                WireEvent::Dispatched {
                    endpoint,
                    request,
                    done: false,
                }
            }
            Local::Progress(Progress::FirstToken {
                id,
                endpoint,
                ttft,
                stream,
            }) => WireEvent::FirstToken {
                id,
                endpoint,
                ttft_ns: ttft.0,
                stream,
            },
            Local::Progress(Progress::Ended { id, endpoint, end }) => {
                self.own.remove(&(id, endpoint.clone()));
                WireEvent::ended(id, endpoint, end)
            }
            Local::Tenancy(Announcement::Fanout(event)) => WireEvent::Fanout { event },
            Local::Tenancy(Announcement::Limits {
                scopes,
                requests,
                input,
                output,
            }) => WireEvent::Limits {
                scopes,
                requests,
                input,
                output,
            },
            Local::Tenancy(Announcement::Spend(spent)) => WireEvent::Spend { spent },
            Local::Cache(entry) => WireEvent::CacheEntry { entry },
        };
        self.event(event).await;
    }

    async fn event(&mut self, event: WireEvent) {
        match self.batcher.push(&event) {
            Ok(Some(full)) => self.send(self.subject.clone(), full).await,
            Ok(None) => {}
            Err(()) => self.metrics.dropped("too_large"),
        }
    }

    fn remember(&mut self, endpoint: &Arc<str>, request: &Request) {
        self.own.insert((request.id, endpoint.clone()));
        let bytes = request.prompt.text.as_ref().map_or(0, String::len)
            + request.prompt.tokens.as_ref().map_or(0, |t| t.len() * 4)
            + 64;
        self.recent
            .push_back((endpoint.clone(), request.clone(), bytes));
        self.recent_bytes += bytes;
        while self.recent_bytes > self.config.warm_start_bytes {
            match self.recent.pop_front() {
                Some((_, _, b)) => self.recent_bytes -= b,
                None => break,
            }
        }
    }

    async fn send(&mut self, subject: String, message: Vec<u8>) {
        let events = message.iter().filter(|&&b| b == b'\n').count();
        if self.client.connection_state() != State::Connected {
            for _ in 0..events {
                self.metrics.dropped("disconnected");
            }
            return;
        }
        match self.client.publish(subject, message.into()).await {
            Ok(()) => {
                self.metrics.count("sent", events);
                self.last_sent = Instant::now();
            }
            Err(e) => {
                tracing::debug!("cluster: publish failed: {e}");
                for _ in 0..events {
                    self.metrics.dropped("publish_error");
                }
            }
        }
    }

    /// Asks the peers for a warm start.
    async fn hello(&mut self) {
        let nonce = rand::random::<u64>() | 1;
        self.nonce.store(nonce, Ordering::Relaxed);
        self.event(WireEvent::Hello { nonce }).await;
        if let Some(message) = self.batcher.take() {
            self.send(self.subject.clone(), message).await;
        }
    }

    /// Sends `joiner` this replica's recent dispatches, oldest first, those still in flight
    /// marked so.
    async fn warm(&mut self, joiner: u64, nonce: u64) {
        let subject = format!("{}.warm.{joiner:016x}", self.prefix);
        let mut batcher = Batcher::new(header(self.replica, nonce, false), MESSAGE_BYTES);
        let mut messages = Vec::new();
        for (endpoint, request, _) in &self.recent {
            let done = !self.own.contains(&(request.id, endpoint.clone()));
            let event = WireEvent::Dispatched {
                endpoint: endpoint.clone(),
                request: request.clone(),
                done,
            };
            if let Ok(Some(full)) = batcher.push(&event) {
                messages.push(full);
            }
        }
        messages.extend(batcher.take());
        batcher.set_header(header(self.replica, nonce, true));
        messages.push(batcher.heartbeat());
        for m in messages {
            self.send(subject.clone(), m).await;
        }
    }
}
