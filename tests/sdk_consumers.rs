//! The SDK's consumers against a real cluster whose leader is SIGKILLed while they run: the
//! `Subscriber` handles every record and acks it, the `Reader` sees every record once, in
//! order, and neither notices the failovers beyond a pause.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Cluster;
use raftq_client::api::{SubscriptionConfig, SubscriptionStart};
use raftq_client::{Reader, Subscriber, SubscriberOptions};

const RECORDS: usize = 600;

async fn fill(c: &Cluster, topic: &str) {
    c.create_topic(topic).await;
    for batch in 0..RECORDS / 100 {
        let values: Vec<String> = (0..100)
            .map(|i| format!("{topic}/{}", batch * 100 + i))
            .collect();
        c.publish_values(topic, &values).await;
    }
}

/// Kills the leader when `progress` reaches each mark, and restarts it once a new leader is
/// elected. Returns the ids it killed.
async fn kill_leader_at(c: &Cluster, progress: &AtomicUsize, marks: &[usize]) -> Vec<u64> {
    let mut killed = Vec::new();
    for &mark in marks {
        c.wait_for(
            &format!("{mark} records handled"),
            Duration::from_secs(60),
            || async {
                let n = progress.load(Ordering::SeqCst);
                if n >= mark {
                    Ok(())
                } else {
                    Err(format!("{n} handled"))
                }
            },
        )
        .await;
        let leader = c.leader_id().await;
        c.kill(leader);
        killed.push(leader);
        let new = c.wait_leader(Duration::from_secs(20)).await;
        assert_ne!(new, leader);
        c.restart(leader).await;
    }
    killed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_handles_everything_through_two_leader_kills() {
    let c = Cluster::start(3).await;
    fill(&c, "sdk").await;
    let client = c.client();
    let config = SubscriptionConfig {
        start: SubscriptionStart::First,
        ack_timeout_ms: Some(3_000),
        ..Default::default()
    };
    client
        .create_subscription("sdk", "workers", &config)
        .await
        .unwrap_or_else(|e| c.fail(&e.to_string()));

    let handled: Arc<Mutex<BTreeMap<u64, u32>>> = Arc::default();
    let progress = Arc::new(AtomicUsize::new(0));
    let options = SubscriberOptions::new().concurrency(4);
    let subscriber = Subscriber::new(client.clone(), "sdk", "workers", options)
        .unwrap_or_else(|e| c.fail(&e.to_string()));
    let stop = subscriber.stop_handle();
    let run = {
        let handled = handled.clone();
        let progress = progress.clone();
        tokio::spawn(subscriber.run(move |message| {
            let handled = handled.clone();
            let progress = progress.clone();
            async move {
                // Slow enough that consumption spans both kills.
                tokio::time::sleep(Duration::from_millis(10)).await;
                *handled
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(message.offset)
                    .or_default() += 1;
                progress.fetch_add(1, Ordering::SeqCst);
                Ok::<(), String>(())
            }
        }))
    };

    let killed = kill_leader_at(&c, &progress, &[RECORDS / 3, 2 * RECORDS / 3]).await;

    // Done when the cluster says every record is acked.
    let cl = &c;
    let client_ref = &client;
    c.wait_for(
        "the subscription to be fully acked",
        Duration::from_secs(60),
        move || async move {
            let info = client_ref
                .subscription("sdk", "workers")
                .await
                .map_err(|e| e.to_string())?;
            if info.cursor == RECORDS as u64 && info.in_flight == 0 {
                Ok(())
            } else {
                Err(format!("{info:?}"))
            }
        },
    )
    .await;
    stop.stop();
    let report = match run.await.expect("subscriber task") {
        Ok(report) => report,
        Err(e) => cl.fail(&format!("the subscriber stopped on an error: {e:?}")),
    };

    let handled = handled.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let missing: Vec<u64> = (0..RECORDS as u64)
        .filter(|o| !handled.contains_key(o))
        .collect();
    assert!(missing.is_empty(), "never handled: {missing:?}");
    assert_eq!(
        handled.len(),
        RECORDS,
        "handled offsets outside the topic: {handled:?}"
    );
    assert!(
        report.acked as usize + report.stale as usize >= RECORDS,
        "{report:?}"
    );
    assert!(
        report.released_on_stop.is_empty() && report.unsettled.is_empty(),
        "{report:?}"
    );
    // Every node agrees: cursor at the end, nothing in flight, every record acked once.
    for id in c.ids() {
        let info = c
            .get_json::<raftq_client::api::SubscriptionInfo>(
                id,
                "/v1/topics/sdk/subscriptions/workers",
            )
            .await;
        assert_eq!(
            (info.cursor, info.in_flight),
            (RECORDS as u64, 0),
            "node {id}: {info:?}"
        );
        assert_eq!(
            info.acked, RECORDS as u64,
            "node {id}: one ack per record: {info:?}"
        );
    }
    let again: usize = handled.values().map(|n| *n as usize - 1).sum();
    eprintln!("killed leaders {killed:?}; {again} records handled twice (lost acks or expired leases); {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_sees_every_record_once_in_order_through_a_leader_kill() {
    let c = Cluster::start(3).await;
    fill(&c, "stream").await;
    let client = c.client();
    let config = SubscriptionConfig {
        start: SubscriptionStart::First,
        ..Default::default()
    };
    client
        .create_subscription("stream", "readers", &config)
        .await
        .unwrap_or_else(|e| c.fail(&e.to_string()));
    let mut reader = Reader::new(client.clone(), "stream", "readers")
        .unwrap_or_else(|e| c.fail(&e.to_string()))
        .max(50)
        .wait(Duration::from_secs(1));

    let mut seen: Vec<u64> = Vec::new();
    let mut killed = None;
    while seen.len() < RECORDS {
        let batch = reader
            .next_batch()
            .await
            .unwrap_or_else(|e| c.fail(&format!("reader: {e}")));
        seen.extend(batch.records.iter().map(|r| r.offset));
        if killed.is_none() && seen.len() >= RECORDS / 2 {
            let leader = c.leader_id().await;
            c.kill(leader);
            killed = Some(leader);
        }
    }
    assert_eq!(
        seen,
        (0..RECORDS as u64).collect::<Vec<_>>(),
        "every record once, in order"
    );
    reader
        .commit()
        .await
        .unwrap_or_else(|e| c.fail(&format!("commit: {e}")));
    let info = client
        .subscription("stream", "readers")
        .await
        .unwrap_or_else(|e| c.fail(&e.to_string()));
    assert_eq!(
        info.cursor, RECORDS as u64,
        "the cursor follows what was read: {info:?}"
    );
    assert!(killed.is_some());
}
