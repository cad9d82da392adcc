//! Native TLS for weft's listeners (`[http] tls_cert` / `tls_key`), so a
//! small deployment can be reached over a network without a reverse proxy
//! in front: API keys travel in headers and must not cross it in clear.
//!
//! rustls with the `ring` provider; TLS 1.2 and 1.3; ALPN offers
//! `http/1.1` only (weft's server loop speaks HTTP/1.1). The certificate
//! file is a PEM chain (leaf first), the key file a PEM private key (PKCS#8,
//! PKCS#1 or SEC1). Both are read once at start: renewing a certificate
//! means restarting weft.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// Builds the acceptor every connection of a TLS listener goes through,
/// from a PEM certificate chain and its private key.
///
/// Errors name the file at fault: missing, unreadable, holding no
/// certificate or key, or a key that does not match the certificate.
pub fn acceptor(cert_path: &Path, key_path: &Path) -> anyhow::Result<TlsAcceptor> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .with_context(|| format!("reading the TLS certificate {}", cert_path.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing the TLS certificate {}", cert_path.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "the TLS certificate file {} holds no PEM certificate",
        cert_path.display()
    );
    let key = PrivateKeyDer::from_pem_file(key_path)
        .with_context(|| format!("reading the TLS private key {}", key_path.display()))?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .context("choosing TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .with_context(|| {
            format!(
                "the TLS private key {} does not fit the certificate {}",
                key_path.display(),
                cert_path.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed() -> rcgen::CertifiedKey<rcgen::KeyPair> {
        rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("a certificate")
    }

    #[test]
    fn a_matching_certificate_and_key_make_an_acceptor() {
        let dir = tempfile::tempdir().unwrap();
        let made = self_signed();
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        acceptor(&cert, &key).expect("an acceptor");
    }

    #[test]
    fn errors_name_the_file_at_fault() {
        let dir = tempfile::tempdir().unwrap();
        let made = self_signed();
        let other = self_signed();
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let other_key = dir.path().join("other-key.pem");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        std::fs::write(&other_key, other.signing_key.serialize_pem()).unwrap();
        std::fs::write(&empty, "").unwrap();

        let missing = dir.path().join("missing.pem");
        let e = format!("{:#}", acceptor(&missing, &key).err().unwrap());
        assert!(e.contains("missing.pem"), "{e}");
        let e = format!("{:#}", acceptor(&empty, &key).err().unwrap());
        assert!(e.contains("holds no PEM certificate"), "{e}");
        let e = format!("{:#}", acceptor(&cert, &empty).err().unwrap());
        assert!(e.contains("empty.pem"), "{e}");
        let e = format!("{:#}", acceptor(&cert, &other_key).err().unwrap());
        assert!(e.contains("does not fit"), "{e}");
    }
}
