//! The engine's TLS and proxy settings (Python's `verify=`, `cert=`, `proxy=`; Node's `ca`,
//! `cert`, `proxy`) on the `reqwest::ClientBuilder` it sends through. The host language's own
//! HTTP stack never reaches the wire, so its TLS options are taken here.

use crate::error::{HostError, HostErrorKind, with_causes};

/// How the engine's connections are secured and routed, as the package hands it over.
#[derive(Debug)]
pub struct Connection {
    /// `false`: no certificate is verified (`verify=False`).
    pub verify: bool,
    /// A PEM file of the only roots to trust (`verify="ca.pem"`).
    pub ca_file: Option<String>,
    /// A PEM file with the client certificate (and its key, when `key_file` is `None`).
    pub cert_file: Option<String>,
    /// A PEM file with the client certificate's private key.
    pub key_file: Option<String>,
    /// Every request through this proxy (`proxy="http://proxy:3128"`).
    pub proxy: Option<String>,
}

/// A file's bytes.
///
/// # Errors
///
/// [`HostErrorKind::NotFound`] for a missing file, [`HostErrorKind::Io`] for one that cannot be read, naming
/// the option and the file.
fn read(option: &str, path: &str, what: &str) -> Result<Vec<u8>, HostError> {
    std::fs::read(path).map_err(|err| {
        let message = format!("{option}: cannot read {path:?} ({err}); pass the path of {what}");
        let kind = if err.kind() == std::io::ErrorKind::NotFound {
            HostErrorKind::NotFound
        } else {
            HostErrorKind::Io
        };
        HostError { kind, message }
    })
}

impl Connection {
    /// `builder` with these settings.
    ///
    /// # Errors
    ///
    /// `FileNotFoundError`/`OSError` for a file that cannot be read, `ValueError` for one that
    /// holds no PEM certificate (or key), or a proxy URL that cannot be parsed.
    pub fn apply(
        &self,
        mut builder: reqwest::ClientBuilder,
    ) -> Result<reqwest::ClientBuilder, HostError> {
        if !self.verify {
            builder = builder.danger_accept_invalid_certs(true);
        }
        if let Some(path) = &self.ca_file {
            let pem = read("verify", path, "a PEM file of CA certificates")?;
            let roots = reqwest::Certificate::from_pem_bundle(&pem).map_err(|err| {
                HostError::value(format!(
                    "verify: {path:?} is not a PEM file of certificates ({}); pass a file of \
                     \"-----BEGIN CERTIFICATE-----\" blocks",
                    with_causes(&err)
                ))
            })?;
            if roots.is_empty() {
                return Err(HostError::value(format!(
                    "verify: {path:?} holds no PEM certificate; pass a file of \
                     \"-----BEGIN CERTIFICATE-----\" blocks"
                )));
            }
            // A block that is PEM but not a certificate rustls can read fails only when a
            // client is built: try the roots alone, to name the file.
            reqwest::Client::builder()
                .tls_certs_only(roots.clone())
                .build()
                .map_err(|err| {
                    HostError::value(format!(
                        "verify: {path:?} holds a certificate that cannot be used as a root \
                         ({}); pass a file of valid PEM CA certificates",
                        with_causes(&err)
                    ))
                })?;
            builder = builder.tls_certs_only(roots);
        }
        if let Some(cert) = &self.cert_file {
            let mut pem = read(
                "cert",
                cert,
                "a PEM file with the client certificate (and its key)",
            )?;
            if let Some(key) = &self.key_file {
                pem.push(b'\n');
                pem.extend(read(
                    "cert",
                    key,
                    "a PEM file with the client certificate's key",
                )?);
            }
            let files = match &self.key_file {
                Some(key) => format!("{cert:?} and {key:?}"),
                None => format!("{cert:?}"),
            };
            let identity = reqwest::Identity::from_pem(&pem).map_err(|err| {
                HostError::value(format!(
                    "cert: no PEM certificate with its private key in {files} ({}); pass a \
                     file with both, or a (certificate, key) pair of files",
                    with_causes(&err)
                ))
            })?;
            // A certificate that cannot be read, or a key that is not its own, fails only when a
            // client is built: try the identity alone, to name the files.
            reqwest::Client::builder()
                .identity(identity.clone())
                .build()
                .map_err(|err| {
                    HostError::value(format!(
                        "cert: no usable client certificate in {files} ({}); pass a PEM \
                         certificate with its own private key",
                        with_causes(&err)
                    ))
                })?;
            builder = builder.identity(identity);
        }
        // httpx follows redirects itself (`follow_redirects`); without `proxy=` the engine
        // connects directly, as httpx's own transport does (the environment's proxies are
        // httpx's mounts).
        if let Some(url) = &self.proxy {
            let scheme = url
                .split_once("://")
                .map(|(scheme, _)| scheme.to_ascii_lowercase());
            if !matches!(scheme.as_deref(), Some("http" | "https")) {
                return Err(HostError::value(format!(
                    "proxy: {url:?} is not an http:// or https:// URL (the only proxies this \
                     build speaks to); pass one such as \"http://proxy.example:3128\""
                )));
            }
        }
        builder = match &self.proxy {
            Some(url) => builder.proxy(reqwest::Proxy::all(url.as_str()).map_err(|err| {
                HostError::value(format!(
                    "proxy: {url:?} is not a proxy URL ({}); pass one such as \
                     \"http://proxy.example:3128\"",
                    with_causes(&err)
                ))
            })?),
            None => builder.no_proxy(),
        };
        Ok(builder)
    }

    /// The error for a client that would not build, its TLS files already tried alone.
    pub fn build_error(err: &reqwest::Error) -> HostError {
        HostError::runtime(format!(
            "cannot build the HTTP client: {}",
            with_causes(err)
        ))
    }
}
