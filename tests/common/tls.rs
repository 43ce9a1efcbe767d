//! A certificate authority made at test time, for TLS clusters.

use std::path::{Path, PathBuf};

/// A certificate authority made at test time, and the files of one server certificate it
/// signed for `127.0.0.1` and `localhost`.
pub struct TestCa {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    /// A new CA (its own key) and a server certificate signed by it.
    pub fn new(name: &str) -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate().expect("generate the CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        let ca = ca_params.self_signed(&ca_key).expect("self-sign the CA");
        let key = KeyPair::generate().expect("generate the server key");
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} node"));
        let cert = params
            .signed_by(&key, &ca, &ca_key)
            .expect("sign the server certificate");
        TestCa {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Writes `ca.pem`, `node.pem` and `node.key` into `dir`, returning their paths.
    pub fn write(&self, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let paths = (
            dir.join("ca.pem"),
            dir.join("node.pem"),
            dir.join("node.key"),
        );
        std::fs::write(&paths.0, &self.ca_pem).expect("write ca.pem");
        std::fs::write(&paths.1, &self.cert_pem).expect("write node.pem");
        std::fs::write(&paths.2, &self.key_pem).expect("write node.key");
        paths
    }
}
