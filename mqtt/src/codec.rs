//! Framing over rumqttc's v5 codec (`Packet::read`/`Packet::write`). We frame with the codec's
//! `check` first, so a decode error inside a complete frame is a protocol error and never taken
//! for "need more bytes", and we decode DISCONNECT ourselves: the codec refuses the zero-length
//! form (normal disconnection) and a reason-only one.

use bytes::BytesMut;
use rumqttc::v5::mqttbytes::v5::{check, Disconnect, DisconnectReasonCode, Packet, PacketType};
use rumqttc::v5::mqttbytes::Error as CodecError;

use crate::error::DisconnectCause;

/// One decoded frame, or a protocol error that ends the connection.
pub(crate) fn read_packet(
    buffer: &mut BytesMut,
    max_size: u32,
) -> Result<Option<Packet>, DisconnectCause> {
    let header = match check(buffer.iter(), Some(max_size)) {
        Ok(header) => header,
        Err(CodecError::InsufficientBytes(_)) => return Ok(None),
        Err(error) => return Err(protocol(error)),
    };
    if header.packet_type().map_err(protocol)? == PacketType::Disconnect {
        let frame = buffer.split_to(header.frame_length());
        return decode_disconnect(&frame).map(Some);
    }
    Packet::read(buffer, Some(max_size))
        .map(Some)
        .map_err(protocol)
}

fn decode_disconnect(frame: &[u8]) -> Result<Packet, DisconnectCause> {
    let mut index = 1;
    while frame.get(index).is_some_and(|byte| byte & 0x80 != 0) {
        index += 1;
    }
    let reason = match frame.get(index + 1) {
        None => DisconnectReasonCode::NormalDisconnection,
        Some(&byte) => DisconnectReasonCode::try_from(byte).map_err(|_| {
            DisconnectCause::Protocol(format!("unknown DISCONNECT reason code 0x{byte:02X}"))
        })?,
    };
    Ok(Packet::Disconnect(Disconnect {
        reason_code: reason,
        properties: None,
    }))
}

/// Appends the packet's encoding; refuses one larger than the broker's maximum.
pub(crate) fn write_packet(
    packet: &Packet,
    buffer: &mut BytesMut,
    broker_max: Option<u32>,
) -> Result<usize, CodecError> {
    packet.write(buffer, broker_max)
}

/// Our DISCONNECT, encoded here: the codec writes any reason with an empty property set as
/// 0x00 (normal), and one without properties with a stray byte past its remaining length.
pub(crate) fn disconnect_bytes(reason: DisconnectReasonCode) -> [u8; 4] {
    [0xE0, 0x02, reason as u8, 0x00]
}

fn protocol(error: CodecError) -> DisconnectCause {
    DisconnectCause::Protocol(error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rumqttc::v5::mqttbytes::v5::{PubAck, SubAck, SubscribeReasonCode};
    use rumqttc::v5::mqttbytes::QoS;

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let mut encoded = BytesMut::new();
        let suback = SubAck {
            pkid: 9,
            return_codes: vec![SubscribeReasonCode::Success(QoS::AtLeastOnce)],
            properties: None,
        };
        Packet::SubAck(suback.clone())
            .write(&mut encoded, None)
            .unwrap();
        let mut partial = BytesMut::from(&encoded[..encoded.len() - 1]);
        assert_eq!(read_packet(&mut partial, 1024).unwrap(), None);
        partial.extend_from_slice(&encoded[encoded.len() - 1..]);
        assert_eq!(
            read_packet(&mut partial, 1024).unwrap(),
            Some(Packet::SubAck(suback))
        );
        assert!(partial.is_empty());
    }

    #[test]
    fn every_disconnect_form_decodes() {
        let normal = [0xE0, 0x00];
        let reason_only = [0xE0, 0x01, 0x8B];
        let with_properties = [0xE0, 0x02, 0x8E, 0x00];
        let expected = [
            DisconnectReasonCode::NormalDisconnection,
            DisconnectReasonCode::ServerShuttingDown,
            DisconnectReasonCode::SessionTakenOver,
        ];
        for (bytes, reason) in [&normal[..], &reason_only, &with_properties]
            .into_iter()
            .zip(expected)
        {
            let mut buffer = BytesMut::from(bytes);
            let packet = read_packet(&mut buffer, 1024).unwrap().unwrap();
            assert_eq!(
                packet,
                Packet::Disconnect(Disconnect {
                    reason_code: reason,
                    properties: None
                })
            );
        }
    }

    #[test]
    fn our_disconnect_encodings_are_exact_and_read_back() {
        for reason in [
            DisconnectReasonCode::DisconnectWithWillMessage,
            DisconnectReasonCode::NormalDisconnection,
        ] {
            let bytes = disconnect_bytes(reason);
            assert_eq!(bytes, [0xE0, 0x02, reason as u8, 0x00]);
            let mut buffer = BytesMut::from(&bytes[..]);
            assert_eq!(
                read_packet(&mut buffer, 1024).unwrap(),
                Some(Packet::Disconnect(Disconnect {
                    reason_code: reason,
                    properties: None
                }))
            );
            assert!(buffer.is_empty());
        }
    }

    #[test]
    fn a_bad_packet_inside_a_whole_frame_is_a_protocol_error() {
        // A SUBACK whose reason code 0x05 does not exist.
        let mut buffer = BytesMut::from(&[0x90, 0x04, 0x00, 0x01, 0x00, 0x05][..]);
        assert!(matches!(
            read_packet(&mut buffer, 1024),
            Err(DisconnectCause::Protocol(_))
        ));
        let mut buffer = BytesMut::new();
        Packet::PubAck(PubAck::new(3, None))
            .write(&mut buffer, None)
            .unwrap();
        let too_small = 1;
        assert!(read_packet(&mut buffer, too_small).is_err());
    }
}
