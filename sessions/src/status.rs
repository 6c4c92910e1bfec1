//! A session's status as its runtime reports it (level, why it is below Full, the last
//! reconcile outcome, an exclusive session's lease), published on a watch channel for
//! readiness, the REST API and tests. A run (`run.rs`) and an exclusive session's lease
//! holding (`exclusive.rs`) write it; the supervision (`runtime.rs`) starts and hands it out.

use serde::Serialize;
use wharf_domain::session::{Reconciler, SessionLevel};

/// The outcome of the newest reconcile attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReconcileOutcome {
    /// True once every desired filter was granted and the history matched.
    pub converged: bool,
    /// What happened, for people.
    pub detail: String,
}

/// A session's state as its runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionStatus {
    /// The session's configured name.
    pub name: String,
    /// Its durable identity.
    pub session_id: String,
    /// The identity, for people (no credentials).
    pub identity: String,
    /// The readiness level; only `full` is ready.
    pub level: SessionLevel,
    /// Why it is below Full, when it is.
    pub reason: Option<String>,
    /// The newest connection's generation.
    pub generation: Option<u64>,
    /// History filters not desired, awaiting removal.
    pub pending_stale: Vec<String>,
    /// The newest reconcile attempt's outcome.
    pub last_reconcile: Option<ReconcileOutcome>,
    /// Messages handed to the handler and acked to the broker after it succeeded.
    pub ingested: u64,
    /// Deliveries held unacked (coverage-protected or replays after a removal).
    pub held: u64,
    /// Deliveries that matched no filter and were acked and dropped past `unmatched_grace`.
    pub dropped_unmatched: u64,
    /// The HA lease of an exclusive session (None for other modes).
    pub lease: Option<LeaseView>,
}

impl SessionStatus {
    /// An exclusive session standing by: another process holds its lease (this process has
    /// nothing to converge and is doing its part).
    pub fn stands_by(&self) -> bool {
        self.lease
            .as_ref()
            .is_some_and(|l| !l.held && l.holder.is_some())
    }
}

/// An exclusive session's HA lease as this process sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseView {
    /// True while this process holds the lease (and may act on the session).
    pub held: bool,
    /// The holder this process last saw (itself when `held`), if any.
    pub holder: Option<String>,
    /// That holder's fencing token.
    pub token: Option<u64>,
    /// When that ownership lapses unless renewed, by the store's clock.
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// How many times this runtime became or stopped being the holder.
    pub transitions: u64,
}

/// Why a session at `level` is below Full, as its status says (None at Full).
pub(super) fn level_reason(level: SessionLevel, machine: &Reconciler) -> Option<String> {
    match level {
        SessionLevel::Full => None,
        // The machine is terminal by the time its actions are carried out: its reason, not a
        // placeholder until the ledger write lands.
        SessionLevel::MigrationRequired => machine.last_failure().map(str::to_owned),
        SessionLevel::Subscribed if !machine.pending_stale().is_empty() => {
            Some("stale filters await removal".to_owned())
        }
        other => Some(format!("reconciling ({other})")),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use wharf_domain::session::{
        Action, ExactFilter, FilterRecord, Input, ReconcileSettings, Reconciler,
    };

    use super::*;

    /// A machine that removed `$share/g/a/#` and then saw its replay: terminal.
    fn migrated() -> (Reconciler, Vec<Action>) {
        let shared = ExactFilter::parse_field("filter", "$share/g/a/#").expect("valid");
        let history = BTreeMap::from([(shared.clone(), FilterRecord::default())]);
        let settings = ReconcileSettings::new(Duration::from_secs(1));
        let mut machine = Reconciler::new(Vec::new(), history, settings).expect("valid");
        let at = Duration::ZERO;
        let feed = |machine: &mut Reconciler, input| machine.handle(input, at);
        feed(
            &mut machine,
            Input::Connected {
                generation: 1,
                session_present: true,
            },
        );
        let unsuback = Input::UnsubAck {
            generation: 1,
            outcomes: vec![(shared, 0)],
        };
        feed(&mut machine, unsuback);
        feed(&mut machine, Input::Disconnected { generation: 1 });
        feed(
            &mut machine,
            Input::Connected {
                generation: 2,
                session_present: true,
            },
        );
        let replay = Input::Delivery {
            id: 1,
            generation: 2,
            topic: "a/x".to_owned(),
            dup: true,
            subscription_ids: Vec::new(),
        };
        let actions = feed(&mut machine, replay);
        (machine, actions)
    }

    #[test]
    fn a_migration_required_session_gives_the_migration_reason() {
        let (machine, actions) = migrated();
        assert!(actions.contains(&Action::Level(SessionLevel::MigrationRequired)));
        let reason = level_reason(SessionLevel::MigrationRequired, &machine).expect("a reason");
        assert!(reason.contains("$share/g/a/#"), "{reason}");
        assert_eq!(Some(reason.as_str()), machine.last_failure());
    }
}
