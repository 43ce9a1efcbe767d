//! The subscription calls of a [`Client`]: create, inspect and delete subscriptions; pull,
//! ack, nack and extend leases; move a cursor.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Serialize;

use super::{check_name, json_body, Client, JSON};
use crate::api::records_form;
use crate::api::{
    AckRequest, CursorRequest, CursorResponse, ExtendRequest, NackRequest, PullRequest,
    PullResponse, ReceiptResult, ReceiptResults, SubscriptionConfig, SubscriptionInfo,
    SubscriptionList, MAX_ACK_TIMEOUT_MS, MAX_NACK_DELAY_MS, MAX_PULL, MAX_RECEIPTS, MAX_WAIT_MS,
};
use crate::error::Error;
use crate::transport::{Call, Retry};

impl Client {
    /// Creates a subscription on `topic`, or confirms it exists with the same configuration.
    ///
    /// Returns `true` when this call's request created it (201) and `false` when it already
    /// existed with this configuration (200). Like [`Client::create_topic`], the request is
    /// re-sent after a lost answer, so `false` can also mean an earlier attempt of this same call
    /// created it. A different existing configuration is [`Error::Api`] with code
    /// `already_exists`; if that refusal follows a lost answer (possible with
    /// `start: "next"`, should the server store the offset it resolved), it is
    /// [`Error::Indeterminate`].
    pub async fn create_subscription(
        &self,
        topic: &str,
        name: &str,
        config: &SubscriptionConfig,
    ) -> Result<bool, Error> {
        check_name("topic", topic)?;
        check_name("subscription", name)?;
        if let Some(ack_timeout_ms) = config.ack_timeout_ms {
            check_ack_timeout_ms(ack_timeout_ms)?;
        }
        if config.max_deliveries == Some(0) {
            return Err(Error::InvalidArgument(
                "max_deliveries is at least 1".to_string(),
            ));
        }
        if let Some(dead_letter_topic) = &config.dead_letter_topic {
            check_name("dead-letter topic", dead_letter_topic)?;
        }
        let call = Call {
            method: Method::PUT,
            target: format!("v1/topics/{topic}/subscriptions/{name}"),
            body: Some((json_body(config)?, JSON)),
            // The same PUT applied twice has the effect of applying it once.
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        let (status, _) = self.transport.execute(&call).await?;
        Ok(status == StatusCode::CREATED)
    }

    /// One subscription: its cursor, counters and configuration.
    pub async fn subscription(&self, topic: &str, name: &str) -> Result<SubscriptionInfo, Error> {
        check_name("topic", topic)?;
        check_name("subscription", name)?;
        self.get(
            format!("v1/topics/{topic}/subscriptions/{name}"),
            Duration::ZERO,
        )
        .await
    }

    /// All subscriptions of `topic`.
    pub async fn list_subscriptions(&self, topic: &str) -> Result<Vec<SubscriptionInfo>, Error> {
        check_name("topic", topic)?;
        let list: SubscriptionList = self
            .get(format!("v1/topics/{topic}/subscriptions"), Duration::ZERO)
            .await?;
        Ok(list.subscriptions)
    }

    /// Deletes a subscription: its cursor, leases and counters are gone, and every receipt it
    /// issued becomes unusable.
    ///
    /// Re-sent after a lost answer; a re-send that finds the subscription gone returns
    /// [`Error::Indeterminate`] (quoting `subscription_not_found`), as for
    /// [`Client::delete_topic`].
    pub async fn delete_subscription(&self, topic: &str, name: &str) -> Result<(), Error> {
        check_name("topic", topic)?;
        check_name("subscription", name)?;
        let call = Call {
            method: Method::DELETE,
            target: format!("v1/topics/{topic}/subscriptions/{name}"),
            body: None,
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        self.transport.execute(&call).await?;
        Ok(())
    }

    /// Leases up to `request.max` records of a subscription (queue semantics). Each
    /// [`Message`](crate::api::Message) must then be acked, nacked or extended with its
    /// `receipt` before its lease expires, or it is delivered again.
    ///
    /// A pull is a write (it goes to the leader). With `wait_ms` it long-polls: the call's
    /// deadline and the attempt's time-out are extended by the wait.
    ///
    /// **Retries.** A pull whose answer is lost (time-out, reset connection, a 5xx) is re-sent
    /// until the deadline: nothing is lost by it, because the records the lost answer leased are
    /// delivered again when their lease expires (after `ack_timeout_ms`, with a
    /// `delivery_count` one higher). They are only delayed, and may reach another consumer of
    /// the subscription first. When the deadline passes after such a loss, the error is
    /// [`Error::Indeterminate`]; the same holds for the records then.
    pub async fn pull(
        &self,
        topic: &str,
        subscription: &str,
        request: &PullRequest,
    ) -> Result<PullResponse, Error> {
        check_name("topic", topic)?;
        check_name("subscription", subscription)?;
        if let Some(max) = request.max {
            if max == 0 || max > MAX_PULL {
                return Err(Error::InvalidArgument(format!(
                    "a pull leases 1 to {MAX_PULL} records, not {max}"
                )));
            }
        }
        let wait_ms = request.wait_ms.unwrap_or(0);
        if wait_ms > MAX_WAIT_MS {
            return Err(Error::InvalidArgument(format!(
                "wait is at most {MAX_WAIT_MS} ms, not {wait_ms} ms"
            )));
        }
        if let Some(ack_timeout_ms) = request.ack_timeout_ms {
            check_ack_timeout_ms(ack_timeout_ms)?;
        }
        let call = Call {
            method: Method::POST,
            target: format!("v1/topics/{topic}/subscriptions/{subscription}/pull"),
            body: Some((json_body(request)?, JSON)),
            retry: Retry::IdempotentWrite,
            hold: Duration::from_millis(wait_ms),
        };
        self.send_records(&call, |body| {
            records_form::decode_pull(body).map(|messages| PullResponse { messages })
        })
        .await
    }

    /// Acks deliveries: their records are done and never delivered again. Answers one result
    /// per receipt, in order: `acked`, or `stale` when the receipt no longer names a live
    /// delivery (already acked, or expired and delivered again, or passed by a cursor move).
    ///
    /// **Retries.** Re-acking is harmless, so the ack is re-sent after a lost answer until the
    /// deadline. A re-sent ack answers `stale` for the receipts its lost first attempt acked:
    /// after a retry, `stale` does not prove the ack failed. (An [`Error::Indeterminate`] ack
    /// can be settled by acking again: `acked` or `stale`, the record is not leased to you
    /// any more either way.)
    pub async fn ack(
        &self,
        topic: &str,
        subscription: &str,
        receipts: &[impl AsRef<str>],
    ) -> Result<Vec<ReceiptResult>, Error> {
        let request = AckRequest {
            receipts: receipt_list(receipts)?,
        };
        self.receipt_call(topic, subscription, "ack", &request, request.receipts.len())
            .await
    }

    /// Nacks deliveries: their records become available again at their original offsets after
    /// `delay` (at most 12 h), or, with `dead_letter`, go to the subscription's dead-letter
    /// topic at once. A record whose `delivery_count` reached the subscription's
    /// `max_deliveries` is dead-lettered rather than released. Answers `released`,
    /// `dead_lettered` or `stale` per receipt, in order.
    ///
    /// Re-sent after a lost answer, like [`Client::ack`]: a re-send answers `stale` for what the
    /// lost attempt already released.
    pub async fn nack(
        &self,
        topic: &str,
        subscription: &str,
        receipts: &[impl AsRef<str>],
        delay: Duration,
        dead_letter: bool,
    ) -> Result<Vec<ReceiptResult>, Error> {
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        if delay_ms > MAX_NACK_DELAY_MS {
            return Err(Error::InvalidArgument(format!(
                "a nack delay is at most {MAX_NACK_DELAY_MS} ms, not {delay_ms} ms"
            )));
        }
        let request = NackRequest {
            receipts: receipt_list(receipts)?,
            delay_ms,
            dead_letter,
        };
        self.receipt_call(
            topic,
            subscription,
            "nack",
            &request,
            request.receipts.len(),
        )
        .await
    }

    /// Extends leases: each now ends `ack_timeout` (default: the subscription's) after the
    /// extend is applied. Answers `extended` with the new `lease_expires_ms`, or `stale` when
    /// the lease is lost (the record was delivered again, or acked). Re-sent after a lost answer:
    /// extending twice has the effect of extending once.
    pub async fn extend(
        &self,
        topic: &str,
        subscription: &str,
        receipts: &[impl AsRef<str>],
        ack_timeout: Option<Duration>,
    ) -> Result<Vec<ReceiptResult>, Error> {
        let ack_timeout_ms = match ack_timeout {
            None => None,
            Some(timeout) => {
                let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                check_ack_timeout_ms(ms)?;
                Some(ms)
            }
        };
        let request = ExtendRequest {
            receipts: receipt_list(receipts)?,
            ack_timeout_ms,
        };
        self.receipt_call(
            topic,
            subscription,
            "extend",
            &request,
            request.receipts.len(),
        )
        .await
    }

    /// Sets a subscription's cursor (its ack floor) to `offset` and returns the new cursor.
    /// Forward always (up to the topic's next offset); backward only with `allow_backward`.
    /// Moving it is a seek: leases and done marks it passes over are forgotten and their
    /// receipts become `stale`. Re-sent after a lost answer (setting the same offset twice has
    /// the effect of setting it once).
    pub async fn set_cursor(
        &self,
        topic: &str,
        subscription: &str,
        offset: u64,
        allow_backward: bool,
    ) -> Result<u64, Error> {
        check_name("topic", topic)?;
        check_name("subscription", subscription)?;
        let request = CursorRequest {
            offset,
            allow_backward,
        };
        let call = Call {
            method: Method::PUT,
            target: format!("v1/topics/{topic}/subscriptions/{subscription}/cursor"),
            body: Some((json_body(&request)?, JSON)),
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        let answer: CursorResponse = self.send_json(&call).await?;
        Ok(answer.cursor)
    }

    /// An ack, nack or extend: a safe-to-repeat write answering one result per receipt.
    async fn receipt_call(
        &self,
        topic: &str,
        subscription: &str,
        verb: &str,
        request: &impl Serialize,
        receipts: usize,
    ) -> Result<Vec<ReceiptResult>, Error> {
        check_name("topic", topic)?;
        check_name("subscription", subscription)?;
        let call = Call {
            method: Method::POST,
            target: format!("v1/topics/{topic}/subscriptions/{subscription}/{verb}"),
            body: Some((json_body(request)?, JSON)),
            retry: Retry::IdempotentWrite,
            hold: Duration::ZERO,
        };
        let answer: ReceiptResults = self.send_json(&call).await?;
        if answer.results.len() != receipts {
            // The call was applied (2xx), but results cannot be matched to receipts.
            return Err(Error::Decode {
                detail: format!(
                    "{verb} of {receipts} receipts answered {} results",
                    answer.results.len()
                ),
            });
        }
        Ok(answer.results)
    }
}

fn check_ack_timeout_ms(ack_timeout_ms: u64) -> Result<(), Error> {
    if ack_timeout_ms == 0 || ack_timeout_ms > MAX_ACK_TIMEOUT_MS {
        Err(Error::InvalidArgument(format!(
            "an ack time-out is 1 to {MAX_ACK_TIMEOUT_MS} ms, not {ack_timeout_ms} ms"
        )))
    } else {
        Ok(())
    }
}

fn receipt_list(receipts: &[impl AsRef<str>]) -> Result<Vec<String>, Error> {
    if receipts.is_empty() || receipts.len() > MAX_RECEIPTS {
        return Err(Error::InvalidArgument(format!(
            "a call takes 1 to {MAX_RECEIPTS} receipts, not {}",
            receipts.len()
        )));
    }
    Ok(receipts
        .iter()
        .map(|receipt| receipt.as_ref().to_string())
        .collect())
}
