//! `raftq report`: a topic's counters, or every topic's, as of a commit point.

use std::io::{self, Write};
use std::process::ExitCode;

use raftq_client::api::{utc_time, CommitPoint, SubscriptionReport, TopicReport};

use super::{block_on, connect, json_text, table, Failure, ReportArgs};

/// Runs `raftq report`.
pub fn report(args: ReportArgs) -> ExitCode {
    block_on(run_report(args))
}

async fn run_report(args: ReportArgs) -> Result<(), Failure> {
    let client = connect(&args.connection)?;
    let text = match &args.topic {
        Some(topic) => {
            let report = client.topic_report(topic).await?;
            if args.json {
                json_text(&report)?
            } else {
                report_table(report.commit_point, &[(topic.as_str(), &report)])
            }
        }
        None => {
            let report = client.report().await?;
            if args.json {
                json_text(&report)?
            } else {
                let topics: Vec<(&str, &TopicReport)> = report
                    .topics
                    .iter()
                    .map(|(name, topic)| (name.as_str(), topic))
                    .collect();
                report_table(report.commit_point, &topics)
            }
        }
    };
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(Failure::Output)
}

/// A report for people: the commit point, one row per topic, one row per subscription.
fn report_table(commit_point: CommitPoint, topics: &[(&str, &TopicReport)]) -> String {
    let mut text = format!(
        "commit point: log index {} at {} (every count is as of this entry)\n",
        commit_point.index,
        utc_time(commit_point.timestamp_ms)
    );
    if topics.is_empty() {
        text.push_str("\nno topics\n");
        return text;
    }
    let rows: Vec<Vec<String>> = topics
        .iter()
        .map(|(name, topic)| {
            let mut row = vec![name.to_string()];
            row.extend(
                [
                    topic.published,
                    topic.deduplicated,
                    topic.records,
                    topic.discarded.retention,
                    topic.discarded.max_deliveries,
                    topic.discarded.rejected,
                ]
                .map(|n| n.to_string()),
            );
            row
        })
        .collect();
    text.push('\n');
    text.push_str(&table(
        &[
            "topic",
            "published",
            "deduplicated",
            "records",
            "discarded:retention",
            "max_deliveries",
            "rejected",
        ],
        &rows,
        1,
    ));
    let subscriptions: Vec<Vec<String>> = topics
        .iter()
        .flat_map(|(name, topic)| {
            topic
                .subscriptions
                .iter()
                .map(move |(sub, report)| subscription_row(name, sub, report))
        })
        .collect();
    text.push('\n');
    if subscriptions.is_empty() {
        text.push_str("no subscriptions\n");
    } else {
        text.push_str(&table(
            &[
                "topic",
                "subscription",
                "delivered",
                "acked",
                "redelivered",
                "expired_leases",
                "dead_lettered",
                "skipped",
                "cursor",
                "backlog",
                "in_flight",
            ],
            &subscriptions,
            2,
        ));
    }
    text
}

fn subscription_row(topic: &str, name: &str, report: &SubscriptionReport) -> Vec<String> {
    let mut row = vec![topic.to_string(), name.to_string()];
    row.extend(
        [
            report.delivered,
            report.acked,
            report.redelivered,
            report.expired_leases,
            report.dead_lettered,
            report.skipped,
            report.cursor,
            report.backlog,
            report.in_flight,
        ]
        .map(|n| n.to_string()),
    );
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_print_as_aligned_tables() {
        assert_eq!(utc_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_time(1_764_480_000_123), "2025-11-30T05:20:00.123Z");
        assert_eq!(utc_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
        let mut topic = TopicReport {
            published: 10_000,
            deduplicated: 12,
            records: 10_000,
            ..Default::default()
        };
        topic.subscriptions.insert(
            "billing".to_string(),
            SubscriptionReport {
                delivered: 7,
                acked: 5,
                cursor: 5,
                ..Default::default()
            },
        );
        let text = report_table(
            CommitPoint {
                index: 42,
                timestamp_ms: 0,
            },
            &[("orders", &topic)],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("log index 42 at 1970-01-01T00:00:00.000Z"),
            "{text}"
        );
        assert_eq!(lines[2].split_whitespace().next(), Some("topic"));
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            ["orders", "10000", "12", "10000", "0", "0", "0"]
        );
        assert_eq!(
            lines[6].split_whitespace().take(4).collect::<Vec<_>>(),
            ["orders", "billing", "7", "5"]
        );
        // Numbers are right-aligned under their headers.
        assert_eq!(
            lines[2].find("published").map(|at| at + "published".len()),
            lines[3].find("10000").map(|at| at + 5)
        );
        assert!(report_table(CommitPoint::default(), &[]).contains("no topics"));
    }
}
