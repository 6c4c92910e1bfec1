//! How the reconcile machine judges a delivery: dispatch, hold, ack unmatched, wait, or the
//! terminal migration path. See the parent module's docs for the rules.

use super::{Action, Connection, ExactFilter, Now, Reconciler, SessionLevel, Stage};

/// A delivery not decided yet, on the current connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Parked {
    pub(super) topic: String,
    pub(super) dup: bool,
    pub(super) subscription_ids: Vec<u32>,
    pub(super) arrived: Now,
}

/// The judgement of one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Dispatch,
    Hold,
    AckUnmatched,
    Wait,
    /// A replay through these removed shared filters.
    Migrate(Vec<ExactFilter>),
}

impl Reconciler {
    /// Judges every undecided delivery of the current connection, in arrival order.
    pub(super) fn judge_parked(&mut self, actions: &mut Vec<Action>) {
        let Some(connection) = self.connection.as_ref() else {
            return;
        };
        let ids: Vec<u64> = connection.parked.keys().copied().collect();
        for id in ids {
            let Some(connection) = self.connection.as_ref() else {
                return;
            };
            let Some(parked) = connection.parked.get(&id) else {
                continue;
            };
            let verdict = self.judge(connection, parked);
            let action = match verdict {
                Verdict::Wait => continue,
                Verdict::Dispatch => Action::Dispatch { id },
                Verdict::Hold => Action::Hold { id },
                Verdict::AckUnmatched => Action::AckUnmatched { id },
                Verdict::Migrate(filters) => {
                    self.enter_migration(id, filters, actions);
                    continue;
                }
            };
            if let Some(connection) = self.connection.as_mut() {
                connection.parked.remove(&id);
            }
            actions.push(action);
        }
    }

    fn judge(&self, connection: &Connection, parked: &Parked) -> Verdict {
        if self.terminal.is_some() {
            return Verdict::Hold;
        }
        let candidates = self.came_through(parked);
        let desired_hit = candidates.iter().any(|f| self.desired.contains_key(*f));
        if desired_hit {
            return if self.may_dispatch(connection) {
                Verdict::Dispatch
            } else {
                Verdict::Wait
            };
        }
        if parked.dup {
            let replayed = self.removed_shared_replay(connection, &candidates);
            if !replayed.is_empty() {
                return Verdict::Migrate(replayed);
            }
        }
        if !candidates.is_empty() {
            // Covered only by stale history filters: coverage-protected.
            return Verdict::Hold;
        }
        if self.now >= parked.arrived.saturating_add(self.settings.unmatched_grace) {
            Verdict::AckUnmatched
        } else {
            Verdict::Wait
        }
    }

    /// The known filters (desired or in history) the delivery came through: those whose
    /// subscription id it carries and whose topic filter matches; failing that, every known
    /// filter that matches its topic.
    pub(super) fn came_through(&self, parked: &Parked) -> Vec<&ExactFilter> {
        let matching = || {
            self.desired
                .keys()
                .chain(
                    self.history
                        .keys()
                        .filter(|f| !self.desired.contains_key(*f)),
                )
                .filter(|f| f.matches(&parked.topic))
        };
        if !parked.subscription_ids.is_empty() {
            let by_id: Vec<&ExactFilter> = matching()
                .filter(|f| parked.subscription_ids.contains(&super::subscription_id(f)))
                .collect();
            if !by_id.is_empty() {
                return by_id;
            }
        }
        matching().collect()
    }

    /// Removed shared filters among `candidates` whose removal was verified on an earlier
    /// connection and whose Forget has not been issued: the verification window.
    fn removed_shared_replay(
        &self,
        connection: &Connection,
        candidates: &[&ExactFilter],
    ) -> Vec<ExactFilter> {
        let forgetting = |f: &ExactFilter| {
            self.forget_outstanding
                .as_ref()
                .is_some_and(|list| list.iter().any(|(g, _)| g == f))
        };
        candidates
            .iter()
            .filter(|f| f.is_shared() && !forgetting(f))
            .filter(|f| {
                self.removed
                    .get(**f)
                    .is_some_and(|r| r.generation < connection.generation)
            })
            .map(|f| (*f).clone())
            .collect()
    }

    /// Handler dispatch: subscribed on this connection, not recycling, and either recycled
    /// after a removal or with nothing stale left to remove.
    fn may_dispatch(&self, connection: &Connection) -> bool {
        connection.subscribed
            && connection.stage != Stage::Recycling
            && (connection.replacement || self.stale().next().is_none())
    }

    fn enter_migration(&mut self, id: u64, filters: Vec<ExactFilter>, actions: &mut Vec<Action>) {
        let names: Vec<String> = filters.iter().map(|f| format!("\"{f}\"")).collect();
        let reason = format!(
            "a redelivered message came through removed shared filter {}; it stays unacked at \
             the broker: restore the old filters and drain before retrying",
            names.join(", ")
        );
        self.set_level(SessionLevel::MigrationRequired, actions);
        self.terminal = Some(reason.clone());
        actions.push(Action::Hold { id });
        actions.push(Action::Disconnect);
        actions.push(Action::RequireMigration { reason, filters });
        // Nothing undecided on this connection is acked or dropped either.
        if let Some(connection) = self.connection.as_mut() {
            let rest: Vec<u64> = connection
                .parked
                .keys()
                .copied()
                .filter(|p| *p != id)
                .collect();
            connection.parked.clear();
            actions.extend(rest.into_iter().map(|id| Action::Hold { id }));
        }
    }
}
