//! Applying a fault to the hosts, and undoing it (healing partitions, restarting killed or
//! powered-off nodes, repairing damaged files).

use super::*;

/// Applies `fault`; a membership change is given up on after `bound`. Returns what is worth
/// adding to the fault's description (empty for most faults); what it found goes to `outcome`.
pub async fn apply<H: Hosts>(
    hosts: &H,
    http: &Http,
    fault: &Fault,
    bound: Duration,
    outcome: &mut Option<Outcome>,
) -> anyhow::Result<String> {
    match fault {
        Fault::PowerLossAll { nodes } => {
            let loss = hosts.power_loss(nodes).await?;
            let text = format!("; {}; {}", loss.how, lost_text(&loss.dropped));
            *outcome = Some(Outcome::PowerLoss(disk::PowerLossOutcome {
                bytes: loss.bytes(),
                dropped: loss.dropped,
                ..disk::PowerLossOutcome::default()
            }));
            return Ok(text);
        }
        Fault::PowerLossLeader {
            node,
            fsync_delay_ms,
            slow_ms,
            ..
        } => {
            let disk = hosts.disk(*node)?;
            let before = disk.stats().fsyncs;
            disk.set_fsync_delay(Some(Duration::from_millis(*fsync_delay_ms)));
            tokio::time::sleep(Duration::from_millis(*slow_ms)).await;
            let stats = disk.stats();
            let loss = hosts.power_loss(&[*node]).await;
            // The power loss sets it back; this is for when it failed before.
            disk.set_fsync_delay(None);
            let loss = loss?;
            let slow = stats.fsyncs.saturating_sub(before);
            let text = format!(
                "; {}; {} ({} syncs asked for while slow, {} waiting at the end)",
                loss.how,
                lost_text(&loss.dropped),
                slow,
                stats.pending_fsyncs
            );
            *outcome = Some(Outcome::PowerLoss(disk::PowerLossOutcome {
                bytes: loss.bytes(),
                dropped: loss.dropped,
                pending_fsyncs: Some(stats.pending_fsyncs),
                slow_fsyncs: Some(slow),
            }));
            return Ok(text);
        }
        Fault::Corrupt { node, plan } => {
            hosts.kill(*node).await?;
            let data = hosts.data_dir(*node);
            let copy = disk::copy_path(&data);
            let plan = plan.clone();
            let (copied, damaged) = tokio::task::spawn_blocking({
                let (data, copy) = (data.clone(), copy.clone());
                move || -> anyhow::Result<([usize; 2], Vec<disk::Damaged>)> {
                    let _ = std::fs::remove_dir_all(&copy);
                    disk::copy_tree(&data, &copy)?;
                    // What the copy holds of the store: RocksDB's files and the log segments
                    // (none from a build that keeps its Raft log in RocksDB).
                    let copied = ["db", "log"]
                        .map(|dir| std::fs::read_dir(copy.join(dir)).map_or(0, |d| d.count()));
                    let damaged = disk::damage(&data, &plan)?;
                    disk::verify_damage(&data, &copy, &damaged)?;
                    Ok((copied, damaged))
                }
            })
            .await??;
            let parts: Vec<String> = damaged
                .iter()
                .map(|d| format!("{} ({} bytes) {}", d.file, d.size, d.what))
                .collect();
            let text = format!(
                "; killed {node}; copied its data directory aside ({} files in db/, {} in log/); {}",
                copied[0],
                copied[1],
                parts.join("; ")
            );
            *outcome = Some(Outcome::Damage(disk::DamageOutcome {
                node: *node,
                damaged,
                start: None,
                after_restore: None,
                copy,
            }));
            return Ok(text);
        }
        Fault::ClockJump { node, offset_ms } => {
            let measured = clock::step(hosts, http, *node, *offset_ms).await?;
            *outcome = Some(Outcome::Clock(clock::ClockOutcome {
                node: *node,
                offset_ms: *offset_ms,
                measured_ms: Some(measured),
                ..clock::ClockOutcome::default()
            }));
            return Ok(format!("; node {node}'s wall clock is {measured:+} ms off"));
        }
        Fault::ClockStrobe { node, amplitude_ms } => {
            let offset = *amplitude_ms as i64;
            let measured = clock::step(hosts, http, *node, offset).await?;
            *outcome = Some(Outcome::Clock(clock::ClockOutcome {
                node: *node,
                offset_ms: offset,
                measured_ms: Some(measured),
                ..clock::ClockOutcome::default()
            }));
            return Ok(format!("; node {node}'s wall clock is {measured:+} ms off"));
        }
        Fault::DiskFull { node, slack } => {
            let disk = hosts.disk(*node)?;
            let log_mark = hosts.log(*node).len();
            // Setting a limit counts the space used anew.
            disk.set_space_limit(Some(u64::MAX));
            let stats = disk.stats();
            let limit = stats.space_used + slack;
            disk.set_space_limit(Some(limit));
            *outcome = Some(Outcome::DiskFull(disk::DiskFullOutcome {
                node: *node,
                used: stats.space_used,
                limit,
                enospc: stats.enospc,
                log_mark,
                ..disk::DiskFullOutcome::default()
            }));
            return Ok(format!(
                "; node {node}'s files take {} bytes; limit {limit}",
                stats.space_used
            ));
        }
        Fault::SlowFsync { node, delay_ms } => {
            let disk = hosts.disk(*node)?;
            let before = disk.stats().fsyncs;
            disk.set_fsync_delay(Some(Duration::from_millis(*delay_ms)));
            *outcome = Some(Outcome::SlowFsync(disk::SlowFsyncOutcome {
                node: *node,
                delay_ms: *delay_ms,
                fsyncs_before: before,
                ..disk::SlowFsyncOutcome::default()
            }));
        }
        Fault::Kill { nodes } => {
            // All at once: the kills run concurrently (SIGKILL is sent before any reaping).
            let kills = nodes.iter().map(|id| hosts.kill(*id));
            for result in futures::future::join_all(kills).await {
                result?;
            }
        }
        Fault::KillAll { .. } => {
            let how = hosts.kill_all().await?;
            return Ok(format!("; {how}"));
        }
        Fault::Pause { nodes } => {
            for id in nodes {
                hosts.pause(*id).await?;
            }
        }
        Fault::Partition { groups } => hosts.partition(groups).await?,
        Fault::Oneway { from, to } => hosts.cut_oneway(&[(*from, *to)]).await?,
        Fault::Netem { nodes, netem } => hosts.impair(nodes, netem).await?,
        Fault::DemoteKill {
            voters,
            kill,
            delay_ms,
            ..
        } => {
            // The demotion is asked for, and the kill comes while it is in flight or just
            // after; the demotion may then not happen (its leader died), which is part of the
            // fault, so only the kill must succeed.
            let demote = membership::ensure_voters(http, voters, Instant::now() + bound);
            let killing = async {
                tokio::time::sleep(Duration::from_millis(*delay_ms)).await;
                hosts.kill(*kill).await
            };
            let (demoted, killed) = tokio::join!(demote, killing);
            killed.with_context(|| format!("cannot kill node {kill}"))?;
            let outcome = match demoted {
                Ok(done) => format!(
                    "voters {voters:?} (were {:?}; leader {})",
                    done.before, done.leader
                ),
                Err(err) => format!("demotion not confirmed: {err:#}"),
            };
            return Ok(format!("; killed {kill}; {outcome}"));
        }
        Fault::Demote { voters, .. } => {
            let done = membership::ensure_voters(http, voters, Instant::now() + bound).await?;
            return Ok(format!(
                "; voters {voters:?} (were {:?}; leader {})",
                done.before, done.leader
            ));
        }
        // The transfers happen while the fault holds.
        Fault::Transfer { .. } => {}
    }
    Ok(String::new())
}

