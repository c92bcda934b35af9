//! The listeners: an accept loop per address and one task per client connection, served by
//! hyper over HTTP/1.1 and HTTP/2, with the bounds of [`ListenerConfig`]: header-read and idle
//! timeouts, a connection cap that evicts the oldest connection without a request (as nginx
//! reuses keep-alive connections when out of them), header size and count limits, and accept
//! errors (out of descriptors) that free a connection and back off instead of spinning, and
//! TLS ([`tls`]).

mod config;
mod metrics;
pub(crate) mod table;
pub(crate) mod tls;

use crate::metrics::reason;
use axum::body::Body;
use axum::Router;
pub use config::{ListenerConfig, TlsConfig};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
pub(crate) use metrics::ConnectionMetrics;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use table::{Admitted, Close, Conn, Connections};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// What every connection of one gateway shares.
#[derive(Debug)]
pub(crate) struct Listening {
    pub(crate) conns: Arc<Connections>,
    builder: Builder<TokioExecutor>,
    metrics: ConnectionMetrics,
    header_timeout: Duration,
    idle_timeout: Duration,
}

impl Listening {
    pub(crate) fn new(config: &ListenerConfig, metrics: ConnectionMetrics) -> Arc<Self> {
        let header_timeout = Duration::from_secs_f64(config.header_read_timeout_secs);
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .max_headers(config.max_headers)
            .max_buf_size(config.max_header_bytes);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(config.http2_max_concurrent_streams)
            .max_header_list_size(u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX))
            // Pings find peers that vanished without closing (hyper's defaults).
            .keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(20));
        if !config.http2 {
            builder = builder.http1_only();
        }
        Arc::new(Listening {
            conns: Arc::new(Connections::new(config.max_connections)),
            builder,
            metrics,
            header_timeout,
            idle_timeout: Duration::from_secs_f64(config.idle_timeout_secs),
        })
    }

    /// Closes connections quiet for too long, until `stop`. The sweep runs four times per
    /// header timeout (at most every second), so a silent connection goes within 1.25 of it.
    pub(crate) async fn sweep(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let period = (self.header_timeout / 4).min(Duration::from_secs(1));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    for conn in self.conns.sweep(self.header_timeout, self.idle_timeout) {
                        self.count_close(&conn);
                    }
                }
                _ = stop.wait_for(|&s| s) => return,
            }
        }
    }

    fn count_close(&self, conn: &Conn) {
        if let Some(why) = conn.reason() {
            self.metrics
                .closed
                .get_or_create(&reason(why.label()))
                .inc();
        }
    }

    /// Accepts on `listener` and serves `router` until `stop`, then lets each connection
    /// finish the requests it has in flight.
    pub(crate) async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        router: Router,
        tls: Option<TlsAcceptor>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.wait_for(|&s| s) => return,
            };
            match accepted {
                Ok((stream, _)) => {
                    self.clone()
                        .open(stream, router.clone(), tls.clone(), stop.clone());
                }
                Err(e) => {
                    // EMFILE and the like: the error repeats until a descriptor frees, so free
                    // one and back off rather than spin (Envoy and tokio's docs do the same).
                    self.metrics.accept_errors.inc();
                    if let Some(conn) = self.conns.evict_one() {
                        self.count_close(&conn);
                    }
                    tracing::warn!(error = %e, "accept failed; backing off 50 ms");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn open(
        self: Arc<Self>,
        stream: TcpStream,
        router: Router,
        tls: Option<TlsAcceptor>,
        stop: watch::Receiver<bool>,
    ) {
        self.metrics.accepted.inc();
        let conn = match self.conns.admit() {
            Admitted::Open { conn, evicted } => {
                if let Some(old) = evicted {
                    self.count_close(&old);
                }
                conn
            }
            Admitted::Refused => {
                self.metrics.closed.get_or_create(&reason("refused")).inc();
                return;
            }
        };
        self.metrics.open.set(self.conns.len() as i64);
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            match tls {
                None => self.run(stream, router, &conn, stop).await,
                // The handshake is part of the head a client must send in time.
                Some(tls) => {
                    match tokio::time::timeout(self.header_timeout, tls.accept(stream)).await {
                        Ok(Ok(stream)) => self.run(stream, router, &conn, stop).await,
                        _ => {
                            self.metrics
                                .closed
                                .get_or_create(&reason("tls_handshake"))
                                .inc();
                        }
                    }
                }
            }
            self.conns.remove(&conn);
            self.metrics.open.set(self.conns.len() as i64);
        });
    }

    async fn run<S>(
        &self,
        stream: S,
        router: Router,
        conn: &Arc<Conn>,
        mut stop: watch::Receiver<bool>,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let tracked = conn.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let guard = tracked.begin();
            let router = router.clone();
            async move {
                let response = router.oneshot(req.map(Body::new)).await?;
                // The request counts as in flight until its body is done or dropped.
                Ok::<_, Infallible>(response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _in_flight = &guard;
                        frame
                    }))
                }))
            }
        });
        let serving = self.builder.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(serving);
        let mut finishing = false;
        loop {
            tokio::select! {
                result = serving.as_mut() => {
                    let timed_out = result.as_ref().err()
                        .and_then(|e| e.downcast_ref::<hyper::Error>())
                        .is_some_and(hyper::Error::is_timeout);
                    if timed_out {
                        self.metrics.closed.get_or_create(&reason(Close::HeaderTimeout.label())).inc();
                    }
                    return;
                }
                _ = conn.closing(), if !finishing => {
                    if conn.active() == 0 {
                        return; // dropping the connection closes it
                    }
                    serving.as_mut().graceful_shutdown();
                    finishing = true;
                }
                _ = stop.wait_for(|&s| s), if !finishing => {
                    serving.as_mut().graceful_shutdown();
                    finishing = true;
                }
            }
        }
    }
}
