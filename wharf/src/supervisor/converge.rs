//! After a swap: the convergence watch and the reconcile-outcome counters.
//!
//! A swap is *applied* once the new runtimes are built and started; whether the broker takes
//! the new configuration (an ACL-denied filter, rotated-away credentials) shows only later.
//! The watch follows every session of the generation until each is at `subscribed` or
//! `full`. Past the activation budget (the whole-path hard bound of ADR 0028 at the `mqtt`
//! section's timeouts) it marks the configuration degraded with an "applied but not
//! converged" reason naming the sessions and why each is behind, and clears it as soon as
//! they converge. A newer swap replaces the watch.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use wharf_domain::lease::ActivationPhases;
use wharf_domain::session::SessionLevel;
use wharf_metrics::Metrics;

use super::ConfigWatch;
use crate::config::MqttConfig;
use crate::sessions::SessionStatus;

/// The activation budget of `mqtt`: [`ActivationPhases::hard_bound`] with the section's
/// timeouts. The section has one timeout for SUBSCRIBE and UNSUBSCRIBE (`subscribe_timeout`)
/// and none of its own for ingress quiescence, for which `drain_timeout` (the longest a swap
/// waits for ingress to settle) stands in.
pub fn activation_budget(mqtt: &MqttConfig) -> Duration {
    ActivationPhases {
        connect_timeout: mqtt.connect_timeout,
        subscribe_timeout: mqtt.subscribe_timeout,
        unsubscribe_timeout: mqtt.subscribe_timeout,
        quiescence_timeout: mqtt.drain_timeout,
        unmatched_grace: mqtt.unmatched_grace,
    }
    .hard_bound()
}

/// Converged: at `subscribed` or `full` (every desired filter granted).
pub fn converged(status: &SessionStatus) -> bool {
    matches!(status.level, SessionLevel::Subscribed | SessionLevel::Full)
}

/// What keeps a generation from converging, for the degraded reason (None when converged).
pub fn behind(statuses: &[SessionStatus]) -> Option<String> {
    let behind: Vec<String> = statuses
        .iter()
        .filter(|s| !converged(s))
        .map(|s| match &s.reason {
            Some(reason) => format!("{} is {}: {reason}", s.name, s.level.as_str()),
            None => format!("{} is {}", s.name, s.level.as_str()),
        })
        .collect();
    (!behind.is_empty()).then(|| behind.join("; "))
}

/// Starts the watch of `generation` over `sessions`; it ends once they converged.
pub(super) fn watch_generation(
    generation: u64,
    sessions: Vec<watch::Receiver<SessionStatus>>,
    budget: Duration,
    state: watch::Sender<ConfigWatch>,
    metrics: Metrics,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let deadline = Instant::now() + budget;
        let mut sessions = sessions;
        loop {
            let statuses: Vec<SessionStatus> = sessions
                .iter_mut()
                .map(|w| w.borrow_and_update().clone())
                .collect();
            let lagging = behind(&statuses);
            let past_budget = Instant::now() >= deadline;
            let mut done = false;
            state.send_modify(|w| {
                if w.applied_generation != generation {
                    done = true;
                    return;
                }
                match &lagging {
                    None => {
                        w.converged_generation = generation;
                        w.degraded = false;
                        w.reason = None;
                        done = true;
                    }
                    Some(why) if past_budget => {
                        w.degraded = true;
                        w.reason = Some(format!(
                            "applied but not converged: generation {generation} was applied and \
                             its sessions did not all reach subscribed within the activation \
                             budget ({}): {why}",
                            humantime::format_duration(budget)
                        ));
                    }
                    Some(_) => {}
                }
                metrics.config().set_degraded(w.degraded);
                metrics
                    .config()
                    .generations(w.applied_generation, w.converged_generation);
            });
            if done {
                if lagging.is_none() {
                    tracing::info!(generation, "the configuration converged");
                }
                return;
            }
            if past_budget {
                tracing::warn!(generation, reason = ?lagging, "applied but not converged");
            }
            // Runtimes whose task ended keep their last status; only open ones are waited on.
            let mut open: Vec<&mut watch::Receiver<SessionStatus>> = sessions
                .iter_mut()
                .filter(|w| w.has_changed().is_ok())
                .collect();
            if open.is_empty() {
                if past_budget {
                    return;
                }
                tokio::time::sleep_until(deadline).await;
                continue;
            }
            let changed =
                futures::future::select_all(open.iter_mut().map(|w| Box::pin(w.changed())));
            if past_budget {
                let _ = changed.await;
            } else {
                tokio::select! {
                    _ = changed => {}
                    _ = tokio::time::sleep_until(deadline) => {}
                }
            }
        }
    })
}

/// Counts every reconcile outcome `session` reports: one per change of (connection
/// generation, outcome), so a failure repeated on a new connection counts again.
pub(super) fn count_reconciles(
    mut session: watch::Receiver<SessionStatus>,
    metrics: Metrics,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = {
            let s = session.borrow_and_update();
            (s.generation, s.last_reconcile.clone())
        };
        while session.changed().await.is_ok() {
            let (name, now) = {
                let s = session.borrow_and_update();
                (s.name.clone(), (s.generation, s.last_reconcile.clone()))
            };
            if now != last {
                if let Some(outcome) = &now.1 {
                    let label = if outcome.converged {
                        "converged"
                    } else {
                        "failed"
                    };
                    metrics.config().reconciled(&name, label);
                }
                last = now;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_the_activation_bound_at_the_section_timeouts() {
        let mqtt = MqttConfig {
            connect_timeout: Duration::from_secs(30),
            subscribe_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
            unmatched_grace: Duration::from_secs(30),
            ..MqttConfig::default()
        };
        assert_eq!(activation_budget(&mqtt), Duration::from_secs(240));
        // The defaults: 2x30 + 2x30 + 30 + 30 (drain) + 2x5 (grace) = 190 s.
        assert_eq!(
            activation_budget(&MqttConfig::default()),
            Duration::from_secs(190)
        );
    }
}