/// What the disks lost, in words: `node 1 lost 1234 bytes (3 files), node 2 ...`.
fn lost_text(dropped: &BTreeMap<u64, crate::hosts::Dropped>) -> String {
    let parts: Vec<String> = dropped
        .iter()
        .map(|(id, d)| {
            let mut text = format!(
                "node {id} lost {} unsynced bytes ({} files)",
                d.bytes, d.files
            );
            if d.failed_fsyncs > 0 {
                text.push_str(&format!(", {} waiting syncs failed", d.failed_fsyncs));
            }
            text
        })
        .collect();
    parts.join(", ")
}

/// Undoes `fault`. Returns what is worth adding to the description (empty for most faults);
/// what it found goes to `outcome`.
pub async fn undo<H: Hosts>(
    hosts: &H,
    http: &Http,
    fault: &Fault,
    outcome: &mut Option<Outcome>,
) -> anyhow::Result<String> {
    match fault {
        Fault::PowerLossAll { nodes } => {
            for id in nodes {
                hosts.start(*id).await?;
            }
        }
        Fault::PowerLossLeader { node, .. } => hosts.start(*node).await?,
        Fault::Corrupt { node, .. } => {
            let Some(Outcome::Damage(done)) = outcome.as_mut() else {
                // Nothing was damaged: only the kill is to undo.
                hosts.start(*node).await?;
                return Ok(format!("; started {node}"));
            };
            return undo_damage(hosts, http, *node, done).await;
        }
        Fault::ClockJump { node, .. } | Fault::ClockStrobe { node, .. } => {
            let measured = clock::step(hosts, http, *node, 0).await?;
            if let Some(Outcome::Clock(c)) = outcome.as_mut() {
                c.restored_ms = Some(measured);
            }
            return Ok(format!("; node {node}'s wall clock is {measured:+} ms off"));
        }
        Fault::DiskFull { node, .. } => {
            let disk = hosts.disk(*node)?;
            let stats = disk.stats();
            disk.set_space_limit(None);
            let mut text = String::new();
            let mut refused = true;
            if let Some(Outcome::DiskFull(d)) = outcome.as_mut() {
                d.enospc = stats.enospc.saturating_sub(d.enospc);
                refused = d.enospc > 0;
                text = format!("; {} writes refused for want of space", d.enospc);
                if !hosts.is_running(*node) {
                    let log = hosts.log(*node);
                    let since = log.get(d.log_mark..).unwrap_or(&log);
                    d.exit = Some(
                        hosts
                            .exit_status(*node)
                            .unwrap_or_else(|| "exited (status unknown)".into()),
                    );
                    d.message = Some(disk::log_excerpt(since, disk::NO_SPACE));
                    text.push_str(&format!(
                        "; node {node} had stopped ({}); started again",
                        d.exit.as_deref().unwrap_or_default()
                    ));
                } else {
                    text.push_str(&format!("; node {node} still ran"));
                }
            }
            hosts.start(*node).await?;
            if !refused {
                anyhow::bail!(
                    "no write was refused for want of space while the limit held: the disk \
                     never filled up{text}"
                );
            }
            return Ok(text);
        }
        Fault::SlowFsync { node, .. } => {
            let disk = hosts.disk(*node)?;
            let stats = disk.stats();
            disk.set_fsync_delay(None);
            if let Some(Outcome::SlowFsync(d)) = outcome.as_mut() {
                d.fsyncs = stats.fsyncs.saturating_sub(d.fsyncs_before);
                d.pending_at_end = stats.pending_fsyncs;
                if d.fsyncs == 0 {
                    anyhow::bail!("node {node} asked for no fsync while they were slow");
                }
                return Ok(format!(
                    "; {} syncs asked for while slow, {} still waiting",
                    d.fsyncs, d.pending_at_end
                ));
            }
        }
        Fault::Kill { nodes } | Fault::KillAll { nodes } => {
            for id in nodes {
                hosts.start(*id).await?;
            }
        }
        Fault::Pause { nodes } => {
            for id in nodes {
                hosts.resume(*id).await?;
            }
        }
        Fault::Partition { .. } | Fault::Oneway { .. } | Fault::Netem { .. } => {
            hosts.heal().await?
        }
        Fault::DemoteKill { kill, .. } => {
            hosts.start(*kill).await?;
            let all = hosts.ids();
            let done =
                membership::ensure_voters(http, &all, Instant::now() + VOTERS_TIMEOUT).await?;
            return Ok(format!(
                "; started {kill}; voters {all:?} again (leader {})",
                done.leader
            ));
        }
        Fault::Demote { node, voters } => {
            let mut all = voters.clone();
            all.push(*node);
            all.sort_unstable();
            let done =
                membership::ensure_voters(http, &all, Instant::now() + VOTERS_TIMEOUT).await?;
            return Ok(format!("; voters {all:?} again (leader {})", done.leader));
        }
        Fault::Transfer { .. } => {}
    }
    Ok(String::new())
}

