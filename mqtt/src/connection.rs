//! The connection's two tasks. The reader decodes packets and dispatches them: acknowledgements
//! to the waiting request of this connection, PUBLISH to the deliveries, PUBREL to an automatic
//! PUBCOMP. The writer encodes what the handles queue, batching what is ready into one write,
//! and sends PINGREQ when idle. Either ending ends the connection with a cause.

use std::sync::Arc;

use bytes::BytesMut;
use rumqttc::v5::mqttbytes::v5::{Packet, PingReq, PubComp, Publish};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

use crate::codec::{read_packet, write_packet};
use crate::delivery::{Delivery, DeliveryProperties};
use crate::error::DisconnectCause;
use crate::reason::{disconnect_reason, QoS};
use crate::shared::{Kind, Outbound, Reply, Shared};
use crate::transport::{StreamReader, StreamWriter};

/// How many queued packets one write may carry.
const WRITE_BATCH: usize = 256;

/// Runs until the connection ends; then drops the deliveries sender, after the cause is set.
pub(crate) async fn run_reader(
    shared: Arc<Shared>,
    mut socket: StreamReader,
    mut buffer: BytesMut,
    deliveries: mpsc::Sender<Delivery>,
) {
    let mut closed = shared.watch_closed();
    let cause = loop {
        if let Err(cause) = drain_frames(&shared, &mut buffer, &deliveries, &mut closed).await {
            break cause;
        }
        tokio::select! {
            biased;
            _ = ended(&mut closed) => return,
            read = socket.read_buf(&mut buffer) => match read {
                Ok(0) => break DisconnectCause::BrokerClosed,
                Ok(_) => shared.mark_read(),
                Err(error) => break DisconnectCause::Io(error.to_string()),
            },
        }
    };
    shared.close(cause);
}

/// Resolves once the connection has a cause.
pub(crate) async fn ended(closed: &mut watch::Receiver<Option<DisconnectCause>>) {
    let _ = closed.wait_for(Option::is_some).await;
}

async fn drain_frames(
    shared: &Shared,
    buffer: &mut BytesMut,
    deliveries: &mpsc::Sender<Delivery>,
    closed: &mut watch::Receiver<Option<DisconnectCause>>,
) -> Result<(), DisconnectCause> {
    while let Some(packet) = read_packet(buffer, shared.limits.max_packet_size)? {
        dispatch(shared, packet, deliveries, closed).await?;
    }
    Ok(())
}

async fn dispatch(
    shared: &Shared,
    packet: Packet,
    deliveries: &mpsc::Sender<Delivery>,
    closed: &mut watch::Receiver<Option<DisconnectCause>>,
) -> Result<(), DisconnectCause> {
    let unmatched = |error: crate::shared::Unmatched| DisconnectCause::Protocol(error.0);
    match packet {
        Packet::Publish(publish) => {
            let delivery = delivery(shared, publish)?;
            tokio::select! {
                biased;
                _ = ended(closed) => {}
                // A dropped receiver: the delivery stays unacked and the broker replays it.
                _ = deliveries.send(delivery) => {}
            }
            Ok(())
        }
        Packet::SubAck(ack) => shared
            .complete(
                ack.pkid,
                Kind::Subscribe,
                Reply::Subscribed(ack.return_codes),
            )
            .map_err(unmatched),
        Packet::UnsubAck(ack) => shared
            .complete(
                ack.pkid,
                Kind::Unsubscribe,
                Reply::Unsubscribed(ack.reasons),
            )
            .map_err(unmatched),
        Packet::PubAck(ack) => shared
            .complete(ack.pkid, Kind::Publish, Reply::Published(ack.reason))
            .map_err(unmatched),
        Packet::PubRel(release) => {
            // Also for a PUBREL replayed from an earlier connection (rumqttc #664): the PUBREC
            // went out then, so the message was handed over; completing is all that is left.
            let complete = Packet::PubComp(PubComp::new(release.pkid, None));
            send(shared, complete).await?;
            shared.count_release();
            Ok(())
        }
        Packet::PingResp(_) => {
            shared.set_ping_sent(None);
            Ok(())
        }
        Packet::Disconnect(disconnect) => Err(DisconnectCause::BrokerDisconnect(
            disconnect_reason(disconnect.reason_code),
        )),
        other => Err(DisconnectCause::Protocol(format!(
            "unexpected {} packet from the broker",
            packet_name(&other)
        ))),
    }
}

