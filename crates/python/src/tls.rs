//! The transports' TLS and proxy settings (`verify=`, `cert=`, `proxy=`) on the
//! `reqwest::ClientBuilder` the engine sends through. httpx leaves a custom transport to do
//! its own TLS: the client's `verify=` and `cert=` never reach it.

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// How the engine's connections are secured and routed, as the Python side hands it over.
#[derive(Debug)]
pub(crate) struct Connection {
    /// `false`: no certificate is verified (`verify=False`).
    pub(crate) verify: bool,
    /// A PEM file of the only roots to trust (`verify="ca.pem"`).
    pub(crate) ca_file: Option<String>,
    /// A PEM file with the client certificate (and its key, when `key_file` is `None`).
    pub(crate) cert_file: Option<String>,
    /// A PEM file with the client certificate's private key.
    pub(crate) key_file: Option<String>,
    /// Every request through this proxy (`proxy="http://proxy:3128"`).
    pub(crate) proxy: Option<String>,
}

/// An error's message followed by its causes, for a message that names what went wrong.
fn with_causes(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// A file's bytes.
///
/// # Errors
///
/// `FileNotFoundError` for a missing file, `OSError` for one that cannot be read, both naming
/// the option and the file.
fn read(option: &str, path: &str, what: &str) -> PyResult<Vec<u8>> {
    std::fs::read(path).map_err(|err| {
        let message = format!("{option}: cannot read {path:?} ({err}); pass the path of {what}");
        if err.kind() == std::io::ErrorKind::NotFound {
            PyFileNotFoundError::new_err(message)
        } else {
            PyOSError::new_err(message)
        }
    })
}

impl Connection {
    /// `builder` with these settings.
    ///
    /// # Errors
    ///
    /// `FileNotFoundError`/`OSError` for a file that cannot be read, `ValueError` for one that
    /// holds no PEM certificate (or key), or a proxy URL that cannot be parsed.
    pub(crate) fn apply(
        &self,
        mut builder: reqwest::ClientBuilder,
    ) -> PyResult<reqwest::ClientBuilder> {
        if !self.verify {
            builder = builder.danger_accept_invalid_certs(true);
        }
        if let Some(path) = &self.ca_file {
            let pem = read("verify", path, "a PEM file of CA certificates")?;
            let roots = reqwest::Certificate::from_pem_bundle(&pem).map_err(|err| {
                PyValueError::new_err(format!(
                    "verify: {path:?} is not a PEM file of certificates ({}); pass a file of \
                     \"-----BEGIN CERTIFICATE-----\" blocks",
                    with_causes(&err)
                ))
            })?;
            if roots.is_empty() {
                return Err(PyValueError::new_err(format!(
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
                    PyValueError::new_err(format!(
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
                PyValueError::new_err(format!(
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
                    PyValueError::new_err(format!(
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
                return Err(PyValueError::new_err(format!(
                    "proxy: {url:?} is not an http:// or https:// URL (the only proxies this \
                     build speaks to); pass one such as \"http://proxy.example:3128\""
                )));
            }
        }
        builder = match &self.proxy {
            Some(url) => builder.proxy(reqwest::Proxy::all(url.as_str()).map_err(|err| {
                PyValueError::new_err(format!(
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
    pub(crate) fn build_error(err: &reqwest::Error) -> PyErr {
        PyRuntimeError::new_err(format!(
            "cannot build the HTTP client: {}",
            with_causes(err)
        ))
    }
}
