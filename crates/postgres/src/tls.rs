//! TLS through rustls (feature `postgres-rustls`): a connector that trusts the certificate
//! authorities in a PEM file, and the recognition of a server certificate it refused.

use std::error::Error as StdError;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres_rustls::MakeRustlsConnect;

use idempotent_retry_ledger::LedgerError;

/// A connector that trusts the certificates in the PEM file at `path`, and only those: a
/// database's certificate is usually signed by a private authority, which the system's and
/// the web's roots do not hold.
///
/// The crypto provider is aws-lc-rs, named here rather than taken from the process default:
/// reqwest's rustls already builds it, and a process that holds two providers (ring comes
/// along with some dependencies) has no default to take.
pub(super) fn trusting(path: &Path) -> Result<MakeRustlsConnect, LedgerError> {
    let shown = path.display();
    let mut roots = rustls::RootCertStore::empty();
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|err| {
            LedgerError::invalid(format!("cannot read the CA file {shown}")).with_source(err)
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| {
            LedgerError::invalid(format!("cannot read the CA file {shown}")).with_source(err)
        })?;
    if certificates.is_empty() {
        return Err(LedgerError::invalid(format!(
            "the CA file {shown} holds no PEM certificate"
        )));
    }
    for certificate in certificates {
        roots.add(certificate).map_err(|err| {
            LedgerError::invalid(format!("a certificate in {shown} is not a valid CA"))
                .with_source(err)
        })?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|err| LedgerError::invalid("cannot configure TLS").with_source(err))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// Whether rustls refused the server's certificate somewhere in the error's source chain
/// (tokio-rustls wraps rustls's error in an `io::Error`, whose `source` skips it).
pub(super) fn is_untrusted_certificate(err: &(dyn StdError + 'static)) -> bool {
    let refused = |err: &(dyn StdError + 'static)| {
        matches!(
            err.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidCertificate(_))
        )
    };
    let mut next = Some(err);
    while let Some(err) = next {
        if refused(err) {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && refused(inner)
        {
            return true;
        }
        next = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use idempotent_retry_ledger::LedgerErrorKind;

    #[test]
    fn a_missing_or_empty_ca_file_is_invalid_input() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("missing.pem");
        let Err(err) = trusting(&missing) else {
            panic!("a missing file is refused")
        };
        assert_eq!(err.kind(), LedgerErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains("cannot read the CA file"), "{err}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let Err(err) = trusting(&empty) else {
            panic!("an empty file is refused")
        };
        assert_eq!(err.kind(), LedgerErrorKind::InvalidInput, "{err}");
        assert!(
            err.to_string().ends_with("holds no PEM certificate"),
            "{err}"
        );
    }

    #[test]
    fn a_refused_certificate_is_found_inside_an_io_error() {
        let refused = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, refused);
        assert!(is_untrusted_certificate(&io));
        let other =
            std::io::Error::new(std::io::ErrorKind::InvalidData, rustls::Error::DecryptError);
        assert!(!is_untrusted_certificate(&other));
        assert!(!is_untrusted_certificate(&std::io::Error::other("reset")));
    }
}
