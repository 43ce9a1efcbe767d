//! `raftq backup` and `raftq restore` against real nodes: a backup taken beside a running
//! node, every disk of the cluster lost, the cluster restored from the backup with exactly the
//! backed-up state (records, subscription progress and leases, producer sequences), electing
//! leaders and taking writes afterwards; and the same backup restored into a one-node cluster
//! with other addresses and another cluster id. Restores refuse what they must.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, Cluster, BIN, CLUSTER_ID, SECRET};
use raftq_client::api::PublishResponse;
use serde_json::{json, Value};

fn run(cmd: &mut Command) -> Output {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RAFTQ_") {
            cmd.env_remove(name);
        }
    }
    cmd.output().expect("run raftq")
}

fn stdout_json(out: &Output) -> Value {
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
}

/// `raftq backup --data DATA --out FILE`.
fn backup_command(data: &Path, out: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("backup")
        .arg("--data")
        .arg(data)
        .arg("--out")
        .arg(out);
    cmd
}

/// `raftq restore --from FILE` with the node's own `serve` flags.
fn restore_command(c: &Cluster, id: u64, from: &Path) -> Command {
    let serve = c.serve_command(id, c.port(id), &c.data_dir(id), CLUSTER_ID);
    let mut cmd = Command::new(BIN);
    cmd.arg("restore")
        .arg("--from")
        .arg(from)
        .arg("--json")
        .args(serve.get_args().skip(1));
    cmd
}

