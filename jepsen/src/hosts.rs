//! A raftq cluster as separate hosts with their own addresses.
//!
//! The one implementation today is [`netns::NetnsHosts`]: one Linux network namespace per node,
//! joined by veth pairs to a bridge in the root namespace, where the harness runs. Each node
//! has its own IP address, so a partition is a set of iptables rules inside the namespaces and
//! cuts exactly the links it names.
//!
//! Future work: a Docker implementation (one container per node on a private Docker network,
//! `docker kill -s KILL|STOP|CONT`, iptables through `docker exec`), for machines where the
//! harness may not create namespaces itself. The [`Hosts`] trait is all the nemeses and the
//! workloads use, so it would slot in without other changes.

use std::future::Future;

pub mod netns;

/// What the nemeses and workloads need from a cluster of hosts. Implemented by Linux network
/// namespaces with veth pairs (and, later, containers on a private Docker network).
pub trait Hosts: Send + Sync {
    /// Node ids, lowest first.
    fn ids(&self) -> Vec<u64>;
    /// The base URL of node `id`, as the harness (in the root namespace) reaches it.
    fn url(&self, id: u64) -> String;
    /// Starts node `id` (again) with its data directory and the same command line.
    fn start(&self, id: u64) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// SIGKILLs node `id` and reaps it.
    fn kill(&self, id: u64) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// SIGSTOPs node `id`.
    fn pause(&self, id: u64) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// SIGCONTs node `id`.
    fn resume(&self, id: u64) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Cuts the network so that nodes talk only within their group (iptables inside each
    /// host's namespace). Groups may overlap (a bridge node, a majorities ring).
    fn partition(&self, groups: &[Vec<u64>]) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Removes every network fault.
    fn heal(&self) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Everything node `id` logged.
    fn log(&self, id: u64) -> String;

    /// True while the harness believes node `id` runs (started and not killed; a paused node
    /// runs).
    fn is_running(&self, id: u64) -> bool;
    /// The ids of the nodes that run, lowest first.
    fn running_ids(&self) -> Vec<u64> {
        self.ids()
            .into_iter()
            .filter(|id| self.is_running(*id))
            .collect()
    }
}

/// Which pairs of nodes may talk under `groups`: two nodes may when some group holds both.
/// A node in no group talks to nobody. Symmetric; a node always "talks" to itself.
pub fn connected(groups: &[Vec<u64>], a: u64, b: u64) -> bool {
    a == b
        || groups
            .iter()
            .any(|group| group.contains(&a) && group.contains(&b))
}

#[cfg(test)]
mod tests {
    use super::connected;

    #[test]
    fn overlapping_groups_connect_pairwise() {
        let bridge = vec![vec![1, 2], vec![2, 3]];
        assert!(connected(&bridge, 1, 2));
        assert!(connected(&bridge, 2, 3));
        assert!(!connected(&bridge, 1, 3));
        assert!(connected(&bridge, 3, 3));
        let isolated = vec![vec![1], vec![2, 3]];
        assert!(!connected(&isolated, 1, 2));
        assert!(connected(&isolated, 2, 3));
        assert!(!connected(&[vec![2, 3]], 1, 2));
    }
}
