//! The deferred pruner's entry point: the store's ledger maintenance
//! ([`wharf_store::prune`], ADR 0075) run with the two rules below, which name the aggregates
//! and event types by the domain's constants. It writes no projection row: each rule deletes
//! only events whose deletion leaves every projector's fold unchanged, so the inline rows
//! (`effective_declaration`, `open_wait`, `session_lease`) need no change and a rebuild from
//! the pruned ledger reproduces every table.
//!
//! Retention rule: a `DeclarationWaiting` event is superseded when the same declarer has a newer
//! event in the same group (a later retry, or its own install). Superseded attempts older than
//! the retention are deleted in bounded batches. Never deleted: an installed event, and the
//! newest event of any declarer (so an open or dead waiter keeps its newest row, which carries
//! when its wait began, and `open_wait` and `declarer_attempt` replay the same). Because each
//! aggregate's newest event is some declarer's newest, the next append's sequence is
//! unaffected. Concurrent writers only add newer rows, and a row is deleted only when a newer
//! one exists that itself is never the last to go, so concurrent pruners and writers are safe.
//!
//! Lease rule: a `LeaseRenewed` is superseded when a later event of the same lease stream sets
//! the expiry again or ends the ownership (a later renew, an acquire, a release or an observed
//! expiry). Superseded renewals older than the retention are deleted: the fold of what remains,
//! and so the `session_lease` row a rebuild gives, is unchanged, and the stream's newest event
//! is never deleted. A lease renewed every 6 s thus keeps about one retention's worth of
//! renewals (14,400 a day) whatever its age; acquires, releases, losses and expiries stay.
//!
//! A dry run counts and deletes nothing; the pruner refuses on a store migrated by a newer
//! build.

use wharf_domain::declaration::{self, DECLARER_FIELD};
use wharf_domain::lease::ledger::event_types as lease;
use wharf_domain::LEASE_AGGREGATE;
use wharf_store::{Store, StoreError, Superseded};

pub use wharf_store::prune::{PruneOptions, PruneReport};

/// What the pruner deletes: superseded waiting attempts and superseded lease renewals.
pub const RULES: [Superseded; 2] = [
    Superseded::by_same_field(
        declaration::AGGREGATE_TYPE,
        declaration::event_types::WAITING,
        DECLARER_FIELD,
    ),
    Superseded::by_event_types(
        LEASE_AGGREGATE,
        lease::RENEWED,
        &[
            lease::RENEWED,
            lease::ACQUIRED,
            lease::RELEASED,
            lease::EXPIRED,
        ],
    ),
];

/// Runs the pruner once with [`RULES`]. Refused on a store migrated by a newer build.
pub async fn prune(store: &Store, options: PruneOptions) -> Result<PruneReport, StoreError> {
    store.prune(&RULES, options).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_retention_beyond_the_clock_prunes_nothing_instead_of_failing() {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = wharf_store::SqliteStore::open(dir.path().join("w.db"), Vec::new())
            .await
            .unwrap();
        sqlite.migrate().await.unwrap();
        let report = prune(
            &Store::Sqlite(sqlite),
            PruneOptions {
                retention: std::time::Duration::MAX,
                dry_run: false,
                batch: 10,
            },
        )
        .await
        .unwrap();
        assert_eq!((report.eligible, report.deleted), (0, 0));
        assert_eq!(report.cutoff, chrono::DateTime::<chrono::Utc>::MIN_UTC);
    }

    #[test]
    fn the_rules_name_the_stored_aggregates_and_event_types() {
        let named = RULES.map(|rule| (rule.aggregate_type(), rule.event_type()));
        assert_eq!(
            named,
            [
                ("consumer_group", "DeclarationWaiting"),
                ("session_lease", "LeaseRenewed")
            ]
        );
        assert_eq!(
            RULES[1].by(),
            wharf_store::SupersededBy::EventTypes(&[
                "LeaseRenewed",
                "LeaseAcquired",
                "LeaseReleased",
                "LeaseExpired"
            ]),
            "a loss sets no expiry and ends nothing: it supersedes no renewal"
        );
    }
}
