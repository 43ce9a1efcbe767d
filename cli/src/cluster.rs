//! `raftq cluster`: see and change the cluster's members.
//!
//! `status` prints the members as the answering node sees them; `add`, `promote`, `remove` and
//! `transfer-leader` go to the leader (the SDK follows redirects); `snapshot` asks each node
//! given with `--url` for a snapshot now (snapshots are per node).

use std::collections::BTreeSet;
use std::io::{self, Write as _};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use raftq_client::api::ClusterStatus;

use super::{block_on, connect, json_text, table, Connection, Failure};

/// `raftq cluster`.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub command: ClusterCmd,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ClusterCmd {
    /// The members, who leads, and how far each has replicated.
    Status {
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Add a node as a learner and wait until it has caught up (start it first, with a new
    /// id, an empty data directory, and --peers listing the members and itself).
    Add {
        /// The new node's id: never one the cluster had before.
        id: u64,
        /// Its base URL, as the other nodes reach it (http://HOST:PORT).
        url: String,
    },
    /// Make learners voters (the voters become the current ones plus these).
    Promote {
        #[arg(required = true)]
        ids: Vec<u64>,
    },
    /// Remove a node from the cluster (voter or learner). Its id is never accepted again.
    Remove { id: u64 },
    /// Move leadership to another voter (default: the most up-to-date follower).
    TransferLeader {
        #[arg(long)]
        to: Option<u64>,
    },
    /// Build a snapshot now on every node given with --url.
    Snapshot,
}

/// Runs `raftq cluster`.
pub fn cluster(args: ClusterArgs) -> ExitCode {
    block_on(run(args))
}

async fn run(args: ClusterArgs) -> Result<(), Failure> {
    let client = connect(&args.connection)?;
    let text = match args.command {
        ClusterCmd::Status { json: true } => json_text(&client.cluster().await?)?,
        ClusterCmd::Status { json: false } => status_table(&client.cluster().await?),
        ClusterCmd::Add { id, url } => {
            // Catching up can take long (a snapshot of the whole state, then the log): show
            // how far the new node has got every two seconds meanwhile, on stderr.
            let add = client.add_node(id, &url);
            tokio::pin!(add);
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(2));
            tick.tick().await;
            let status = loop {
                tokio::select! {
                    result = &mut add => break result?,
                    _ = tick.tick() => {
                        if let Ok(now) = client.cluster().await {
                            let matched = now.matched_index(id);
                            match matched {
                                Some(m) => eprintln!(
                                    "node {id}: replicated up to log index {m} of {}",
                                    now.commit_index
                                ),
                                None => eprintln!("node {id}: waiting for it to answer"),
                            }
                        }
                    }
                }
            };
            format!(
                "node {id} is a learner and has caught up\n{}",
                status_table(&status)
            )
        }
        ClusterCmd::Promote { ids } => {
            let current = client.cluster().await?;
            let mut voters: BTreeSet<u64> = voters(&current);
            voters.extend(ids.iter().copied());
            let voters: Vec<u64> = voters.into_iter().collect();
            let status = client.set_voters(&voters).await?;
            format!("voters: {voters:?}\n{}", status_table(&status))
        }
        ClusterCmd::Remove { id } => {
            let status = client.remove_node(id).await?;
            format!("node {id} removed\n{}", status_table(&status))
        }
        ClusterCmd::TransferLeader { to } => {
            let leader = client.transfer_leader(to).await?;
            format!("node {leader} leads\n")
        }
        ClusterCmd::Snapshot => {
            let mut text = String::new();
            for url in &args.connection.urls {
                let taken = client.snapshot(url).await?;
                text.push_str(&format!(
                    "node {} ({url}): snapshot at log index {}, {} bytes\n",
                    taken.node_id, taken.snapshot.index, taken.snapshot.bytes
                ));
            }
            text
        }
    };
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(Failure::Output)
}

fn voters(status: &ClusterStatus) -> BTreeSet<u64> {
    status
        .members
        .iter()
        .filter(|m| m.voter)
        .map(|m| m.id)
        .collect()
}

/// The members as a table, with the answering node's view of term, commit and snapshot.
fn status_table(s: &ClusterStatus) -> String {
    let mut text = format!(
        "answered by node {}; leader {}; term {}; commit index {}; applied {}{}\n",
        s.node_id,
        s.leader_id
            .map_or_else(|| "unknown".to_string(), |l| l.to_string()),
        s.term,
        s.commit_index,
        s.last_applied,
        s.snapshot.map_or_else(String::new, |snap| format!(
            "; snapshot at {} ({} bytes)",
            snap.index, snap.bytes
        )),
    );
    let rows: Vec<Vec<String>> = s
        .members
        .iter()
        .map(|m| {
            vec![
                m.id.to_string(),
                m.url.clone(),
                if s.leader_id == Some(m.id) {
                    "leader".to_string()
                } else if m.voter {
                    "voter".to_string()
                } else {
                    "learner".to_string()
                },
                m.matched_index
                    .map_or_else(|| "-".to_string(), |i| i.to_string()),
            ]
        })
        .collect();
    text.push_str(&table(&["id", "url", "role", "matched"], &rows, 3));
    text
}

#[cfg(test)]
mod tests {
    use raftq_client::api::{ClusterMember, SnapshotInfo};

    use super::*;

    #[test]
    fn status_table_names_roles_and_progress() {
        let member = |id, voter, matched| ClusterMember {
            id,
            url: format!("http://10.0.0.{id}:7000"),
            voter,
            matched_index: matched,
        };
        let status = ClusterStatus {
            node_id: 1,
            leader_id: Some(1),
            leader_url: Some("http://10.0.0.1:7000".into()),
            term: 3,
            commit_index: 42,
            last_applied: 42,
            members: vec![
                member(1, true, Some(42)),
                member(2, true, Some(40)),
                member(4, false, None),
            ],
            snapshot: Some(SnapshotInfo {
                index: 30,
                bytes: 1024,
            }),
            state_digest: None,
        };
        let text = status_table(&status);
        assert!(text.starts_with("answered by node 1; leader 1; term 3; commit index 42"));
        assert!(text.contains("snapshot at 30 (1024 bytes)"));
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[2].contains("leader") && lines[2].ends_with("42"),
            "{text}"
        );
        assert!(
            lines[3].contains("voter") && lines[3].ends_with("40"),
            "{text}"
        );
        assert!(
            lines[4].contains("learner") && lines[4].ends_with('-'),
            "{text}"
        );
        assert_eq!(voters(&status), BTreeSet::from([1, 2]));
    }
}
