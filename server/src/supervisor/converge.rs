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
use wharf_domain::session::SessionLevel;
use wharf_metrics::Metrics;

use super::ConfigWatch;
use crate::config::Config;
use wharf_sessions::SessionStatus;

/// The activation budget of `config`: [`ActivationPhases::hard_bound`] with the phases the
/// session runtime bounds an exclusive activation by (ADR 0030): one timeout for SUBSCRIBE and
/// UNSUBSCRIBE (`mqtt.subscribe_timeout`), and the ingest quiescence before a recycle, one
/// handler commit, bounded by the store deadline (a third of `declarations.instance_ttl`).
pub fn activation_budget(config: &Config) -> Duration {
    let mqtt = &config.mqtt;
    wharf_sessions::activation_phases(
        mqtt.connect_timeout,
        mqtt.subscribe_timeout,
        config.declarations.call_deadline(),
        mqtt.unmatched_grace,
    )
    .hard_bound()
}

/// Converged: at `subscribed` or `full` (every desired filter granted), or an exclusive
/// session standing by while another process holds its lease (this process has nothing to
/// converge; the holder's own watch reports on it).
pub fn converged(status: &SessionStatus) -> bool {
    matches!(status.level, SessionLevel::Subscribed | SessionLevel::Full) || status.stands_by()
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
    use wharf_sessions::LeaseView;

    fn status(name: &str, level: SessionLevel, lease: Option<LeaseView>) -> SessionStatus {
        SessionStatus {
            name: name.to_owned(),
            session_id: "ms-0".to_owned(),
            identity: String::new(),
            level,
            reason: Some("why".to_owned()),
            generation: None,
            pending_stale: Vec::new(),
            last_reconcile: None,
            ingested: 0,
            held: 0,
            dropped_unmatched: 0,
            lease,
        }
    }

    #[test]
    fn behind_names_each_session_below_subscribed_but_not_a_standby() {
        let standby = LeaseView {
            held: false,
            holder: Some("other:1:a".to_owned()),
            token: Some(3),
            expires_at: None,
            transitions: 0,
        };
        let released = LeaseView {
            holder: None,
            ..standby.clone()
        };
        let statuses = [
            status("a", SessionLevel::Full, None),
            status("b", SessionLevel::Subscribed, None),
            status("c", SessionLevel::Starting, Some(standby)),
            status("d", SessionLevel::Connected, None),
            status("e", SessionLevel::Starting, Some(released)),
        ];
        assert_eq!(
            behind(&statuses).as_deref(),
            Some("d is connected: why; e is starting: why")
        );
        assert_eq!(behind(&statuses[..3]), None);
    }

    #[test]
    fn the_budget_is_the_activation_bound_at_the_configured_timeouts() {
        let mut config = Config::default();
        config.mqtt.unmatched_grace = Duration::from_secs(30);
        config.declarations.instance_ttl = Duration::from_secs(90);
        // Every phase at 30 s: the design record's 4 minutes.
        assert_eq!(activation_budget(&config), Duration::from_secs(240));
        // The defaults: 2x30 + 2x30 + 30 + 10 (store deadline, 30 s TTL / 3) + 2x5 = 170 s.
        assert_eq!(
            activation_budget(&Config::default()),
            Duration::from_secs(170)
        );
    }
}