fn delivery(shared: &Shared, publish: Publish) -> Result<Delivery, DisconnectCause> {
    let topic = String::from_utf8(publish.topic.to_vec())
        .map_err(|_| DisconnectCause::Protocol("a PUBLISH topic is not UTF-8".to_string()))?;
    if topic.is_empty() {
        // We announce Topic Alias Maximum 0, so every PUBLISH must name its topic.
        return Err(DisconnectCause::Protocol(
            "a PUBLISH without a topic name (topic aliases are not accepted)".to_string(),
        ));
    }
    let qos = QoS::from_codec(publish.qos);
    let receipt = match qos {
        QoS::AtMostOnce => 0,
        QoS::AtLeastOnce | QoS::ExactlyOnce => shared.receive(publish.pkid),
    };
    let properties = publish.properties.map(properties).unwrap_or_default();
    Ok(Delivery {
        generation: shared.generation,
        pkid: publish.pkid,
        topic,
        payload: publish.payload,
        qos,
        dup: publish.dup,
        retain: publish.retain,
        properties,
        receipt,
    })
}

fn properties(properties: rumqttc::v5::mqttbytes::v5::PublishProperties) -> DeliveryProperties {
    DeliveryProperties {
        payload_format_indicator: properties.payload_format_indicator,
        message_expiry_interval: properties.message_expiry_interval,
        content_type: properties.content_type,
        response_topic: properties.response_topic,
        correlation_data: properties.correlation_data,
        user_properties: properties.user_properties,
        subscription_identifiers: properties
            .subscription_identifiers
            .into_iter()
            .map(|id| u32::try_from(id).unwrap_or(u32::MAX))
            .collect(),
    }
}

async fn send(shared: &Shared, packet: Packet) -> Result<(), DisconnectCause> {
    shared
        .outbound
        .send(Outbound::Packet(Box::new(packet)))
        .await
        .map_err(|_| shared.cause().unwrap_or(DisconnectCause::HandleDropped))
}

fn packet_name(packet: &Packet) -> &'static str {
    match packet {
        Packet::Auth(_) => "AUTH",
        Packet::Connect(..) => "CONNECT",
        Packet::ConnAck(_) => "CONNACK",
        Packet::Publish(_) => "PUBLISH",
        Packet::PubAck(_) => "PUBACK",
        Packet::PingReq(_) => "PINGREQ",
        Packet::PingResp(_) => "PINGRESP",
        Packet::Subscribe(_) => "SUBSCRIBE",
        Packet::SubAck(_) => "SUBACK",
        Packet::PubRec(_) => "PUBREC (we send no QoS 2 PUBLISH)",
        Packet::PubRel(_) => "PUBREL",
        Packet::PubComp(_) => "PUBCOMP (we send no QoS 2 PUBLISH)",
        Packet::Unsubscribe(_) => "UNSUBSCRIBE",
        Packet::UnsubAck(_) => "UNSUBACK",
        Packet::Disconnect(_) => "DISCONNECT",
    }
}

