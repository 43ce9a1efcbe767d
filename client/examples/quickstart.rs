//! Creates the topic `quickstart`, publishes three records, reads them back with a long-poll
//! and prints the cluster's leader.
//!
//! Node URLs come from the arguments or from `RAFTQ_URL` (comma separated), defaulting to a
//! local three-node cluster; `RAFTQ_TOKEN` is sent as the API token when set.
//!
//! ```text
//! cargo run --release -p raftq-client --example quickstart -- http://127.0.0.1:7001
//! ```

use std::time::Duration;

use raftq_client::api::{ReadFrom, RecordIn, TopicConfig};
use raftq_client::{Client, ReadOptions};

const DEFAULT_URLS: &str = "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let joined = if args.is_empty() {
        std::env::var("RAFTQ_URL").unwrap_or_else(|_| DEFAULT_URLS.to_string())
    } else {
        args.join(",")
    };
    let urls: Vec<&str> = joined
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .collect();

    let mut builder = Client::builder(&urls);
    if let Ok(token) = std::env::var("RAFTQ_TOKEN") {
        builder = builder.token(token);
    }
    let client = builder.build()?;

    let created = client
        .create_topic("quickstart", &TopicConfig::default())
        .await?;
    println!(
        "topic quickstart {}",
        if created {
            "created"
        } else {
            "already existed"
        }
    );

    // No producer_id here, so a lost answer is reported as Error::Indeterminate rather than
    // retried (a retry could publish the records twice).
    let ack = client
        .publish_records(
            "quickstart",
            vec![
                RecordIn::text("hello").with_key("greeting"),
                RecordIn::text("from raftq").with_header("lang", "en"),
                RecordIn::binary(&[0xde, 0xad, 0xbe, 0xef]),
            ],
        )
        .await?;
    println!(
        "published offsets {}..={} (commit index {})",
        ack.first_offset, ack.last_offset, ack.commit_point.index
    );

    // A long-poll answers as soon as a record is there; loop in case it returns fewer.
    let mut next = ack.first_offset;
    while next <= ack.last_offset {
        let options = ReadOptions::new()
            .from(ReadFrom::Offset(next))
            .max(ack.last_offset - next + 1)
            .wait(Duration::from_secs(5));
        let read = client.read("quickstart", &options).await?;
        if read.records.is_empty() {
            return Err("the published records did not come back within the wait".into());
        }
        for record in &read.records {
            match record.value_str() {
                Some(text) => println!("  #{} key={:?} {text:?}", record.offset, record.key),
                None => println!(
                    "  #{} key={:?} {} binary bytes",
                    record.offset,
                    record.key,
                    record.value.len()
                ),
            }
        }
        next = read.next_offset;
    }

    let cluster = client.cluster().await?;
    match (cluster.leader_id, cluster.leader_url) {
        (Some(id), Some(url)) => println!("leader: node {id} at {url} (term {})", cluster.term),
        (Some(id), None) => println!("leader: node {id} (term {})", cluster.term),
        _ => println!("no leader right now (term {})", cluster.term),
    }
    Ok(())
}
