//! TLS on the listeners (rustls, ring): the certificate chain and key come from PEM files that
//! are re-read when they change (certificates rotated by cert-manager or an ACME client take
//! effect without a restart; connections already open keep theirs), and the admin listener can
//! require client certificates signed by a CA of its own (mTLS). ALPN offers HTTP/2 when the
//! listener serves it.

use super::TlsConfig;
use crate::error::TlsError;
use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

fn file_error(path: &Path, why: impl ToString) -> TlsError {
    TlsError::File {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a PEM chain and key into a key rustls can sign with.
fn load(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_error(cert, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(cert, e))?;
    if chain.is_empty() {
        return Err(file_error(cert, "no CERTIFICATE in the file"));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, e))?;
    CertifiedKey::from_der(chain, key_der, provider).map_err(|e| TlsError::Rustls(e.to_string()))
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The current certificate, swapped when its files change.
#[derive(Debug)]
struct Certificate {
    current: ArcSwap<CertifiedKey>,
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    stamps: Mutex<(Option<SystemTime>, Option<SystemTime>)>,
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

impl Certificate {
    fn stamps(&self) -> (Option<SystemTime>, Option<SystemTime>) {
        (modified(&self.cert), modified(&self.key))
    }

    /// Re-reads the files if either changed since the last look; a pair that does not load
    /// (half-written, key from another pair) leaves the current certificate in place.
    fn refresh(&self) -> Option<Result<(), TlsError>> {
        let now = self.stamps();
        let mut seen = self.stamps.lock().unwrap_or_else(|e| e.into_inner());
        if *seen == now {
            return None;
        }
        // Once per change, loaded or not: a half-written pair is retried when the writer's next
        // write changes the time again, and a bad pair is reported once.
        *seen = now;
        let loaded = load(&self.cert, &self.key, &self.provider);
        if let Ok(key) = &loaded {
            self.current.store(Arc::new(key.clone()));
        }
        Some(loaded.map(|_| ()))
    }
}

/// The acceptors of both listeners and the certificate they share.
pub(crate) struct Tls {
    certificate: Arc<Certificate>,
    /// For the public listener.
    pub(crate) public: TlsAcceptor,
    /// For the admin listener: the public one, or one requiring client certificates.
    pub(crate) admin: TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("cert_file", &self.certificate.cert)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Loads the files of `config`; `http2` adds `h2` to ALPN.
    pub(crate) fn new(config: &TlsConfig, http2: bool) -> Result<Self, TlsError> {
        let provider = provider();
        let key = load(&config.cert_file, &config.key_file, &provider)?;
        let certificate = Arc::new(Certificate {
            current: ArcSwap::from_pointee(key),
            cert: config.cert_file.clone(),
            key: config.key_file.clone(),
            provider: provider.clone(),
            stamps: Mutex::new((modified(&config.cert_file), modified(&config.key_file))),
        });
        let alpn: Vec<Vec<u8>> = if http2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        let builder = || {
            ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| TlsError::Rustls(e.to_string()))
        };
        let finish = |mut c: ServerConfig| {
            c.alpn_protocols.clone_from(&alpn);
            TlsAcceptor::from(Arc::new(c))
        };
        let public = finish(
            builder()?
                .with_no_client_auth()
                .with_cert_resolver(certificate.clone()),
        );
        let admin = match &config.admin_client_ca_file {
            None => public.clone(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(ca).map_err(|e| file_error(ca, e))? {
                    let cert = cert.map_err(|e| file_error(ca, e))?;
                    roots
                        .add(cert)
                        .map_err(|e| TlsError::Rustls(e.to_string()))?;
                }
                if roots.is_empty() {
                    return Err(file_error(ca, "no CERTIFICATE in the file"));
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| TlsError::Rustls(e.to_string()))?;
                finish(
                    builder()?
                        .with_client_cert_verifier(verifier)
                        .with_cert_resolver(certificate.clone()),
                )
            }
        };
        Ok(Tls {
            certificate,
            public,
            admin,
        })
    }

    /// Checks the certificate files every `period` until `stop`, swapping in a changed pair.
    pub(crate) async fn watch(self: Arc<Self>, period: Duration, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = tick.tick() => match self.certificate.refresh() {
                    Some(Ok(())) => tracing::info!(
                        path = %self.certificate.cert.display(),
                        "reloaded the TLS certificate"
                    ),
                    Some(Err(e)) => tracing::warn!(error = %e, "TLS certificate not reloaded"),
                    None => {}
                },
                _ = stop.wait_for(|&s| s) => return,
            }
        }
    }
}
