//! The HTTP server: our own accept loop around hyper, so a fault can reset one connection.
//!
//! Each accepted socket keeps a duplicate descriptor next to the hyper connection. To emulate a
//! crashed or misbehaving upstream, a handler calls [`Connection::reset`]: the hyper connection
//! is dropped and the socket closed with `SO_LINGER` 0, which sends a TCP RST instead of FIN,
//! as a killed process or a broken proxy would.

use axum::extract::Request;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The client connection a request arrived on (a request extension).
#[derive(Clone, Debug)]
pub(crate) struct Connection {
    pub(crate) peer: SocketAddr,
    reset: CancellationToken,
}

impl Connection {
    /// A connection from `peer` (request handlers get theirs from the accept loop).
    #[cfg(test)]
    pub(crate) fn for_test(peer: SocketAddr) -> Self {
        Connection {
            peer,
            reset: CancellationToken::new(),
        }
    }

    /// Resets the TCP connection (RST); the handler should then never complete.
    pub(crate) fn reset(&self) {
        self.reset.cancel();
    }
}

/// Accepts connections until `shutdown` fires.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    app: axum::Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) if is_transient(&e) => {
                // Out of descriptors or an aborted handshake: back off, keep serving.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let _ = stream.set_nodelay(true);
        let std_stream = stream.into_std()?;
        let killer = std_stream.try_clone()?;
        let stream = tokio::net::TcpStream::from_std(std_stream)?;
        let connection = Connection {
            peer,
            reset: CancellationToken::new(),
        };
        let reset = connection.reset.clone();
        let app = app.clone();
        let service =
            hyper::service::service_fn(move |mut request: Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(connection.clone());
                app.clone().oneshot(request.map(axum::body::Body::new))
            });
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = reset.cancelled() => {
                    let _ = socket2::SockRef::from(&killer).set_linger(Some(Duration::ZERO));
                }
                _ = shutdown.cancelled() => {}
            }
            drop(killer);
        });
    }
}

fn is_transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock
    ) || e
        .raw_os_error()
        .is_some_and(|code| code == 24 || code == 23)
}
