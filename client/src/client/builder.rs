//! A [`Client`]'s options and their checks.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderValue;

use super::{
    Client, PublishFormat, ReadFormat, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DEADLINE,
    DEFAULT_REQUEST_TIMEOUT,
};
use crate::error::Error;
use crate::transport::{base_url, Transport};

/// Options of a [`Client`], from [`Client::builder`].
#[derive(Clone)]
pub struct ClientBuilder {
    urls: Vec<String>,
    token: Option<String>,
    /// PEM CA certificates to trust instead of the system's.
    ca_pem: Option<Vec<u8>>,
    deadline: Duration,
    request_timeout: Duration,
    connect_timeout: Duration,
    publish_format: PublishFormat,
    read_format: ReadFormat,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("urls", &self.urls)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .field("deadline", &self.deadline)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("publish_format", &self.publish_format)
            .field("read_format", &self.read_format)
            .finish()
    }
}

impl ClientBuilder {
    /// An API token, sent as `Authorization: Bearer <token>` on every request, including the
    /// re-sends that follow a leader redirect (the redirect names another cluster node).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Trust these PEM CA certificates (one or more) for `https://` nodes, instead of the
    /// system's CA certificates: a node whose certificate they did not sign is refused.
    /// Without this, `https://` nodes need a certificate the system trusts.
    pub fn ca_cert_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// [`ClientBuilder::ca_cert_pem`] from a file.
    pub fn ca_file(self, path: impl AsRef<std::path::Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let pem = std::fs::read(path).map_err(|err| {
            Error::InvalidArgument(format!("cannot read the CA file {}: {err}", path.display()))
        })?;
        Ok(self.ca_cert_pem(pem))
    }

    /// Total time budget of one call across all its attempts, redirects and pauses
    /// (default 30 s). A long-poll read gets its wait on top.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Time-out of one HTTP attempt (default 10 s). A long-poll read gets its wait on top.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Time allowed to open a connection (default 2 s, never more than the request time-out).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How publishes are sent: Kafka record batches (the default) or JSON, for a server that
    /// predates the record batch format.
    pub fn publish_format(mut self, format: PublishFormat) -> Self {
        self.publish_format = format;
        self
    }

    /// How reads and pulls ask for records: as record batches (the default; a server that
    /// predates them answers JSON anyway) or as JSON.
    pub fn read_format(mut self, format: ReadFormat) -> Self {
        self.read_format = format;
        self
    }

    /// Checks the options and builds the client. Nothing is sent yet.
    pub fn build(self) -> Result<Client, Error> {
        if self.urls.is_empty() {
            return Err(Error::InvalidArgument(
                "at least one node URL is needed".to_string(),
            ));
        }
        let mut urls = Vec::with_capacity(self.urls.len());
        for raw in &self.urls {
            let url = base_url(raw)?;
            if !urls.contains(&url) {
                urls.push(url);
            }
        }
        if self.deadline.is_zero() || self.request_timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "the deadline and the request time-out must be positive".to_string(),
            ));
        }
        let authorization = match self.token {
            None => None,
            Some(token) => {
                let mut value =
                    HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                        Error::InvalidArgument(
                            "the token contains characters not allowed in an HTTP header"
                                .to_string(),
                        )
                    })?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        let mut http = reqwest::Client::builder().use_rustls_tls();
        if let Some(pem) = &self.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|err| {
                Error::InvalidArgument(format!("the CA certificates are not valid PEM: {err}"))
            })?;
            if certs.is_empty() {
                return Err(Error::InvalidArgument(
                    "no CA certificate in the given PEM (expected \"BEGIN CERTIFICATE\" blocks)"
                        .to_string(),
                ));
            }
            http = http.tls_built_in_root_certs(false);
            for cert in certs {
                http = http.add_root_certificate(cert);
            }
        }
        let http = http
            // Redirects are followed by the transport, which re-sends the body, remembers the
            // leader and keeps the token (reqwest would drop a POST body on some redirects).
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(self.connect_timeout.min(self.request_timeout))
            .user_agent(concat!("raftq-client/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| {
                Error::InvalidArgument(format!("cannot build the HTTP client: {err}"))
            })?;
        Ok(Client {
            transport: Arc::new(Transport::new(
                http,
                urls,
                authorization,
                self.deadline,
                self.request_timeout,
            )),
            publish_format: self.publish_format,
            read_format: self.read_format,
            json_only: Arc::default(),
        })
    }
}

impl Client {
    /// A builder for a client with a token or other time limits.
    pub fn builder(urls: impl IntoIterator<Item = impl AsRef<str>>) -> ClientBuilder {
        ClientBuilder {
            urls: urls
                .into_iter()
                .map(|url| url.as_ref().to_string())
                .collect(),
            token: None,
            ca_pem: None,
            deadline: DEFAULT_DEADLINE,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            publish_format: PublishFormat::default(),
            read_format: ReadFormat::default(),
        }
    }
}
