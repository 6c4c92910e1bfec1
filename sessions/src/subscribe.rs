//! How a reconcile's Subscribe action goes out: plain filters in SUBSCRIBE packets of up to
//! [`BATCH`] filters, each packet with the plain filters' shared subscription identifier; every
//! shared (`$share/`) filter in a packet of its own with its own identifier, so a replay through
//! a removed shared subscription can be told from a delivery through a plain one (ADR 0027).
//! The answers come back in the order of the filters given; a filter the broker did not answer
//! (a short SUBACK, a timeout, a lost connection) has none.

use wharf_domain::session::{subscription_id, ExactFilter, Qos, SubscribeOutcome};
use wharf_mqtt::{QoS, SessionHandle, SubscribeReason};

/// The most filters one SUBSCRIBE packet carries.
pub(super) const BATCH: usize = 100;

/// SUBSCRIBEs `filters` on `handle`; one answer per filter, in order.
pub(super) async fn subscribe_all(
    handle: &SessionHandle,
    filters: &[(ExactFilter, Qos)],
) -> Vec<Option<SubscribeOutcome>> {
    let with_ids = handle.connack().subscription_identifiers_available;
    // Packets: the indexes of their filters, and the identifier they carry.
    let mut packets: Vec<(Vec<usize>, Option<u32>)> = Vec::new();
    let (shared, plain): (Vec<usize>, Vec<usize>) =
        (0..filters.len()).partition(|&i| with_ids && filters[i].0.is_shared());
    for i in shared {
        packets.push((vec![i], Some(subscription_id(&filters[i].0))));
    }
    for chunk in plain.chunks(BATCH) {
        let id = with_ids.then(|| subscription_id(&filters[chunk[0]].0));
        packets.push((chunk.to_vec(), id));
    }
    let requests = packets.iter().map(|(indexes, id)| async move {
        let packet = indexes
            .iter()
            .map(|&i| (filters[i].0.as_str().to_owned(), to_mqtt(filters[i].1)))
            .collect();
        (
            indexes,
            handle.subscribe(packet, *id).await.unwrap_or_default(),
        )
    });
    let mut answers = vec![None; filters.len()];
    for (indexes, reasons) in futures::future::join_all(requests).await {
        for (&i, reason) in indexes.iter().zip(reasons) {
            answers[i] = Some(to_outcome(reason));
        }
    }
    answers
}

fn to_mqtt(qos: Qos) -> QoS {
    match qos {
        Qos::AtMostOnce => QoS::AtMostOnce,
        Qos::AtLeastOnce => QoS::AtLeastOnce,
        Qos::ExactlyOnce => QoS::ExactlyOnce,
    }
}

fn to_outcome(reason: SubscribeReason) -> SubscribeOutcome {
    match reason.granted() {
        Some(qos) => SubscribeOutcome::Granted {
            qos: match qos {
                QoS::AtMostOnce => Qos::AtMostOnce,
                QoS::AtLeastOnce => Qos::AtLeastOnce,
                QoS::ExactlyOnce => Qos::ExactlyOnce,
            },
        },
        None => SubscribeOutcome::Refused {
            reason_code: reason.code(),
        },
    }
}
