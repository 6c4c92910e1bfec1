//! Opening a connection: TCP connect, CONNECT, CONNACK within `connect_timeout`, then the two
//! connection tasks and the handle. Each successful connect is a new generation.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rumqttc::v5::mqttbytes::v5::{
    ConnAck, Connect, ConnectProperties, ConnectReturnCode, Login, Packet,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::timeout;

use crate::codec::read_packet;
use crate::connack::ConnAckInfo;
use crate::connection::{run_reader, run_writer};
use crate::delivery::{Deliveries, Generation};
use crate::error::{DisconnectCause, MqttError};
use crate::options::ConnectOptions;
use crate::reason::{connect_reason, disconnect_reason};
use crate::session::SessionHandle;
use crate::shared::{Limits, Shared};
use crate::transport::Stream;

/// Packets queued towards the writer.
const OUTBOUND_QUEUE: usize = 1024;

/// Opens MQTT v5 sessions.
pub struct Session;

impl Session {
    /// Connects, sends CONNECT and waits for CONNACK, all within `connect_timeout`. Each call is
    /// a new generation.
    pub async fn connect(
        options: ConnectOptions,
    ) -> Result<(SessionHandle, Deliveries), MqttError> {
        options.validate()?;
        let address = options.address();
        let (stream, connack, leftover) = timeout(options.connect_timeout, handshake(&options))
            .await
            .map_err(|_| MqttError::ConnectTimeout {
                address: address.clone(),
                after: options.connect_timeout,
            })??;
        if connack.code != ConnectReturnCode::Success {
            return Err(MqttError::ConnectRefused {
                address,
                client_id: options.client_id.clone(),
                reason: connect_reason(connack.code),
            });
        }
        Ok(start(options, stream, &connack, leftover))
    }
}

async fn handshake(options: &ConnectOptions) -> Result<(Stream, ConnAck, BytesMut), MqttError> {
    let address = options.address();
    let failed = |cause| MqttError::Handshake {
        address: address.clone(),
        cause,
    };
    let tcp = TcpStream::connect(&address)
        .await
        .map_err(|source| MqttError::Connect {
            address: address.clone(),
            source,
        })?;
    tcp.set_nodelay(true)
        .map_err(|error| failed(DisconnectCause::Io(error.to_string())))?;
    let mut stream: Stream = match &options.tls {
        None => Box::new(tcp),
        Some(tls) => tls
            .wrap(&options.host, tcp)
            .await
            .map_err(|reason| failed(DisconnectCause::Io(reason)))?,
    };
    // A fresh buffer: the codec patches CONNECT's flags at an offset from the buffer's start.
    let mut out = BytesMut::new();
    connect_packet(options)
        .write(&mut out, None)
        .map_err(|error| failed(DisconnectCause::Protocol(error.to_string())))?;
    stream
        .write_all(&out)
        .await
        .map_err(|error| failed(DisconnectCause::Io(error.to_string())))?;
    let mut buffer = BytesMut::with_capacity(8 * 1024);
    loop {
        match read_packet(&mut buffer, options.max_packet_size).map_err(failed)? {
            Some(Packet::ConnAck(ack)) => return Ok((stream, ack, buffer)),
            Some(Packet::Disconnect(disconnect)) => {
                return Err(failed(DisconnectCause::BrokerDisconnect(
                    disconnect_reason(disconnect.reason_code),
                )))
            }
            Some(_) => {
                return Err(failed(DisconnectCause::Protocol(
                    "the broker's first packet is not CONNACK".to_string(),
                )))
            }
            None => {}
        }
        match stream.read_buf(&mut buffer).await {
            Ok(0) => return Err(failed(DisconnectCause::BrokerClosed)),
            Ok(_) => {}
            Err(error) => return Err(failed(DisconnectCause::Io(error.to_string()))),
        }
    }
}

fn connect_packet(options: &ConnectOptions) -> Packet {
    let mut properties = ConnectProperties::new();
    properties.session_expiry_interval = Some(options.session_expiry);
    properties.receive_maximum = Some(options.receive_maximum);
    properties.max_packet_size = Some(options.max_packet_size);
    let login = options.credentials.as_ref().map(|credentials| {
        Login::new(credentials.username(), credentials.password().unwrap_or(""))
    });
    let connect = Connect {
        keep_alive: options.keep_alive,
        client_id: options.client_id.clone(),
        clean_start: options.clean_start,
        properties: Some(properties),
    };
    Packet::Connect(connect, None, login)
}

fn start(
    options: ConnectOptions,
    stream: Stream,
    connack: &ConnAck,
    leftover: BytesMut,
) -> (SessionHandle, Deliveries) {
    let info = ConnAckInfo::new(connack, &options);
    let limits = Limits {
        broker_max_packet: info.max_packet_size,
        keep_alive: Duration::from_secs(u64::from(info.keep_alive)),
        operation_timeout: options.operation_timeout,
        max_packet_size: options.max_packet_size,
    };
    let generation = Generation::next();
    let (outbound, queue) = mpsc::channel(OUTBOUND_QUEUE);
    let shared = Arc::new(Shared::new(
        generation,
        limits,
        info.receive_maximum,
        outbound,
    ));
    let (deliveries_tx, deliveries_rx) = mpsc::channel(options.delivery_buffer);
    let deliveries = Deliveries {
        generation,
        receiver: deliveries_rx,
        closed: shared.watch_closed(),
    };
    let (read_half, write_half) = tokio::io::split(stream);
    tokio::spawn(run_reader(
        shared.clone(),
        read_half,
        leftover,
        deliveries_tx,
    ));
    tokio::spawn(run_writer(shared.clone(), write_half, queue));
    let handle = SessionHandle::new(shared, info);
    (handle, deliveries)
}