/// Undoes a `corrupt-minority` fault: starts the node on its damaged data and watches it;
/// when it refuses, puts its pre-damage copy back and starts it again.
async fn undo_damage<H: Hosts>(
    hosts: &H,
    http: &Http,
    node: u64,
    done: &mut disk::DamageOutcome,
) -> anyhow::Result<String> {
    let first = disk::observe_start(hosts, http, node).await?;
    done.start = Some(first.clone());
    let mut text = match &first {
        disk::Start::Started {
            caught_up,
            says_damaged,
            detail,
        } => format!(
            "; node {node} started on its damaged data, {} ({}: {detail})",
            if *says_damaged {
                "saying it is damaged"
            } else {
                "without a word about it"
            },
            if *caught_up {
                "caught up"
            } else {
                "not caught up"
            }
        ),
        disk::Start::Refused { exit, message, .. } => {
            format!("; node {node} refused to start ({exit}): {message}")
        }
    };
    if first.refused() {
        let (data, copy) = (hosts.data_dir(node), done.copy.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            disk::clear_dir(&data)?;
            disk::copy_tree(&copy, &data)
        })
        .await??;
        let again = disk::observe_start(hosts, http, node).await?;
        done.after_restore = Some(again.clone());
        match &again {
            disk::Start::Refused { exit, message, .. } => anyhow::bail!(
                "node {node} refused to start on its pre-damage copy too ({exit}): {message} \
                 (the copy stays at {})",
                done.copy.display()
            ),
            disk::Start::Started {
                caught_up, detail, ..
            } => text.push_str(&format!(
                "; put its pre-damage copy back: started ({}: {detail})",
                if *caught_up {
                    "caught up"
                } else {
                    "not caught up"
                }
            )),
        }
    }
    let _ = std::fs::remove_dir_all(&done.copy);
    Ok(text)
}
