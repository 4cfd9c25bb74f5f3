//! The TLS the gateway speaks to agents: trust anchors besides the bundled
//! web PKI roots (agents behind an organisation's own CA), and the client
//! certificate it presents to agents that ask for one (mutual TLS, A2A's
//! `mtlsSecurityScheme`).
//!
//! The files are read when the gateway starts, so a missing or broken file
//! stops the node with its name rather than failing calls later, and again
//! whenever they change (as the listeners' certificates are), so a
//! certificate that cert-manager or an operator rotates is presented
//! without a restart. A rotation that does not load keeps the previous
//! material and logs why.

use std::path::PathBuf;

/// A TLS file's bytes; the error names the file.
fn read(p: &PathBuf) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
}

/// The files one outbound client is built from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_file: Option<PathBuf>,
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
}

/// What the files hold, ready for the HTTP client.
#[derive(Default)]
pub struct TlsMaterial {
    pub roots: Vec<reqwest::Certificate>,
    pub identity: Option<reqwest::Identity>,
}

impl TlsFiles {
    /// The same trust with another client certificate.
    pub fn presenting(&self, cert: PathBuf, key: PathBuf) -> Self {
        Self {
            ca_file: self.ca_file.clone(),
            client_cert_file: Some(cert),
            client_key_file: Some(key),
        }
    }

    /// The files whose changes a client is rebuilt for.
    pub fn paths(&self) -> Vec<PathBuf> {
        [&self.ca_file, &self.client_cert_file, &self.client_key_file]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// The same trust (the web PKI's roots and the CA file) and client
    /// certificate for a gRPC channel, whose TLS is tonic's.
    pub fn grpc(&self) -> Result<tonic::transport::ClientTlsConfig, String> {
        let mut tls = tonic::transport::ClientTlsConfig::new().with_webpki_roots();
        if let Some(ca) = &self.ca_file {
            tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.client_cert_file, &self.client_key_file) {
            tls = tls.identity(tonic::transport::Identity::from_pem(
                read(cert)?,
                read(key)?,
            ));
        }
        Ok(tls)
    }

    /// Reads and parses every file; an error names the file and what is
    /// wrong with it.
    pub fn load(&self) -> Result<TlsMaterial, String> {
        let roots = match &self.ca_file {
            Some(p) => {
                let roots = reqwest::Certificate::from_pem_bundle(&read(p)?)
                    .map_err(|e| format!("{}: {}", p.display(), crate::error_chain(&e)))?;
                if roots.is_empty() {
                    return Err(format!("{}: no PEM certificate in the file", p.display()));
                }
                roots
            }
            None => Vec::new(),
        };
        let identity = match (&self.client_cert_file, &self.client_key_file) {
            (Some(cert), Some(key)) => {
                // reqwest reads the certificate chain and the key from one
                // PEM document.
                let mut pem = read(cert)?;
                pem.push(b'\n');
                pem.extend(read(key)?);
                let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
                    format!(
                        "{} with {}: {}",
                        cert.display(),
                        key.display(),
                        crate::error_chain(&e)
                    )
                })?;
                Some(id)
            }
            _ => None,
        };
        Ok(TlsMaterial { roots, identity })
    }
}
