//! `raftq sub`: create, list, describe and delete the subscriptions of a topic.

use std::io::{self, Write as _};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use raftq_client::api::{SubscriptionConfig, SubscriptionInfo, SubscriptionStart};

use super::{block_on, connect, json_text, table, Connection, Failure};

/// `raftq sub`.
#[derive(Debug, Clone, Args)]
pub struct SubArgs {
    #[command(subcommand)]
    pub command: SubCmd,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, Subcommand)]
pub enum SubCmd {
    /// Create a subscription (nothing changes if it exists with the same settings).
    Create {
        topic: String,
        name: String,
        /// Where its cursor starts: `first` (the default), `next` or an offset.
        #[arg(long, value_name = "first|next|N", value_parser = parse_start)]
        start: Option<SubscriptionStart>,
        /// Lease length of a pull that names none, in ms (default 30,000).
        #[arg(long)]
        ack_timeout_ms: Option<u64>,
        /// Deliveries after which a record still not acked is dead-lettered.
        #[arg(long)]
        max_deliveries: Option<u32>,
        /// Where dead letters go (without one they are discarded and counted).
        #[arg(long)]
        dead_letter_topic: Option<String>,
        /// Print the subscription as JSON once created.
        #[arg(long)]
        json: bool,
    },
    /// The subscriptions of a topic, with their cursor and counts.
    List {
        topic: String,
        #[arg(long)]
        json: bool,
    },
    /// One subscription: cursor, backlog, in flight, counters and settings.
    Info {
        topic: String,
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete a subscription (its leases end; the topic's records stay).
    Delete { topic: String, name: String },
}

fn parse_start(text: &str) -> Result<SubscriptionStart, String> {
    match text {
        "first" => Ok(SubscriptionStart::First),
        "next" => Ok(SubscriptionStart::Next),
        n => n
            .parse()
            .map(SubscriptionStart::Offset)
            .map_err(|_| format!("expected first, next or an offset, not {n:?}")),
    }
}

/// Runs `raftq sub`.
pub fn sub(args: SubArgs) -> ExitCode {
    block_on(run(args))
}

async fn run(args: SubArgs) -> Result<(), Failure> {
    let client = connect(&args.connection)?;
    let text = match args.command {
        SubCmd::Create {
            topic,
            name,
            start,
            ack_timeout_ms,
            max_deliveries,
            dead_letter_topic,
            json,
        } => {
            let config = SubscriptionConfig {
                start: start.unwrap_or_default(),
                ack_timeout_ms,
                max_deliveries,
                dead_letter_topic,
            };
            let created = client.create_subscription(&topic, &name, &config).await?;
            if json {
                json_text(&client.subscription(&topic, &name).await?)?
            } else if created {
                format!("subscription {name} of {topic} created\n")
            } else {
                format!("subscription {name} of {topic} already exists with these settings\n")
            }
        }
        SubCmd::List { topic, json: true } => json_text(&serde_json::json!({
            "subscriptions": client.list_subscriptions(&topic).await?
        }))?,
        SubCmd::List { topic, json: false } => {
            let subs = client.list_subscriptions(&topic).await?;
            if subs.is_empty() {
                format!("no subscriptions on {topic}\n")
            } else {
                subs_table(&subs)
            }
        }
        SubCmd::Info {
            topic,
            name,
            json: true,
        } => json_text(&client.subscription(&topic, &name).await?)?,
        SubCmd::Info {
            topic,
            name,
            json: false,
        } => {
            let info = client.subscription(&topic, &name).await?;
            let c = &info.config;
            let setting = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
            format!(
                "{}ack_timeout_ms: {}, max_deliveries: {}, dead_letter_topic: {}\n",
                subs_table(std::slice::from_ref(&info)),
                setting(c.ack_timeout_ms.map(|v| v.to_string())),
                setting(c.max_deliveries.map(|v| v.to_string())),
                setting(c.dead_letter_topic.clone()),
            )
        }
        SubCmd::Delete { topic, name } => {
            client.delete_subscription(&topic, &name).await?;
            format!("subscription {name} of {topic} deleted\n")
        }
    };
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(Failure::Output)
}

fn subs_table(subs: &[SubscriptionInfo]) -> String {
    let rows: Vec<Vec<String>> = subs
        .iter()
        .map(|s| {
            let mut row = vec![s.name.clone()];
            row.extend(
                [
                    s.cursor,
                    s.backlog,
                    s.in_flight,
                    s.delivered,
                    s.acked,
                    s.redelivered,
                    s.dead_lettered,
                ]
                .map(|n| n.to_string()),
            );
            row
        })
        .collect();
    table(
        &[
            "subscription",
            "cursor",
            "backlog",
            "in_flight",
            "delivered",
            "acked",
            "redelivered",
            "dead_lettered",
        ],
        &rows,
        1,
    )
}
