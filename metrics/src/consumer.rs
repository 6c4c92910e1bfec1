//! What this process's consumers and publishers did: counters per group and per topic.

use prometheus::{IntCounter, IntCounterVec, Registry};

use crate::register::counter_vec;

/// The consumers' counter families, labelled by group and topic.
#[derive(Clone)]
pub struct ConsumerFamilies {
    claims: IntCounterVec,
    acks: IntCounterVec,
    nacks: IntCounterVec,
    dead_lettered: IntCounterVec,
    claims_lost: IntCounterVec,
}

impl ConsumerFamilies {
    pub(crate) fn new(registry: &Registry) -> Self {
        let labels = &["group", "topic"];
        Self {
            claims: counter_vec(
                registry,
                "wharf_claims_total",
                "Messages this process's consumers claimed.",
                labels,
            ),
            acks: counter_vec(
                registry,
                "wharf_acks_total",
                "Messages this process's consumers acked (the ack settled the claim).",
                labels,
            ),
            nacks: counter_vec(
                registry,
                "wharf_nacks_total",
                "Messages this process's consumers nacked after a handler failure (retried or \
                 dead-lettered).",
                labels,
            ),
            dead_lettered: counter_vec(
                registry,
                "wharf_dead_lettered_total",
                "Messages this process's nacks moved to the group's dead letters.",
                labels,
            ),
            claims_lost: counter_vec(
                registry,
                "wharf_claims_lost_total",
                "Acks and nacks of this process that found their claim expired and taken over.",
                labels,
            ),
        }
    }

    /// The group's series, resolved once: each count through them is one atomic increment.
    pub fn for_group(&self, group: &str, topic: &str) -> GroupCounters {
        let labels = [group, topic];
        GroupCounters {
            claims: self.claims.with_label_values(&labels),
            acks: self.acks.with_label_values(&labels),
            nacks: self.nacks.with_label_values(&labels),
            dead_lettered: self.dead_lettered.with_label_values(&labels),
            claims_lost: self.claims_lost.with_label_values(&labels),
        }
    }
}

/// One group's consumer counters (shared by every consumer of the group in this process).
#[derive(Clone)]
pub struct GroupCounters {
    claims: IntCounter,
    acks: IntCounter,
    nacks: IntCounter,
    dead_lettered: IntCounter,
    claims_lost: IntCounter,
}

impl GroupCounters {
    /// `n` messages claimed.
    pub fn claimed(&self, n: u64) {
        self.claims.inc_by(n);
    }

    /// One ack that settled its claim.
    pub fn acked(&self) {
        self.acks.inc();
    }

    /// One nack that took effect; `dead` when it moved the message to the dead letters.
    pub fn nacked(&self, dead: bool) {
        self.nacks.inc();
        if dead {
            self.dead_lettered.inc();
        }
    }

    /// One ack or nack that found its claim taken over.
    pub fn claim_lost(&self) {
        self.claims_lost.inc();
    }
}

/// Messages published by this process, per topic.
#[derive(Clone)]
pub struct PublishFamilies {
    messages: IntCounterVec,
}

impl PublishFamilies {
    pub(crate) fn new(registry: &Registry) -> Self {
        Self {
            messages: counter_vec(
                registry,
                "wharf_published_messages_total",
                "Messages this process published (committed), per topic.",
                &["topic"],
            ),
        }
    }

    /// `n` messages published to `topic` in one committed batch. One label lookup per batch.
    pub fn published(&self, topic: &str, n: u64) {
        self.messages.with_label_values(&[topic]).inc_by(n);
    }
}
