//! The handle that drives one connection: SUBSCRIBE and UNSUBSCRIBE with per-filter reason
//! codes, QoS 0/1 publish, manual acks fenced by generation, and DISCONNECT.

use std::sync::Arc;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{
    Filter, Packet, PubAck, PubRec, Publish, Subscribe, SubscribeProperties, Unsubscribe,
};
use tokio::sync::oneshot;
use tokio::time::timeout;

use crate::codec::disconnect_bytes;
use crate::connack::ConnAckInfo;
use crate::delivery::{Delivery, Generation};
use crate::error::{DisconnectCause, MqttError};
use crate::reason::{
    disconnect_reason, puback_reason, DisconnectReason, QoS, SubscribeReason, UnsubscribeReason,
};
use crate::shared::{Kind, Outbound, Reply, Shared, TakeFailure};

/// The largest Subscription Identifier (a variable byte integer).
const MAX_SUBSCRIPTION_ID: u32 = 268_435_455;

/// What `SessionHandle::ack` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// PUBACK (QoS 1) or PUBREC (QoS 2) was queued on the connection that received it.
    Sent,
    /// The delivery came from another connection, or this one has ended: nothing was sent.
    /// The broker will replay it on a later connection of the session.
    StaleConnection,
    /// This delivery was acked already (or a newer receipt of its packet id replaced it):
    /// nothing was sent.
    AlreadyAcked,
    /// QoS 0 has no acknowledgement: nothing was sent.
    NotRequired,
}

struct Inner {
    shared: Arc<Shared>,
    info: ConnAckInfo,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.close(DisconnectCause::HandleDropped);
    }
}

/// Drives one connection; clones share it. Dropping the last clone closes the socket.
#[derive(Clone)]
pub struct SessionHandle {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle")
            .field("generation", &self.inner.shared.generation)
            .finish_non_exhaustive()
    }
}

impl SessionHandle {
    pub(crate) fn new(shared: Arc<Shared>, info: ConnAckInfo) -> SessionHandle {
        SessionHandle {
            inner: Arc::new(Inner { shared, info }),
        }
    }

    /// This connection's generation.
    pub fn generation(&self) -> Generation {
        self.inner.shared.generation
    }

    /// What CONNACK said.
    pub fn connack(&self) -> &ConnAckInfo {
        &self.inner.info
    }

    /// Why the connection ended, once it has.
    pub fn disconnected(&self) -> Option<DisconnectCause> {
        self.inner.shared.cause()
    }

    /// Requests (SUBSCRIBE, UNSUBSCRIBE, QoS 1 PUBLISH) sent and not yet acknowledged; never more
    /// than the broker's Receive Maximum. A request whose caller timed out stays counted until
    /// its acknowledgement arrives, because its packet id is still in use.
    pub fn in_flight(&self) -> usize {
        self.inner.shared.in_flight()
    }

    /// How many PUBRELs this connection answered with PUBCOMP (replayed ones included).
    pub fn releases_completed(&self) -> u64 {
        self.inner.shared.releases()
    }

    /// Waits until the connection ends and returns why.
    pub async fn closed(&self) -> DisconnectCause {
        let mut closed = self.inner.shared.watch_closed();
        crate::connection::ended(&mut closed).await;
        let cause = closed.borrow().clone();
        cause.unwrap_or(DisconnectCause::HandleDropped)
    }

    /// One SUBSCRIBE carrying every filter; the SUBACK's reason codes in filter order. A short
    /// SUBACK gives a shorter list: the filters past its end have no outcome. Bounded by
    /// `operation_timeout`, including the wait for a free packet id.
    pub async fn subscribe(
        &self,
        filters: Vec<(String, QoS)>,
        subscription_id: Option<u32>,
    ) -> Result<Vec<SubscribeReason>, MqttError> {
        check_filters("SUBSCRIBE", filters.iter().map(|(filter, _)| filter))?;
        if let Some(id) = subscription_id {
            if id == 0 || id > MAX_SUBSCRIPTION_ID {
                return Err(MqttError::InvalidInput {
                    field: "subscription identifier",
                    value: id.to_string(),
                    reason: "must be 1 to 268435455",
                });
            }
        }
        let sent = filters.len();
        let mut subscribe = Subscribe {
            pkid: 0,
            filters: filters
                .into_iter()
                .map(|(path, qos)| Filter::new(path, qos.to_codec()))
                .collect(),
            properties: subscription_id.map(|id| SubscribeProperties {
                id: Some(id as usize),
                user_properties: Vec::new(),
            }),
        };
        self.check_size(Kind::Subscribe, subscribe.size())?;
        let reply = self
            .request(Kind::Subscribe, move |pkid| {
                subscribe.pkid = pkid;
                Packet::Subscribe(subscribe)
            })
            .await?;
        match reply {
            Reply::Subscribed(codes) => reasons("SUBACK", sent, codes, SubscribeReason::from_codec),
            _ => Err(self.mismatch(Kind::Subscribe)),
        }
    }

