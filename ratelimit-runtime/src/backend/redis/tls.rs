//! TLS (feature `tls`): rustls, with the `ring` provider installed as the
//! process's default unless the application installed one.

/// Installs rustls's `ring` provider as the process default, once, unless
/// one is installed (a client you configured may need one too).
pub(super) fn install_provider() {
    #[cfg(feature = "tls")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            if rustls::crypto::CryptoProvider::get_default().is_none() {
                let _ = rustls::crypto::ring::default_provider().install_default();
            }
        });
    }
}

/// Certificates that trust the authority `root_pem` (PEM).
#[cfg(feature = "tls")]
pub(super) fn certificates(root_pem: &[u8]) -> redis::TlsCertificates {
    install_provider();
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root_pem.to_vec()),
    }
}