async fn publish_idempotent(c: &Cluster, producer: &str, sequence: u64) -> PublishResponse {
    let records: Vec<Value> = (0..10)
        .map(|i| json!({"value": format!("p-{i}")}))
        .collect();
    let body = json!({"records": records, "producer_id": producer, "sequence": sequence});
    let out = c
        .leader_json(reqwest::Method::POST, "/v1/topics/orders/records", body)
        .await;
    serde_json::from_value(out).expect("a publish answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_restored_from_a_backup_has_exactly_the_backed_up_state_and_goes_on() {
    let c = Cluster::start(3).await;
    c.create_topic("orders").await;
    c.subscribe_from_first("orders", "billing").await;
    let first = publish_idempotent(&c, "p1", 0).await;
    assert_eq!((first.first_offset, first.duplicate), (0, false));
    c.publish_values(
        "orders",
        &(0..5).map(|i| format!("v-{i}")).collect::<Vec<_>>(),
    )
    .await;
    // Pull 4, ack the first 2: 2 stay in flight.
    c.pull_and_ack("orders", "billing", 4, 2).await;
    c.wait_converged("orders").await;
    // A later term than the first: the restored cluster's first election must go above it.
    let first_leader = c.leader_id().await;
    let to = c.ids().into_iter().find(|id| *id != first_leader).unwrap();
    c.leader_json(
        reqwest::Method::POST,
        "/v1/cluster/transfer-leader",
        json!({"to": to}),
    )
    .await;
    c.publish_values("orders", &["v-5".into()]).await;
    c.wait_converged("orders").await;
    let leader = c.leader_id().await;
    let status: Value = c.get_json(leader, "/v1/cluster").await;
    let backed_up_term = status["term"].as_u64().expect("term");
    assert!(backed_up_term > 1, "{status}");

    // A snapshot on the leader, then the backup, beside the running node.
    c.leader_json(reqwest::Method::POST, "/v1/cluster/snapshot", json!({}))
        .await;
    let dir = tempfile::tempdir().expect("backup dir");
    let file = dir.path().join("orders.snap");
    let backup = stdout_json(&run(
        backup_command(&c.data_dir(leader), &file).arg("--json")
    ));
    assert!(backup["index"].as_u64().unwrap() > 0, "{backup}");
    assert!(backup["bytes"].as_u64().unwrap() > 0, "{backup}");
    // A backup never overwrites.
    let again = run(&mut backup_command(&c.data_dir(leader), &file));
    assert_eq!(again.status.code(), Some(1), "{again:?}");

    let records = c.read_all(leader, "orders").await;
    assert_eq!(records.len(), 16);
    let sub_before: Value = c
        .get_json(leader, "/v1/topics/orders/subscriptions/billing")
        .await;
    assert_eq!(sub_before["acked"], 2);
    assert_eq!(sub_before["in_flight"], 2);
    // Written after the backup: a restore is of the backup's moment, so this one is gone.
    c.publish_values("orders", &["after-the-backup".into()])
        .await;

    // Every disk is lost.
    c.kill_all();
    for id in c.ids() {
        std::fs::remove_dir_all(c.data_dir(id)).expect("wipe the data directory");
    }

    // A damaged backup is refused and leaves nothing behind.
    let bytes = std::fs::read(&file).expect("read the backup");
    let damaged = dir.path().join("damaged.snap");
    std::fs::write(&damaged, &bytes[..bytes.len() - 100]).expect("write a damaged copy");
    let refused = run(&mut restore_command(&c, 1, &damaged));
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not a whole raftq snapshot"),
        "{refused:?}"
    );
    assert!(
        !c.data_dir(1).exists(),
        "a refused restore made a data directory"
    );

    for id in c.ids() {
        let restored = stdout_json(&run(&mut restore_command(&c, id, &file)));
        assert_eq!(restored["index"], backup["index"], "{restored}");
        assert_eq!(restored["records"], 16, "{restored}");
        assert_eq!(restored["subscriptions"], 1, "{restored}");
        assert_eq!(restored["voters"], json!([1, 2, 3]), "{restored}");
    }
    // A restore never writes over a data directory.
    let twice = run(&mut restore_command(&c, 1, &file));
    assert_eq!(twice.status.code(), Some(1), "{twice:?}");
    assert!(
        String::from_utf8_lossy(&twice.stderr).contains("is not empty"),
        "{twice:?}"
    );

    for id in c.ids() {
        c.restart(id).await;
    }
    let leader = c.wait_leader(Duration::from_secs(30)).await;
    c.wait_converged("orders").await;
    for id in c.ids() {
        assert_eq!(c.read_all(id, "orders").await, records, "node {id}");
    }
    let sub_after: Value = c
        .get_json(leader, "/v1/topics/orders/subscriptions/billing")
        .await;
    for field in ["cursor", "backlog", "in_flight", "delivered", "acked"] {
        assert_eq!(sub_after[field], sub_before[field], "{field}: {sub_after}");
    }
    // The producer's sequence survived: its first batch is a duplicate, with its offsets.
    let resent = publish_idempotent(&c, "p1", 0).await;
    assert!(resent.duplicate);
    assert_eq!(
        (resent.first_offset, resent.last_offset),
        (first.first_offset, first.last_offset)
    );
    let next = c.publish_values("orders", &["restored".into()]).await;
    assert_eq!(next.first_offset, 16);
    let status: Value = c.get_json(leader, "/v1/cluster").await;
    assert!(
        status["term"].as_u64().expect("term") > backed_up_term,
        "{status}"
    );

    // The restored cluster elects a new leader when its leader dies, and goes on.
    c.kill(leader);
    let new_leader = c.wait_leader(Duration::from_secs(30)).await;
    assert_ne!(new_leader, leader);
    let more = c.publish_values("orders", &["after-failover".into()]).await;
    assert_eq!(more.first_offset, 17);
    c.restart(leader).await;
    c.wait_converged("orders").await;
    assert_eq!(c.read_all(leader, "orders").await.len(), 18);

    // The same backup, restored into a one-node cluster at another address and under another
    // cluster id: its only voter is itself, so it leads alone.
    let port = free_port();
    let data = dir.path().join("solo");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).expect("write the secret");
    let serve_args = |cmd: &mut Command| {
        cmd.args(["--id", "7", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data")
            .arg(&data)
            .arg("--peers")
            .arg(format!("7=http://127.0.0.1:{port}"))
            .arg("--cluster-id")
            .arg("restored-copy")
            .arg("--cluster-secret-file")
            .arg(&secret);
    };
    let mut restore = Command::new(BIN);
    restore.args(["restore", "--json", "--from"]).arg(&file);
    serve_args(&mut restore);
    let solo = stdout_json(&run(&mut restore));
    assert_eq!(solo["voters"], json!([7]));
    let mut serve = Command::new(BIN);
    serve.arg("serve");
    serve_args(&mut serve);
    let log = std::fs::File::create(dir.path().join("solo.log")).expect("log file");
    let mut child = serve
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("start the restored node");
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    // Its only voter is itself: it elects itself.
    loop {
        let leader = async {
            let resp = reqwest::get(format!("{url}/v1/cluster")).await.ok()?;
            let status: Value = resp.json().await.ok()?;
            status["leader_id"].as_u64()
        }
        .await;
        if leader == Some(7) {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let log = std::fs::read_to_string(dir.path().join("solo.log")).unwrap_or_default();
            panic!("the one-node restore never led (leader {leader:?}); its log:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let read: Value = reqwest::get(format!("{url}/v1/topics/orders/records?from=first&max=100"))
        .await
        .expect("read")
        .json()
        .await
        .expect("read JSON");
    assert_eq!(read["records"].as_array().map(Vec::len), Some(16), "{read}");
    let status: Value = reqwest::get(format!("{url}/v1/cluster"))
        .await
        .expect("cluster status")
        .json()
        .await
        .expect("cluster status JSON");
    assert_eq!(
        status["members"].as_array().map(Vec::len),
        Some(1),
        "{status}"
    );
    // And it takes writes, after the restored offsets.
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/topics/orders/records"))
        .json(&json!({"records": [{"value": "solo"}]}))
        .send()
        .await
        .expect("publish to the restored node");
    assert_eq!(resp.status().as_u16(), 200);
    let published: PublishResponse = resp.json().await.expect("publish answer");
    assert_eq!(published.first_offset, 16);
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_refuses_an_id_the_backed_up_cluster_removed() {
    let c = Cluster::start_with_spares(3, 1, &[]).await;
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    c.restart(4).await;
    let resp = c
        .send(
            c.http()
                .post(format!("{}/v1/cluster/nodes", c.url(leader)))
                .json(&json!({"id": 4, "url": c.url(4)})),
            "add node 4",
        )
        .await;
    assert_eq!(resp.status().as_u16(), 200, "{:?}", resp.text().await);
    let resp = c
        .call(reqwest::Method::DELETE, leader, "/v1/cluster/nodes/4")
        .await;
    assert_eq!(resp.status().as_u16(), 200, "{:?}", resp.text().await);
    c.kill(4);
    c.leader_json(reqwest::Method::POST, "/v1/cluster/snapshot", json!({}))
        .await;
    let dir = tempfile::tempdir().expect("backup dir");
    let file = dir.path().join("b.snap");
    stdout_json(&run(
        backup_command(&c.data_dir(leader), &file).arg("--json")
    ));
    let secret = dir.path().join("secret");
    std::fs::write(&secret, SECRET).expect("write the secret");
    let data = dir.path().join("restored");
    let restore = |peers: &str| {
        run(Command::new(BIN)
            .args(["restore", "--id", "1", "--listen", "127.0.0.1:1"])
            .arg("--from")
            .arg(&file)
            .arg("--data")
            .arg(&data)
            .args(["--peers", peers, "--cluster-secret-file"])
            .arg(&secret))
    };
    let refused = restore("1=http://127.0.0.1:1,4=http://127.0.0.1:4");
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("node id 4 was removed"),
        "{refused:?}"
    );
    assert!(!data.exists(), "a refused restore left {}", data.display());
    // Other ids are fine.
    let ok = restore("1=http://127.0.0.1:1,5=http://127.0.0.1:5");
    assert!(ok.status.success(), "{ok:?}");
}