/// Writes what the handles queue until the connection ends.
pub(crate) async fn run_writer(
    shared: Arc<Shared>,
    socket: StreamWriter,
    mut queue: mpsc::Receiver<Outbound>,
) {
    let mut writer = Writer {
        closed: shared.watch_closed(),
        shared,
        socket,
        buffer: BytesMut::with_capacity(64 * 1024),
        last_write: Instant::now(),
    };
    let keep_alive = writer.shared.limits.keep_alive;
    let mut closed = writer.shared.watch_closed();
    loop {
        let ping_due = writer.ping_due();
        let step = tokio::select! {
            biased;
            _ = ended(&mut closed) => break,
            next = queue.recv() => match next {
                Some(first) => writer.write_batch(first, &mut queue).await,
                None => break,
            },
            _ = sleep_until(ping_due), if !keep_alive.is_zero() => writer.keep_alive().await,
        };
        match step {
            Ok(true) => {}
            Ok(false) => break,
            Err(cause) => {
                writer.shared.close(cause);
                break;
            }
        }
    }
    let _ = writer.socket.shutdown().await;
}

struct Writer {
    shared: Arc<Shared>,
    socket: StreamWriter,
    buffer: BytesMut,
    closed: watch::Receiver<Option<DisconnectCause>>,
    last_write: Instant,
}

impl Writer {
    /// When the next PINGREQ is due (nothing written or read for a keep alive), or, with one
    /// outstanding, when its PINGRESP is overdue.
    fn ping_due(&self) -> Instant {
        let keep_alive = self.shared.limits.keep_alive;
        match self.shared.ping_sent() {
            Some(sent) => sent + keep_alive,
            None => self.last_write.min(self.shared.last_read()) + keep_alive,
        }
    }

    /// Ok(true) to go on; an error when a PINGRESP is overdue.
    async fn keep_alive(&mut self) -> Result<bool, DisconnectCause> {
        if Instant::now() < self.ping_due() {
            // Something was read since the timer was set.
            return Ok(true);
        }
        if self.shared.ping_sent().is_some() {
            return Err(DisconnectCause::KeepAliveTimeout);
        }
        self.buffer.clear();
        encode(&self.shared, &Packet::PingReq(PingReq), &mut self.buffer)?;
        self.flush().await?;
        self.shared.set_ping_sent(Some(self.last_write));
        Ok(true)
    }

    /// Writes `first` and whatever else is queued; Ok(false) after a DISCONNECT.
    async fn write_batch(
        &mut self,
        first: Outbound,
        queue: &mut mpsc::Receiver<Outbound>,
    ) -> Result<bool, DisconnectCause> {
        self.buffer.clear();
        let mut next = Some(first);
        let mut count = 0;
        while let Some(outbound) = next.take() {
            match outbound {
                Outbound::Packet(packet) => encode(&self.shared, &packet, &mut self.buffer)?,
                Outbound::Disconnect(bytes, cause, written) => {
                    self.buffer.extend_from_slice(&bytes);
                    self.flush().await?;
                    self.shared.close(cause);
                    let _ = written.send(());
                    return Ok(false);
                }
            }
            count += 1;
            if count < WRITE_BATCH && self.buffer.len() < 64 * 1024 {
                next = queue.try_recv().ok();
            }
        }
        self.flush().await?;
        Ok(true)
    }

    /// Writes the buffer; gives up as soon as the connection has ended some other way (a
    /// broker that stopped reading must not hold this task).
    async fn flush(&mut self) -> Result<(), DisconnectCause> {
        let written = tokio::select! {
            biased;
            _ = ended(&mut self.closed) => {
                return Err(self.shared.cause().unwrap_or(DisconnectCause::HandleDropped))
            }
            written = self.socket.write_all(&self.buffer) => written,
        };
        written.map_err(|error| DisconnectCause::Io(error.to_string()))?;
        self.buffer.clear();
        self.last_write = Instant::now();
        Ok(())
    }
}

fn encode(shared: &Shared, packet: &Packet, buffer: &mut BytesMut) -> Result<(), DisconnectCause> {
    write_packet(packet, buffer, shared.limits.broker_max_packet)
        .map(|_| ())
        .map_err(|error| DisconnectCause::Protocol(format!("cannot encode a packet: {error}")))
}
