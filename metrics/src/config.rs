//! The reload supervisor's figures: whether the configuration in effect converged, whether
//! the newest reload succeeded and when one last did, the generations, and what reloads and
//! reconciles ended with. Registered on first use ([`crate::Metrics::config`]), so a process
//! without a supervisor shows none of them.

use prometheus::{Gauge, IntCounterVec, IntGauge, Opts, Registry};

use crate::register::counter_vec;

/// The outcomes `wharf_config_reloads_total` counts (its `outcome` label values).
pub const RELOAD_OUTCOMES: [&str; 4] = ["applied", "unchanged", "refused", "failed"];

/// The outcomes `wharf_mqtt_reconcile_outcomes_total` counts.
pub const RECONCILE_OUTCOMES: [&str; 2] = ["converged", "failed"];

/// The supervisor's families.
#[derive(Clone)]
pub struct ConfigFamilies {
    degraded: IntGauge,
    last_successful: IntGauge,
    last_success_time: Gauge,
    applied: IntGauge,
    converged: IntGauge,
    reloads: IntCounterVec,
    reconciles: IntCounterVec,
}

fn int_gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let gauge = IntGauge::with_opts(Opts::new(name, help))
        .unwrap_or_else(|e| panic!("metric {name} is malformed: {e}"));
    registry
        .register(Box::new(gauge.clone()))
        .unwrap_or_else(|e| panic!("metric {name} could not be registered: {e}"));
    gauge
}

impl ConfigFamilies {
    pub(crate) fn new(registry: &Registry) -> Self {
        let last_success_time = Gauge::with_opts(Opts::new(
            "wharf_config_last_reload_success_timestamp_seconds",
            "When the configuration was last applied successfully (the start counts), as Unix \
             seconds.",
        ))
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        registry
            .register(Box::new(last_success_time.clone()))
            .unwrap_or_else(|e| panic!("metric could not be registered: {e}"));
        let reloads = counter_vec(
            registry,
            "wharf_config_reloads_total",
            "Reloads the supervisor prepared, by outcome: applied (a swap), unchanged (nothing \
             to swap), refused (bad file, restart-only key, identity guard; the old runtimes \
             kept running), failed (the new runtimes could not start).",
            &["outcome"],
        );
        for outcome in RELOAD_OUTCOMES {
            reloads.with_label_values(&[outcome]);
        }
        Self {
            degraded: int_gauge(
                registry,
                "wharf_config_degraded",
                "1 while the configuration applied has not converged within its activation \
                 budget (or could not be applied), else 0.",
            ),
            last_successful: int_gauge(
                registry,
                "wharf_config_last_reload_successful",
                "1 when the newest reload was applied (or changed nothing), 0 when it was \
                 refused or failed.",
            ),
            last_success_time,
            applied: int_gauge(
                registry,
                "wharf_config_applied_generation",
                "The generation of the configuration in effect (1 at start, one more per swap).",
            ),
            converged: int_gauge(
                registry,
                "wharf_config_converged_generation",
                "The newest generation whose sessions all reached subscribed (0: none yet).",
            ),
            reloads,
            reconciles: counter_vec(
                registry,
                "wharf_mqtt_reconcile_outcomes_total",
                "Reconcile attempts of the supervised sessions, by session and outcome \
                 (converged: every desired filter granted; failed: refused, lost or errored).",
                &["session", "outcome"],
            ),
        }
    }

    /// Sets `wharf_config_degraded`.
    pub fn set_degraded(&self, degraded: bool) {
        self.degraded.set(i64::from(degraded));
    }

    /// Counts a reload's outcome (one of [`RELOAD_OUTCOMES`]) and sets the last-reload gauges;
    /// `now_unix` is when it happened.
    pub fn reloaded(&self, outcome: &str, now_unix: f64) {
        self.reloads.with_label_values(&[outcome]).inc();
        let ok = matches!(outcome, "applied" | "unchanged");
        self.last_successful.set(i64::from(ok));
        if ok {
            self.last_success_time.set(now_unix);
        }
    }

    /// Records the configuration applied at start: successful, at `now_unix`.
    pub fn started(&self, now_unix: f64) {
        self.last_successful.set(1);
        self.last_success_time.set(now_unix);
    }

    /// Sets the applied and converged generations.
    pub fn generations(&self, applied: u64, converged: u64) {
        self.applied.set(i64::try_from(applied).unwrap_or(i64::MAX));
        self.converged
            .set(i64::try_from(converged).unwrap_or(i64::MAX));
    }

    /// Counts one reconcile outcome (one of [`RECONCILE_OUTCOMES`]) of `session`.
    pub fn reconciled(&self, session: &str, outcome: &str) {
        self.reconciles.with_label_values(&[session, outcome]).inc();
    }
}
