//! The pure plan of a reconcile (`wharf sessions plan`) and the subscription identifiers Wharf
//! sends with each filter.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::session::exact_filter::{ExactFilter, Qos};
use crate::session::ledger::FilterRecord;

/// What a reconcile would do from `history` to `desired`, for `wharf sessions plan`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Written to the ledger before any SUBSCRIBE (new filters, or a new QoS).
    pub remember: Vec<(ExactFilter, Qos)>,
    /// SUBSCRIBEd on every connection: all desired filters.
    pub subscribe: Vec<(ExactFilter, Qos)>,
    /// UNSUBSCRIBEd: history minus desired.
    pub unsubscribe: Vec<ExactFilter>,
    /// Forgotten once their UNSUBACK verified removal and a recycled connection was watched.
    pub forget_after_verify: Vec<ExactFilter>,
}

/// The plan from `history` to `desired`. Pure; touches no broker. Duplicate desired entries
/// keep their highest QoS.
pub fn plan(desired: &[(ExactFilter, Qos)], history: &BTreeMap<ExactFilter, FilterRecord>) -> Plan {
    let desired = merge_desired(desired);
    let remember = to_remember(&desired, history);
    let stale: Vec<ExactFilter> = history
        .keys()
        .filter(|f| !desired.contains_key(*f))
        .cloned()
        .collect();
    Plan {
        remember,
        subscribe: desired.into_iter().collect(),
        unsubscribe: stale.clone(),
        forget_after_verify: stale,
    }
}

/// The subscription identifier every plain (non-shared) filter is subscribed with: plain
/// filters may then share one SUBSCRIBE packet (MQTT v5 allows one identifier per packet), and a
/// delivery carrying it came through a plain subscription, never a shared one.
pub const PLAIN_SUBSCRIPTION_ID: u32 = 1;

/// The MQTT v5 subscription identifier Wharf sends with `filter`: [`PLAIN_SUBSCRIPTION_ID`] for
/// a plain filter; for a shared one a stable hash of the exact string into 2..=268435455, so a
/// replay through a removed shared subscription can be attributed to it, even after a crash.
/// Two filters may share one (then both are candidates).
pub fn subscription_id(filter: &ExactFilter) -> u32 {
    const MAX_SUBSCRIPTION_ID: u32 = 268_435_455;
    if !filter.is_shared() {
        return PLAIN_SUBSCRIPTION_ID;
    }
    let digest = Sha256::digest(filter.as_str().as_bytes());
    let word = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    word % (MAX_SUBSCRIPTION_ID - 1) + 2
}

fn merge_desired(desired: &[(ExactFilter, Qos)]) -> BTreeMap<ExactFilter, Qos> {
    let mut merged: BTreeMap<ExactFilter, Qos> = BTreeMap::new();
    for (filter, qos) in desired {
        let entry = merged.entry(filter.clone()).or_insert(*qos);
        *entry = (*entry).max(*qos);
    }
    merged
}

/// Filters with the QoS they are (to be) requested at.
type Requested = Vec<(ExactFilter, Qos)>;

/// The desired filters the history does not hold at their QoS: what must be Remembered.
pub(super) fn to_remember(
    desired: &BTreeMap<ExactFilter, Qos>,
    history: &BTreeMap<ExactFilter, FilterRecord>,
) -> Requested {
    partition(desired, history).1
}

/// The desired filters split into those the history holds at their QoS (durable: they may be
/// SUBSCRIBEd at once) and the rest (to Remember first), each in filter order.
pub(super) fn partition(
    desired: &BTreeMap<ExactFilter, Qos>,
    history: &BTreeMap<ExactFilter, FilterRecord>,
) -> (Requested, Requested) {
    desired
        .iter()
        .map(|(f, q)| (f.clone(), *q))
        .partition(|(f, q)| history.get(f).and_then(|r| r.qos) == Some(*q))
}
