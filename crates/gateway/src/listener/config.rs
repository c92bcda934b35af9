//! `listener:` and `tls:` in the configuration.

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};

/// TLS on the listeners. The files are PEM and are re-read when they change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The certificate chain, leaf first.
    pub cert_file: std::path::PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: std::path::PathBuf,
    /// When set, the admin listener requires client certificates signed by these CAs (mTLS).
    #[serde(default)]
    pub admin_client_ca_file: Option<std::path::PathBuf>,
}

/// How the listeners treat client connections: the bounds an exposed server needs so that slow
/// or idle clients cannot hold its file descriptors (a slowloris client sends half a header and
/// waits). Read once at start; a reload does not change them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenerConfig {
    /// Time a client has to send a request's headers, from the moment the connection starts
    /// waiting for them. On HTTP/1 this also bounds an idle keep-alive connection (hyper starts
    /// the clock when it waits for the next request). nginx uses 60 s, hyper 30 s; an API
    /// client sends its headers in one write.
    pub header_read_timeout_secs: f64,
    /// A connection with no request in flight for this long is closed (HTTP/2 mainly; see
    /// `header_read_timeout_secs` for HTTP/1). nginx's keep-alive timeout is 75 s.
    pub idle_timeout_secs: f64,
    /// Client connections open at once, admin listener included. At the cap a new connection
    /// closes the oldest one with no request in flight, or is refused when every one is busy,
    /// so half-open connections cannot lock out real clients.
    pub max_connections: usize,
    /// Largest request head (request line and headers); larger gets 431. Envoy allows 60 KiB.
    pub max_header_bytes: usize,
    /// Most header fields in one request; more gets 431 (Envoy's and hyper's default, 100).
    pub max_headers: usize,
    /// Serve HTTP/2 (prior knowledge on plain TCP) beside HTTP/1.1.
    pub http2: bool,
    /// Concurrent streams per HTTP/2 connection (nginx: 128).
    pub http2_max_concurrent_streams: u32,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            header_read_timeout_secs: 20.0,
            idle_timeout_secs: 120.0,
            max_connections: 10_000,
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            http2: true,
            http2_max_concurrent_streams: 256,
        }
    }
}

impl ListenerConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        // Both become `Duration`s, which cannot hold more than about 1.8e19 seconds, and the
        // connection sweep ticks at a quarter of the header timeout, which must not round to 0.
        const SECS: &str = "must be between 0.001 and 1e9 seconds";
        let seconds = |v: f64| (0.001..=1e9).contains(&v);
        if !seconds(self.header_read_timeout_secs) {
            return Err(ConfigError::invalid(
                "listener.header_read_timeout_secs",
                SECS,
            ));
        }
        if !seconds(self.idle_timeout_secs) {
            return Err(ConfigError::invalid("listener.idle_timeout_secs", SECS));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::invalid(
                "listener.max_connections",
                "must be at least 1",
            ));
        }
        // hyper's read buffer, which bounds the head, cannot be smaller than 8 KiB.
        if self.max_header_bytes < 8192 {
            return Err(ConfigError::invalid(
                "listener.max_header_bytes",
                "must be at least 8192",
            ));
        }
        if self.max_headers == 0 {
            return Err(ConfigError::invalid(
                "listener.max_headers",
                "must be at least 1",
            ));
        }
        if self.http2_max_concurrent_streams == 0 {
            return Err(ConfigError::invalid(
                "listener.http2_max_concurrent_streams",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}
