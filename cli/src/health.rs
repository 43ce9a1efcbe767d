//! `raftq health`: asks one node whether it is alive (`/healthz`) or ready (`/readyz`), for
//! container health checks and scripts. Exit status 0 when the node answers 200, 1 otherwise.
//! The probes are open (no token), and this command talks to the one node given.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The node's base URL.
    #[arg(
        long,
        default_value = "http://127.0.0.1:7001",
        env = "RAFTQ_HEALTH_URL"
    )]
    pub url: String,
    /// Ask whether the node is ready (has a leader and has applied up to it), not only alive.
    #[arg(long)]
    pub ready: bool,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 2)]
    pub timeout_secs: u64,
    /// PEM CA certificates to trust for an `https://` node, instead of the system's.
    #[arg(long, value_name = "FILE", env = "RAFTQ_CA_FILE")]
    pub ca_file: Option<PathBuf>,
}

pub fn health(args: HealthArgs) -> ExitCode {
    match probe(&args) {
        Ok(200) => {
            println!("ok");
            ExitCode::SUCCESS
        }
        Ok(status) => {
            eprintln!("raftq: {} answered {status}", target(&args));
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("raftq: {}: {e:#}", target(&args));
            ExitCode::from(1)
        }
    }
}

fn target(args: &HealthArgs) -> String {
    let path = if args.ready { "readyz" } else { "healthz" };
    format!("{}/{path}", args.url.trim_end_matches('/'))
}

fn probe(args: &HealthArgs) -> anyhow::Result<u16> {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .timeout(Duration::from_secs(args.timeout_secs.max(1)));
    if let Some(ca) = &args.ca_file {
        builder = builder.tls_built_in_root_certs(false);
        for cert in read_certs(ca)? {
            builder = builder.add_root_certificate(cert);
        }
    }
    let http = builder.build()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let status = runtime.block_on(async { http.get(target(args)).send().await })?;
    Ok(status.status().as_u16())
}

/// Every certificate of a PEM file, with a message naming the file when it has none.
fn read_certs(path: &std::path::Path) -> anyhow::Result<Vec<reqwest::Certificate>> {
    use anyhow::Context as _;
    let pem = std::fs::read(path)
        .with_context(|| format!("cannot read the certificate file {}", path.display()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .with_context(|| format!("{}: not a PEM certificate file", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!(
            "{}: no certificate in it (expected PEM \"BEGIN CERTIFICATE\" blocks)",
            path.display()
        );
    }
    Ok(certs)
}
