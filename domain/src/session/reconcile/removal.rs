//! The removal path of a reconcile: UNSUBSCRIBE the stale filters, recycle after a verified
//! removal, watch the replacement connection for one window, Forget, and settle.

use std::collections::BTreeMap;

use super::{is_removal_verified, Action, ExactFilter, Reconciler, Removal, SessionLevel, Stage};

impl Reconciler {
    pub(super) fn unsubscribe_or_settle(&mut self, actions: &mut Vec<Action>) {
        let pending: Vec<ExactFilter> = self
            .stale()
            .filter(|f| !self.removed.contains_key(*f))
            .cloned()
            .collect();
        let Some(connection) = self.connection.as_mut() else {
            return;
        };
        if !pending.is_empty() && !connection.unsubscribe_attempted {
            connection.unsubscribe_attempted = true;
            connection.unsubscribing = pending.clone();
            connection.stage = Stage::AwaitUnsubAck;
            actions.push(Action::Unsubscribe(pending));
            return;
        }
        connection.stage = Stage::Settled;
        if pending.is_empty() && self.removed.is_empty() {
            self.last_failure = None;
            self.set_level(SessionLevel::Full, actions);
        } else {
            let reason = format!(
                "unsubscribe not verified for {}; kept in history for a retry",
                join_limited(&pending.iter().map(quoted).collect::<Vec<_>>())
            );
            self.last_failure = Some(reason.clone());
            actions.push(Action::Failed { reason });
        }
    }

    pub(super) fn on_unsuback(
        &mut self,
        generation: u64,
        outcomes: Vec<(ExactFilter, u8)>,
        actions: &mut Vec<Action>,
    ) {
        let terminal = self.terminal.is_some();
        let Some(connection) = self.current(generation) else {
            return;
        };
        if connection.stage != Stage::AwaitUnsubAck || terminal {
            self.ignored_inputs += 1;
            return;
        }
        let requested = std::mem::take(&mut connection.unsubscribing);
        let answered: BTreeMap<ExactFilter, u8> = outcomes.into_iter().collect();
        let mut newly_removed = false;
        for filter in requested {
            if let Some(&reason_code) = answered.get(&filter) {
                if is_removal_verified(reason_code) {
                    let removal = Removal {
                        reason_code,
                        generation,
                    };
                    self.removed.insert(filter, removal);
                    newly_removed = true;
                }
            }
        }
        if newly_removed {
            if let Some(connection) = self.connection.as_mut() {
                connection.stage = Stage::Recycling;
            }
            actions.push(Action::Recycle);
        } else {
            self.unsubscribe_or_settle(actions);
        }
    }

    /// Ends a verification window whose time has come: Forget the verified removals.
    pub(super) fn on_time(&mut self, actions: &mut Vec<Action>) {
        let now = self.now;
        if self.terminal.is_some() {
            return;
        }
        let Some(connection) = self.connection.as_mut() else {
            return;
        };
        let Stage::Verifying { until } = connection.stage else {
            return;
        };
        if now < until {
            return;
        }
        connection.stage = Stage::AwaitForget;
        let forget: Vec<(ExactFilter, u8)> = self
            .removed
            .iter()
            .map(|(f, r)| (f.clone(), r.reason_code))
            .collect();
        self.forget_outstanding = Some(forget.clone());
        actions.push(Action::Forget(forget));
    }

    pub(super) fn on_forgotten(&mut self, actions: &mut Vec<Action>) {
        let Some(forgotten) = self.forget_outstanding.take() else {
            self.ignored_inputs += 1;
            return;
        };
        for (filter, _) in forgotten {
            self.history.remove(&filter);
            self.removed.remove(&filter);
        }
        let waiting = self
            .connection
            .as_ref()
            .is_some_and(|c| c.stage == Stage::AwaitForget);
        if waiting && self.terminal.is_none() {
            self.unsubscribe_or_settle(actions);
        }
    }
}

fn quoted(filter: &ExactFilter) -> String {
    format!("\"{filter}\"")
}

/// Joins at most ten items, saying how many more there were.
pub(super) fn join_limited(items: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut text = items
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if items.len() > SHOWN {
        text.push_str(&format!("; and {} more", items.len() - SHOWN));
    }
    text
}