    /// One UNSUBSCRIBE carrying every filter, exactly as given; the UNSUBACK's reason codes in
    /// filter order (a short UNSUBACK gives a shorter list).
    pub async fn unsubscribe(
        &self,
        filters: Vec<String>,
    ) -> Result<Vec<UnsubscribeReason>, MqttError> {
        check_filters("UNSUBSCRIBE", filters.iter())?;
        let sent = filters.len();
        let mut unsubscribe = Unsubscribe {
            pkid: 0,
            filters,
            properties: None,
        };
        self.check_size(Kind::Unsubscribe, unsubscribe.size())?;
        let reply = self
            .request(Kind::Unsubscribe, move |pkid| {
                unsubscribe.pkid = pkid;
                Packet::Unsubscribe(unsubscribe)
            })
            .await?;
        match reply {
            Reply::Unsubscribed(codes) => {
                reasons("UNSUBACK", sent, codes, UnsubscribeReason::from_codec)
            }
            _ => Err(self.mismatch(Kind::Unsubscribe)),
        }
    }

    /// Publishes at QoS 0 (queued) or QoS 1 (waits for PUBACK within `operation_timeout`).
    pub async fn publish(
        &self,
        topic: &str,
        payload: impl Into<Bytes>,
        qos: QoS,
        retain: bool,
    ) -> Result<(), MqttError> {
        check_topic(topic)?;
        if qos == QoS::ExactlyOnce || qos > self.inner.info.maximum_qos {
            return Err(MqttError::InvalidInput {
                field: "publish QoS",
                value: qos.level().to_string(),
                reason: "this driver publishes at QoS 0 or 1, within the broker's maximum QoS",
            });
        }
        let mut publish = Publish::new(topic, qos.to_codec(), payload.into(), None);
        publish.retain = retain;
        publish.pkid = u16::from(qos != QoS::AtMostOnce);
        self.check_size(Kind::Publish, publish.size())?;
        if qos == QoS::AtMostOnce {
            publish.pkid = 0;
            return self.send_unacknowledged(Packet::Publish(publish)).await;
        }
        let reply = self
            .request(Kind::Publish, move |pkid| {
                publish.pkid = pkid;
                Packet::Publish(publish)
            })
            .await?;
        let Reply::Published(reason) = reply else {
            return Err(self.mismatch(Kind::Publish));
        };
        let reason = puback_reason(reason);
        if reason.code >= 0x80 {
            return Err(MqttError::PublishRefused {
                topic: topic.to_string(),
                reason,
            });
        }
        Ok(())
    }

    /// Acknowledges a QoS 1 (PUBACK) or QoS 2 (PUBREC) delivery, only on the connection that
    /// received it and only once; otherwise sends nothing and says why.
    pub async fn ack(&self, delivery: &Delivery) -> AckOutcome {
        let shared = &self.inner.shared;
        let packet = match delivery.qos {
            QoS::AtMostOnce => return AckOutcome::NotRequired,
            QoS::AtLeastOnce => Packet::PubAck(PubAck::new(delivery.pkid, None)),
            QoS::ExactlyOnce => Packet::PubRec(PubRec::new(delivery.pkid, None)),
        };
        if delivery.generation != shared.generation {
            return AckOutcome::StaleConnection;
        }
        match shared.take_receipt(delivery.pkid, delivery.receipt) {
            Err(TakeFailure::Ended) => return AckOutcome::StaleConnection,
            Err(TakeFailure::NotInFlight) => return AckOutcome::AlreadyAcked,
            Ok(()) => {}
        }
        match shared
            .outbound
            .send(Outbound::Packet(Box::new(packet)))
            .await
        {
            Ok(()) => AckOutcome::Sent,
            Err(_) => AckOutcome::StaleConnection,
        }
    }

    /// Sends DISCONNECT with `reason` after everything queued before it, then closes.
    pub async fn disconnect(&self, reason: DisconnectReason) -> Result<(), MqttError> {
        let shared = &self.inner.shared;
        let cause = DisconnectCause::Local(disconnect_reason(reason.to_codec()));
        let (written, done) = oneshot::channel();
        let outbound =
            Outbound::Disconnect(disconnect_bytes(reason.to_codec()), cause.clone(), written);
        let after = shared.limits.operation_timeout;
        let sent = timeout(after, async {
            shared.outbound.send(outbound).await.is_ok() && done.await.is_ok()
        })
        .await;
        match sent {
            Ok(true) => Ok(()),
            Ok(false) => Err(MqttError::Disconnected {
                operation: "DISCONNECT",
                cause: shared.cause().unwrap_or(DisconnectCause::HandleDropped),
            }),
            Err(_) => {
                shared.close(cause);
                Err(MqttError::Timeout {
                    operation: "DISCONNECT",
                    after,
                })
            }
        }
    }

