//! TLS against real nodes: a cluster whose every port serves TLS (client API and Raft RPC)
//! forms, replicates, elects a new leader after a SIGKILL and serves the SDK and the CLI; a
//! client that does not trust the cluster's CA, or that speaks plain HTTP, gets nothing.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Cluster, TestCa, BIN};
use raftq_client::api::{PublishRequest, RecordIn};
use raftq_client::{Client, Error, ReadOptions};

fn values(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn batch(values: &[String]) -> PublishRequest {
    PublishRequest {
        records: values.iter().map(|v| RecordIn::text(v.as_str())).collect(),
        producer_id: None,
        sequence: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_forms_replicates_and_refuses_untrusting_clients() {
    let ca = TestCa::new("raftq");
    let cluster = Cluster::start_with_tls(3, &ca).await;
    assert!(cluster.url(1).starts_with("https://"));

    // The SDK, trusting the CA and knowing only a follower, is redirected to the leader.
    let follower = cluster.follower_id().await;
    let client = cluster.client_for(&[cluster.url(follower)]);
    client
        .create_topic("secure", &Default::default())
        .await
        .unwrap_or_else(|e| cluster.fail(&format!("create over TLS: {e}")));
    let first = values("a", 20);
    client
        .publish("secure", &batch(&first))
        .await
        .unwrap_or_else(|e| cluster.fail(&format!("publish over TLS: {e}")));
    // Replicated to every node over TLS between nodes.
    cluster.wait_converged("secure").await;
    let log = cluster.consistent_log("secure").await;
    let got: Vec<_> = log
        .iter()
        .filter_map(|r| r.value_str().map(str::to_owned))
        .collect();
    assert_eq!(got, first);

    // A client that does not trust the CA is refused, whether it trusts the system's CAs or
    // another CA; nothing it sent was applied.
    let other = TestCa::new("other");
    let untrusting = [
        Client::builder([cluster.url(follower)]),
        Client::builder([cluster.url(follower)]).ca_cert_pem(other.ca_pem.clone()),
    ];
    for builder in untrusting {
        let client = builder
            .deadline(Duration::from_secs(2))
            .build()
            .expect("client");
        let err = client
            .publish("secure", &batch(&["never".to_string()]))
            .await
            .expect_err("a client that does not trust the CA must be refused");
        let text = err.to_string();
        assert!(
            matches!(err, Error::Unavailable { .. }) && text.contains("certificate"),
            "expected a certificate error, got: {text}"
        );
    }
    // Connections that never start their handshake hold nobody else up: with 50 of them open,
    // a client whose whole deadline is shorter than the handshake time-out is served.
    let mut silent = Vec::new();
    for _ in 0..50 {
        let conn = tokio::net::TcpStream::connect(("127.0.0.1", cluster.port(follower)))
            .await
            .expect("connect");
        silent.push(conn);
    }
    let hurried_client = cluster.client_for(&[cluster.url(follower)]);
    let options = ReadOptions::new().from_offset(0).max(1);
    let hurried = hurried_client.read("secure", &options);
    tokio::time::timeout(Duration::from_secs(3), hurried)
        .await
        .unwrap_or_else(|_| cluster.fail("a read waited behind silent TLS connections"))
        .unwrap_or_else(|e| cluster.fail(&format!("read beside silent connections: {e}")));
    drop(silent);

    // Plain HTTP to a TLS port gets no HTTP answer at all.
    let plain = reqwest::Client::new()
        .get(format!(
            "http://127.0.0.1:{}/v1/cluster",
            cluster.port(follower)
        ))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP got an answer: {plain:?}");

    // The CLI with --ca-file reads the topic's report; without it, it fails with the reason.
    let report = |ca: Option<&std::path::Path>| {
        let mut cmd = Command::new(BIN);
        cmd.arg("report")
            .arg("secure")
            .arg("--url")
            .arg(cluster.url(follower));
        cmd.env_remove("RAFTQ_CA_FILE")
            .env_remove("RAFTQ_TOKEN")
            .env_remove("RAFTQ_URL");
        if let Some(ca) = ca {
            cmd.arg("--ca-file").arg(ca);
        }
        cmd.output().expect("run raftq report")
    };
    let ok = report(cluster.tls_ca());
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success() && stdout.contains("secure"),
        "raftq report --ca-file failed: {ok:?}"
    );
    let refused = report(None);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("certificate"),
        "raftq report without the CA: {refused:?}"
    );

    // The leader is SIGKILLed: the others elect a new one over TLS, the SDK follows it, and
    // the old leader restarts and catches up.
    let leader = cluster.leader_id().await;
    cluster.kill(leader);
    let second = values("b", 20);
    let client = cluster.client();
    client
        .publish("secure", &batch(&second))
        .await
        .unwrap_or_else(|e| cluster.fail(&format!("publish after the leader's death: {e}")));
    cluster.restart(leader).await;
    cluster.wait_converged("secure").await;
    let log = cluster.consistent_log("secure").await;
    let got: Vec<_> = log
        .iter()
        .filter_map(|r| r.value_str().map(str::to_owned))
        .collect();
    assert_eq!(got, [first, second].concat());
    let read = client
        .read("secure", &ReadOptions::new().from_offset(0).max(100))
        .await
        .unwrap_or_else(|e| cluster.fail(&format!("read over TLS: {e}")));
    assert_eq!(read.records.len(), 40);
}
