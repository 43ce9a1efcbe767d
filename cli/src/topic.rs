//! `raftq topic`: create, list, describe and delete topics.

use std::io::{self, Write as _};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use raftq_client::api::{Retention, TopicConfig, TopicSummary};

use super::{block_on, connect, json_text, table, Connection, Failure};

/// `raftq topic`.
#[derive(Debug, Clone, Args)]
pub struct TopicArgs {
    #[command(subcommand)]
    pub command: TopicCmd,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, Subcommand)]
pub enum TopicCmd {
    /// Create a topic (nothing changes if it exists with the same settings).
    Create {
        name: String,
        /// Remove records at least this old, in ms.
        #[arg(long)]
        max_age_ms: Option<u64>,
        /// Keep the stored bytes at or below this.
        #[arg(long)]
        max_bytes: Option<u64>,
        /// Keep at most this many records.
        #[arg(long)]
        max_records: Option<u64>,
        /// Work queue: remove records every subscription has acked.
        #[arg(long)]
        until_acked: bool,
        /// Largest record (value, key and headers), in bytes.
        #[arg(long)]
        max_record_bytes: Option<u64>,
        /// Print the topic as JSON once created.
        #[arg(long)]
        json: bool,
    },
    /// Every topic with its offsets, records, bytes and subscriptions.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One topic: offsets, counts and settings.
    Info {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete a topic, its records and its subscriptions.
    Delete { name: String },
}

/// Runs `raftq topic`.
pub fn topic(args: TopicArgs) -> ExitCode {
    block_on(run(args))
}

async fn run(args: TopicArgs) -> Result<(), Failure> {
    let client = connect(&args.connection)?;
    let text = match args.command {
        TopicCmd::Create {
            name,
            max_age_ms,
            max_bytes,
            max_records,
            until_acked,
            max_record_bytes,
            json,
        } => {
            let config = TopicConfig {
                retention: Retention {
                    max_age_ms,
                    max_bytes,
                    max_records,
                    until_acked,
                },
                max_record_bytes,
            };
            let created = client.create_topic(&name, &config).await?;
            if json {
                json_text(&client.topic(&name).await?)?
            } else if created {
                format!("topic {name} created\n")
            } else {
                format!("topic {name} already exists with these settings\n")
            }
        }
        TopicCmd::List { json: true } => json_text(&serde_json::json!({
            "topics": client.list_topics().await?
        }))?,
        TopicCmd::List { json: false } => topics_table(&client.list_topics().await?),
        TopicCmd::Info { name, json: true } => json_text(&client.topic(&name).await?)?,
        TopicCmd::Info { name, json: false } => {
            let info = client.topic(&name).await?;
            let r = info.config.retention;
            let setting = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
            format!(
                "{}retention: max_age_ms {}, max_bytes {}, max_records {}, until_acked {}\n\
                 max_record_bytes: {}\ncommit point: log index {}\n",
                topics_table(std::slice::from_ref(&info.summary)),
                setting(r.max_age_ms),
                setting(r.max_bytes),
                setting(r.max_records),
                r.until_acked,
                setting(info.config.max_record_bytes),
                info.commit_point.index,
            )
        }
        TopicCmd::Delete { name } => {
            client.delete_topic(&name).await?;
            format!("topic {name} deleted\n")
        }
    };
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(Failure::Output)
}

fn topics_table(topics: &[TopicSummary]) -> String {
    if topics.is_empty() {
        return "no topics\n".to_string();
    }
    let rows: Vec<Vec<String>> = topics
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.first_offset.to_string(),
                t.next_offset.to_string(),
                t.records.to_string(),
                t.bytes.to_string(),
                t.subscriptions.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "topic",
            "first",
            "next",
            "records",
            "bytes",
            "subscriptions",
        ],
        &rows,
        1,
    )
}