    async fn request(
        &self,
        kind: Kind,
        build: impl FnOnce(u16) -> Packet,
    ) -> Result<Reply, MqttError> {
        let shared = &self.inner.shared;
        let work = async {
            let permit = shared
                .permits
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| self.ended(kind.name()))?;
            let slot = shared
                .outbound
                .reserve()
                .await
                .map_err(|_| self.ended(kind.name()))?;
            // Registered and queued with no await in between: a timeout cannot leave an id
            // registered for a packet that was never sent.
            let (pkid, reply) =
                shared
                    .register(kind, permit)
                    .map_err(|cause| MqttError::Disconnected {
                        operation: kind.name(),
                        cause,
                    })?;
            slot.send(Outbound::Packet(Box::new(build(pkid))));
            reply.await.map_err(|_| self.ended(kind.name()))
        };
        let after = shared.limits.operation_timeout;
        timeout(after, work).await.map_err(|_| MqttError::Timeout {
            operation: kind.name(),
            after,
        })?
    }

    async fn send_unacknowledged(&self, packet: Packet) -> Result<(), MqttError> {
        let shared = &self.inner.shared;
        let after = shared.limits.operation_timeout;
        match timeout(
            after,
            shared.outbound.send(Outbound::Packet(Box::new(packet))),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(self.ended("PUBLISH")),
            Err(_) => Err(MqttError::Timeout {
                operation: "PUBLISH",
                after,
            }),
        }
    }

    fn check_size(&self, kind: Kind, size: usize) -> Result<(), MqttError> {
        match self.inner.info.max_packet_size {
            Some(max) if size > max as usize => Err(MqttError::PacketTooLarge {
                operation: kind.name(),
                size,
                max,
            }),
            _ => Ok(()),
        }
    }

    fn ended(&self, operation: &'static str) -> MqttError {
        MqttError::Disconnected {
            operation,
            cause: self
                .inner
                .shared
                .cause()
                .unwrap_or(DisconnectCause::HandleDropped),
        }
    }

    fn mismatch(&self, kind: Kind) -> MqttError {
        let cause =
            DisconnectCause::Protocol(format!("a {} got the wrong acknowledgement", kind.name()));
        self.inner.shared.close(cause.clone());
        MqttError::Disconnected {
            operation: kind.name(),
            cause,
        }
    }
}

/// The reason codes in order; more codes than filters is a broken acknowledgement.
fn reasons<C, T>(
    operation: &'static str,
    sent: usize,
    codes: Vec<C>,
    map: impl Fn(C) -> T,
) -> Result<Vec<T>, MqttError> {
    if codes.len() > sent {
        return Err(MqttError::AckLength {
            operation,
            sent,
            received: codes.len(),
        });
    }
    Ok(codes.into_iter().map(map).collect())
}

fn check_filters<'a>(
    operation: &'static str,
    mut filters: impl ExactSizeIterator<Item = &'a String>,
) -> Result<(), MqttError> {
    if filters.len() == 0 {
        return Err(MqttError::InvalidInput {
            field: "filter list",
            value: String::new(),
            reason: if operation == "SUBSCRIBE" {
                "a SUBSCRIBE needs at least one filter"
            } else {
                "an UNSUBSCRIBE needs at least one filter"
            },
        });
    }
    match filters.find(|filter| filter.is_empty() || filter.len() > 65535 || filter.contains('\0'))
    {
        Some(filter) => Err(MqttError::InvalidInput {
            field: "topic filter",
            value: filter.chars().take(200).collect(),
            reason: "must be 1 to 65535 bytes without NUL",
        }),
        None => Ok(()),
    }
}

fn check_topic(topic: &str) -> Result<(), MqttError> {
    if topic.is_empty() || topic.len() > 65535 || topic.contains(['\0', '+', '#']) {
        return Err(MqttError::InvalidInput {
            field: "topic name",
            value: topic.chars().take(200).collect(),
            reason: "must be 1 to 65535 bytes without NUL or wildcards",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rumqttc::v5::mqttbytes::v5::SubscribeReasonCode;
    use rumqttc::v5::mqttbytes::QoS as CodecQoS;

    #[test]
    fn a_short_suback_is_reported_short_and_a_long_one_refused() {
        let short = reasons(
            "SUBACK",
            3,
            vec![
                SubscribeReasonCode::Success(CodecQoS::AtLeastOnce),
                SubscribeReasonCode::NotAuthorized,
            ],
            SubscribeReason::from_codec,
        )
        .unwrap();
        assert_eq!(
            short,
            vec![
                SubscribeReason::Granted(QoS::AtLeastOnce),
                SubscribeReason::NotAuthorized
            ]
        );
        let long = reasons(
            "SUBACK",
            1,
            vec![SubscribeReasonCode::QuotaExceeded; 2],
            SubscribeReason::from_codec,
        )
        .unwrap_err();
        assert_eq!(
            long.to_string(),
            "MQTT SUBACK of 1 filters got 2 reason codes"
        );
    }

    #[test]
    fn empty_lists_and_filters_are_refused_by_name() {
        let none: Vec<String> = Vec::new();
        let error = check_filters("UNSUBSCRIBE", none.iter()).unwrap_err();
        assert!(error.to_string().contains("filter list"), "{error}");
        let filters = ["a/#".to_string(), String::new()];
        let error = check_filters("SUBSCRIBE", filters.iter()).unwrap_err();
        assert!(error.to_string().contains("topic filter"), "{error}");
        assert!(check_topic("a/+").is_err());
        assert!(check_topic("a/b").is_ok());
    }
}
