//! What this process's pruner and message log retention deleted.

use prometheus::{IntCounter, IntCounterVec, Registry};

use crate::register::{counter, counter_vec};

/// The pruner's and retention's counters (no labels beyond what they delete).
#[derive(Clone)]
pub struct MaintenanceFamilies {
    attempts: IntCounter,
    messages: IntCounter,
    orphaned: IntCounter,
    set_aside: IntCounter,
    runs: IntCounterVec,
}

impl MaintenanceFamilies {
    pub(crate) fn new(registry: &Registry) -> Self {
        Self {
            attempts: counter(
                registry,
                "wharf_prune_superseded_attempts_deleted_total",
                "Superseded waiting attempts the pruner deleted from the declaration ledger.",
            ),
            messages: counter(
                registry,
                "wharf_retention_messages_deleted_total",
                "Messages retention deleted from the log.",
            ),
            orphaned: counter(
                registry,
                "wharf_retention_orphaned_deliveries_deleted_total",
                "Deliveries of groups with no live instance whose messages aged out.",
            ),
            set_aside: counter(
                registry,
                "wharf_retention_set_aside_dropped_total",
                "Deliveries set aside by a swap whose messages aged out before a rollback \
                 restored them.",
            ),
            runs: counter_vec(
                registry,
                "wharf_maintenance_runs_total",
                "Pruner and retention passes this process finished, by task.",
                &["task"],
            ),
        }
    }

    /// One finished prune pass that deleted `deleted` superseded attempts.
    pub fn pruned(&self, deleted: u64) {
        self.attempts.inc_by(deleted);
        self.runs.with_label_values(&["prune"]).inc();
    }

    /// One finished retention pass.
    pub fn retained(&self, messages: u64, orphaned_deliveries: u64, set_aside_dropped: u64) {
        self.messages.inc_by(messages);
        self.orphaned.inc_by(orphaned_deliveries);
        self.set_aside.inc_by(set_aside_dropped);
        self.runs.with_label_values(&["retention"]).inc();
    }
}
