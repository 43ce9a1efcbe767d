//! The reports and cluster administration calls of a [`Client`]: counters, broadcast,
//! membership, leadership transfer and snapshots.

use std::time::Duration;

use bytes::Bytes;
use reqwest::Method;
use serde::de::DeserializeOwned;

use super::{check_name, json_body, Client, JSON};
use crate::api::{
    AddNodeRequest, BroadcastRequest, BroadcastResponse, ClusterStatus, Report, SetVotersRequest,
    SnapshotTaken, TopicReport, TransferLeaderRequest, TransferLeaderResponse,
};
use crate::error::Error;
use crate::transport::{Call, Retry};

impl Client {
    /// The counters of one topic and its subscriptions as of the answering node's commit
    /// point (any node may answer; the leader's is the freshest).
    pub async fn topic_report(&self, topic: &str) -> Result<TopicReport, Error> {
        check_name("topic", topic)?;
        self.get(format!("v1/topics/{topic}/report"), Duration::ZERO)
            .await
    }

    /// The counters of every topic as of one commit point.
    pub async fn report(&self) -> Result<Report, Error> {
        self.get("v1/report".to_string(), Duration::ZERO).await
    }

    /// Appends one marker record to every topic `request` names (all topics when it names
    /// none) in a single Raft entry; each marker carries that entry's commit point in its
    /// headers. Not idempotent: after a lost answer this returns [`Error::Indeterminate`]
    /// rather than append the markers twice.
    pub async fn broadcast(&self, request: &BroadcastRequest) -> Result<BroadcastResponse, Error> {
        if let Some(topics) = &request.topics {
            for topic in topics {
                check_name("topic", topic)?;
            }
        }
        let call = Call {
            method: Method::POST,
            target: "v1/broadcast".to_string(),
            body: Some((json_body(request)?, JSON)),
            retry: Retry::UnsafeWrite,
            hold: Duration::ZERO,
        };
        self.send_json(&call).await
    }

    /// The cluster as the answering node sees it (any node may answer). A leader it names is
    /// remembered for the next write.
    pub async fn cluster(&self) -> Result<ClusterStatus, Error> {
        let status: ClusterStatus = self.get("v1/cluster".to_string(), Duration::ZERO).await?;
        if let Some(leader_url) = &status.leader_url {
            self.transport.learn_leader(leader_url);
        }
        Ok(status)
    }

    /// Adds node `id` at `url` as a learner and waits (on the server, up to 60 s) until it
    /// has caught up. Adding a node that is already a member at the same URL only waits.
    pub async fn add_node(&self, id: u64, url: &str) -> Result<ClusterStatus, Error> {
        let body = AddNodeRequest {
            id,
            url: url.to_string(),
        };
        self.membership_call(
            Method::POST,
            "v1/cluster/nodes".into(),
            Some(json_body(&body)?),
        )
        .await
    }

    /// Makes exactly `ids` the voters (members that leave the voters stay as learners).
    pub async fn set_voters(&self, ids: &[u64]) -> Result<ClusterStatus, Error> {
        let body = SetVotersRequest { ids: ids.to_vec() };
        self.membership_call(
            Method::POST,
            "v1/cluster/voters".into(),
            Some(json_body(&body)?),
        )
        .await
    }

    /// Removes node `id` from the cluster. Its id can never be used again.
    pub async fn remove_node(&self, id: u64) -> Result<ClusterStatus, Error> {
        self.membership_call(Method::DELETE, format!("v1/cluster/nodes/{id}"), None)
            .await
    }

    /// Moves leadership to voter `to` (or the most up-to-date follower); returns the new
    /// leader.
    pub async fn transfer_leader(&self, to: Option<u64>) -> Result<u64, Error> {
        let body = TransferLeaderRequest { to };
        let answer: TransferLeaderResponse = self
            .membership_call(
                Method::POST,
                "v1/cluster/transfer-leader".into(),
                Some(json_body(&body)?),
            )
            .await?;
        Ok(answer.leader_id)
    }

    /// Asks the node at `url` (snapshots are per node) to build a snapshot now, with this
    /// client's token, CA and time-outs.
    pub async fn snapshot(&self, url: &str) -> Result<SnapshotTaken, Error> {
        let single = Client {
            transport: std::sync::Arc::new(self.transport.only(crate::transport::base_url(url)?)),
            publish_format: self.publish_format,
            read_format: self.read_format,
            json_only: self.json_only.clone(),
        };
        let call = Call {
            method: Method::POST,
            target: "v1/cluster/snapshot".to_string(),
            body: None,
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        single.send_json(&call).await
    }

    /// Membership changes converge on a target state, so re-sending one after a lost answer
    /// is safe.
    async fn membership_call<T: DeserializeOwned>(
        &self,
        method: Method,
        target: String,
        body: Option<Bytes>,
    ) -> Result<T, Error> {
        let call = Call {
            method,
            target,
            body: body.map(|b| (b, JSON)),
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        self.send_json(&call).await
    }
}
