//! Why an upstream could not be reached, in words an operator can act on. The client's errors
//! arrive as a chain (hyper's legacy client, the connector, an `io::Error`, rustls), whose
//! one-line form ("client error (Connect): invalid peer certificate: Other(...)") names neither
//! the cause nor the fix; this reads the chain once and keeps both.

use rustls::CertificateError;
use serde::Serialize;
use std::time::Duration;

/// One upstream failure, classified.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "cause", rename_all = "snake_case")]
pub(crate) enum Trouble {
    /// Nothing listens at the address.
    Refused {
        /// `host:port` as the URL gives it.
        address: String,
    },
    /// The host name did not resolve.
    Dns {
        /// The name.
        host: String,
    },
    /// Connected (or not), but no answer within the timeout.
    Timeout {
        /// The timeout, milliseconds.
        after_ms: u64,
    },
    /// The server's certificate was refused.
    Tls {
        /// What is wrong with it.
        problem: String,
        /// How to fix it.
        fix: &'static str,
    },
    /// The engine answers, but its own `/health` says it is not serving.
    Reports {
        /// The status `/health` answered.
        status: u16,
    },
    /// Anything else, as the client said it.
    Other {
        /// The error chain on one line.
        detail: String,
    },
}

impl std::fmt::Display for Trouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trouble::Refused { address } => write!(
                f,
                "connection refused at {address}: is the engine running and listening on that port?"
            ),
            Trouble::Dns { host } => write!(f, "cannot resolve the host name {host}"),
            Trouble::Timeout { after_ms } => write!(
                f,
                "no answer within {after_ms} ms: the engine is hung or overloaded, or a firewall \
                 drops the packets"
            ),
            Trouble::Tls { problem, fix } => write!(f, "TLS: {problem}: {fix}"),
            Trouble::Reports { status } => write!(
                f,
                "its /health answered {status}: the engine says it is not serving (starting, \
                 draining or failed)"
            ),
            Trouble::Other { detail } => f.write_str(detail),
        }
    }
}

impl Trouble {
    /// A short label for logs and metrics (`refused`, `dns`, `timeout`, `tls`, `reports`,
    /// `other`).
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Trouble::Refused { .. } => "refused",
            Trouble::Dns { .. } => "dns",
            Trouble::Timeout { .. } => "timeout",
            Trouble::Tls { .. } => "tls",
            Trouble::Reports { .. } => "reports",
            Trouble::Other { .. } => "other",
        }
    }

    /// No answer within `after`.
    pub(crate) fn timeout(after: Duration) -> Self {
        Trouble::Timeout {
            after_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Classifies the client's error for a request to `url`.
    pub(crate) fn of(error: &(dyn std::error::Error + 'static), url: &str) -> Self {
        let authority = url
            .split_once("://")
            .map_or(url, |(_, rest)| rest)
            .split('/')
            .next()
            .unwrap_or_default();
        let host = authority
            .rsplit_once(':')
            .map_or(authority, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(e) = next {
            if let Some(trouble) = classify(e, authority, host) {
                return trouble;
            }
            next = e.source();
        }
        Trouble::Other {
            detail: super::error_chain(error),
        }
    }
}

/// What one link of an error chain says, looking inside an `io::Error` made from another
/// error (a TLS handshake's failure arrives as an `io::Error` around an `io::Error` around
/// rustls's error), whose `source()` skips the error it wraps.
fn classify(e: &(dyn std::error::Error + 'static), authority: &str, host: &str) -> Option<Trouble> {
    if let Some(tls) = e.downcast_ref::<rustls::Error>() {
        return Some(tls_trouble(tls, host));
    }
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        if let Some(inner) = io.get_ref() {
            if let Some(trouble) = classify(inner, authority, host) {
                return Some(trouble);
            }
        }
        if io.kind() == std::io::ErrorKind::ConnectionRefused {
            return Some(Trouble::Refused {
                address: authority.to_string(),
            });
        }
    }
    // hyper-util's resolver error has no public type; its message is stable.
    e.to_string()
        .starts_with("dns error")
        .then(|| Trouble::Dns {
            host: host.to_string(),
        })
}

/// What rustls refused, with the fix for each way a private deployment gets it wrong.
fn tls_trouble(error: &rustls::Error, host: &str) -> Trouble {
    const SET_CA: &str = "set the endpoint's ca_file to the PEM of the CA that signed it";
    let (problem, fix) = match error {
        rustls::Error::InvalidCertificate(cert) => match cert {
            CertificateError::UnknownIssuer => (
                "the server's certificate is signed by a CA this gateway does not trust".into(),
                SET_CA,
            ),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                (
                    format!("the server's certificate is not valid for the name {host}"),
                    "use a URL with a name the certificate lists, or reissue it with this name in \
                 its subjectAltName",
                )
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                ("the server's certificate has expired".into(), "renew it")
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => (
                "the server's certificate is not valid yet".into(),
                "check the clocks of both machines, or reissue it",
            ),
            // webpki's CaUsedAsEndEntity reaches rustls only as an opaque `Other`: a
            // self-signed certificate made with `basicConstraints CA:TRUE` (openssl's default
            // for `req -x509`), which curl accepts and WebPKI does not.
            CertificateError::Other(other)
                if format!("{other:?}").contains("CaUsedAsEndEntity") =>
            {
                (
                    "the server's certificate is a CA certificate used as a leaf".into(),
                    "issue a leaf certificate from your CA for the server, and set the endpoint's \
                 ca_file to the CA",
                )
            }
            other => (
                format!("the server's certificate was refused ({other:?})"),
                SET_CA,
            ),
        },
        other => (other.to_string(), "check the server's TLS configuration"),
    };
    Trouble::Tls { problem, fix }
}
