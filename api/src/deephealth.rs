//! `GET /api/v1/monitor/deephealth`: everything an operator checks after a reload, in one
//! `application/health+json` answer.
//!
//! - `checks` keyed `component:measurement`: `store:reachability` (the store answered a
//!   schema read within the ready timeout), `config:convergence` (applied versus converged),
//!   `config:last-reload`, `mqtt-session:level` (one entry per session, `componentId` its
//!   name) and `consumer:state` (one per consumer of this process);
//! - beside them, the same facts as plain objects: `sessions` (level, reason, connection
//!   generation, HA lease), `config_watch` (applied and converged generations, degraded flag
//!   and reason, the newest reload), `consumers` (group, declarer, state, last heartbeat) and
//!   `store`.
//!
//! `status` is the worst check's: `fail` (HTTP 503) only when the store does not answer;
//! degraded but serving (a configuration not converged, a refused reload, a session below
//! `full` that is not an exclusive standby, a stalled consumer) is `warn` with HTTP 200. `/healthz` reads none of this.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{json, Value};
use utoipa::ToSchema;
use wharf_store::finish_within;

use crate::schemas::health_status;
use crate::state::{ApiState, HealthStatus};

mod report;

pub use report::{
    ConfigWatchReport, ConsumerReport, DeepHealthSource, DeepReport, DeepSession, LeaseReport,
    ReloadSummary, SharedDeepHealthSource,
};

struct Check {
    key: &'static str,
    status: HealthStatus,
    entry: Value,
}

fn check(key: &'static str, status: HealthStatus, mut entry: Value) -> Check {
    entry["status"] = json!(status);
    Check { key, status, entry }
}

/// The checks of `report` and the store's reachability (`store`: `Err(why)` when it did not
/// answer).
fn checks(report: &DeepReport, store: &Result<(), String>) -> Vec<Check> {
    use HealthStatus::{Fail, Pass, Warn};
    let mut out = Vec::new();
    out.push(match store {
        Ok(()) => check("store:reachability", Pass, json!({})),
        Err(why) => check("store:reachability", Fail, json!({ "output": why })),
    });
    if let Some(watch) = &report.config_watch {
        let observed = json!({
            "applied_generation": watch.applied_generation,
            "converged_generation": watch.converged_generation,
        });
        out.push(if watch.degraded {
            check(
                "config:convergence",
                Warn,
                json!({ "observedValue": observed, "output": watch.reason }),
            )
        } else {
            check(
                "config:convergence",
                Pass,
                json!({ "observedValue": observed }),
            )
        });
        let last = watch.last_reload.as_ref();
        let refused = last.filter(|r| r.outcome == "refused" || r.outcome == "failed");
        out.push(match refused {
            Some(r) => check(
                "config:last-reload",
                Warn,
                json!({ "observedValue": r.outcome, "output": r.reason, "time": r.at }),
            ),
            None => check(
                "config:last-reload",
                Pass,
                json!({ "observedValue": last.map_or("none", |r| r.outcome.as_str()) }),
            ),
        });
    }
    for s in &report.sessions {
        let mut entry = json!({ "componentId": s.name, "observedValue": s.level });
        if let Some(reason) = &s.reason {
            entry["output"] = json!(reason);
        }
        // A standby (another process holds the exclusive lease) is healthy from here.
        let standby = s
            .lease
            .as_ref()
            .is_some_and(|l| !l.held && l.holder.is_some());
        let status = if s.level == "full" || standby {
            Pass
        } else {
            Warn
        };
        out.push(check("mqtt-session:level", status, entry));
    }
    for c in &report.consumers {
        let mut entry = json!({ "componentId": c.declarer, "observedValue": c.state });
        if let Some(reason) = &c.reason {
            entry["output"] = json!(reason);
        }
        if let Some(at) = c.last_heartbeat {
            entry["time"] = json!(at);
        }
        let status = if matches!(c.state.as_str(), "stalled" | "failed") {
            Warn
        } else {
            Pass
        };
        out.push(check("consumer:state", status, entry));
    }
    out
}

/// The whole answer: the body and its HTTP status.
pub fn render(report: &DeepReport, store: &Result<(), String>) -> (StatusCode, Value) {
    let checks = checks(report, store);
    let status = checks
        .iter()
        .map(|c| c.status)
        .max()
        .unwrap_or(HealthStatus::Pass);
    let mut keyed = serde_json::Map::new();
    for c in checks {
        match keyed.get_mut(c.key) {
            Some(Value::Array(entries)) => entries.push(c.entry),
            _ => {
                keyed.insert(c.key.to_owned(), json!([c.entry]));
            }
        }
    }
    let body = json!({
        "status": status,
        "description": "wharf deep health",
        "checks": keyed,
        "store": match store {
            Ok(()) => json!({ "reachable": true }),
            Err(why) => json!({ "reachable": false, "output": why }),
        },
        "config_watch": report.config_watch,
        "sessions": report.sessions,
        "consumers": report.consumers,
    });
    let code = if status == HealthStatus::Fail {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (code, body)
}

// The deep health answer is assembled as JSON in `render` (its shape is application/health+json's,
// keyed by check). These types state that shape for the document and are never built; the
// response validation of the HTTP tests holds the answers to them.

/// The deep health answer (application/health+json).
#[derive(Serialize, ToSchema)]
pub(crate) struct DeepHealth {
    /// The worst check's status: `fail` (503) only when the store does not answer.
    #[schema(value_type = String, schema_with = health_status)]
    status: String,
    /// `wharf deep health`.
    description: String,
    /// Every check, keyed `component:measurement`.
    checks: BTreeMap<String, Vec<DeepCheck>>,
    /// Whether the store answered a schema read within the ready timeout.
    store: StoreReachability,
    /// The supervisor's state; null without one.
    #[schema(required = true)]
    config_watch: Option<ConfigWatchReport>,
    /// The sessions, in configuration order.
    sessions: Vec<DeepSession>,
    /// This process's consumers.
    consumers: Vec<ConsumerReport>,
}

/// One deep health check.
#[derive(Serialize, ToSchema)]
pub(crate) struct DeepCheck {
    #[schema(value_type = String, schema_with = health_status)]
    status: String,
    /// The session or consumer the entry is about.
    #[serde(rename = "componentId", skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    component_id: Option<String>,
    /// What was observed (a level, a state, an outcome, or the generations).
    #[serde(rename = "observedValue", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Value)]
    observed_value: Option<serde_json::Value>,
    /// Why it warns or fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<String>,
    /// When it was observed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    time: Option<chrono::DateTime<chrono::Utc>>,
}

/// The store's reachability.
#[derive(Serialize, ToSchema)]
pub(crate) struct StoreReachability {
    /// True when it answered.
    reachable: bool,
    /// Why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    output: Option<String>,
}

#[utoipa::path(
    get,
    path = "/api/v1/monitor/deephealth",
    operation_id = "getDeepHealth",
    tag = "probes",
    summary = "Deep health",
    description = "An application/health+json answer for operators after a reload: each MQTT session's level and HA lease, `config_watch` (applied versus converged generation, degraded flag and reason, the newest reload), this process's consumers, and the store's reachability. Checks are keyed `component:measurement`: `store:reachability`, `config:convergence`, `config:last-reload`, `mqtt-session:level` and `consumer:state` (one entry per session or consumer, `componentId` naming it). `status` is the worst check's: `fail` (503) only when the store does not answer; degraded but serving (not converged, a refused reload, a session below full, a stalled consumer) is `warn` with 200.",
    responses(
        (status = 200, description = "Serving (status pass or warn).", body = DeepHealth, content_type = "application/health+json"),
        (status = 503, description = "The store does not answer (status fail).", body = DeepHealth, content_type = "application/health+json")
    )
)]
pub(crate) async fn deephealth(State(state): State<ApiState>) -> Response {
    let report = state
        .deep_health_source()
        .map(|source| source.report())
        .unwrap_or_else(|| DeepReport {
            sessions: state
                .session_source()
                .map(|s| s.sessions())
                .unwrap_or_default()
                .into_iter()
                .map(|s| DeepSession {
                    name: s.name,
                    session_id: s.session_id,
                    level: s.level,
                    reason: s.reason,
                    generation: s.generation,
                    lease: None,
                })
                .collect(),
            ..DeepReport::default()
        });
    let store = state.probe_read_model().store().clone();
    let backend = store.backend();
    // Past the deadline the read goes on to its end in its task (ADR 0068).
    let version = async move { store.schema_version().await };
    let reachable = match finish_within(state.ready_timeout_value(), version).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("{backend} store: {e}")),
        Err(unanswered) => Err(format!("{backend} store: {unanswered}")),
    };
    let mut report = report;
    if reachable.is_ok() {
        heartbeats(&state, &mut report.consumers).await;
    }
    let (code, body) = render(&report, &reachable);
    (
        code,
        [(header::CONTENT_TYPE, "application/health+json")],
        body.to_string(),
    )
        .into_response()
}

/// Fills in each consumer's last confirmed heartbeat from its group's instances (the first
/// page of up to 1,000 per group), within the ready timeout; what is not found stays absent.
async fn heartbeats(state: &ApiState, consumers: &mut [ConsumerReport]) {
    let groups: std::collections::BTreeSet<String> = consumers
        .iter()
        .filter(|c| c.last_heartbeat.is_none())
        .map(|c| c.group.clone())
        .collect();
    let query = wharf_projections::MemberQuery {
        limit: 1_000,
        ..wharf_projections::MemberQuery::default()
    };
    let read_model = state.probe_read_model().clone();
    let reads = async move {
        let mut seen = Vec::new();
        for group in groups {
            let Ok(name) = wharf_domain::GroupName::parse("group", &group) else {
                continue;
            };
            if let Ok(Some(view)) = read_model.group_members(&name, &query).await {
                seen.extend(
                    view.instances
                        .into_iter()
                        .map(|i| (i.declarer, i.heartbeat_at)),
                );
            }
        }
        seen
    };
    let Ok(seen) = finish_within(state.ready_timeout_value(), reads).await else {
        return;
    };
    for consumer in consumers.iter_mut().filter(|c| c.last_heartbeat.is_none()) {
        consumer.last_heartbeat = seen
            .iter()
            .find(|(declarer, _)| *declarer == consumer.declarer)
            .map(|(_, at)| *at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(level: &str) -> DeepSession {
        DeepSession {
            name: "plant".to_owned(),
            session_id: "ms-0".to_owned(),
            level: level.to_owned(),
            reason: (level != "full").then(|| "reconciling".to_owned()),
            generation: Some(2),
            lease: Some(LeaseReport {
                held: true,
                holder: Some("host:1:a".to_owned()),
                token: Some(7),
                expires_at: None,
            }),
        }
    }

    fn watch(degraded: bool) -> ConfigWatchReport {
        ConfigWatchReport {
            applied_generation: 3,
            converged_generation: if degraded { 2 } else { 3 },
            degraded,
            reason: degraded.then(|| "applied but not converged: plant".to_owned()),
            strategy: "direct".to_owned(),
            last_reload: None,
        }
    }

    #[test]
    fn all_well_is_pass_degraded_is_warn_and_a_dead_store_is_fail() {
        let healthy = DeepReport {
            sessions: vec![session("full")],
            config_watch: Some(watch(false)),
            consumers: Vec::new(),
        };
        let (code, body) = render(&healthy, &Ok(()));
        assert_eq!(
            (code, &body["status"]),
            (StatusCode::OK, &json!("pass")),
            "{body}"
        );
        assert_eq!(body["sessions"][0]["lease"]["token"], 7, "{body}");
        assert_eq!(
            body["checks"]["mqtt-session:level"][0]["componentId"],
            "plant"
        );

        let degraded = DeepReport {
            sessions: vec![session("starting")],
            config_watch: Some(watch(true)),
            consumers: Vec::new(),
        };
        let (code, body) = render(&degraded, &Ok(()));
        assert_eq!(
            (code, &body["status"]),
            (StatusCode::OK, &json!("warn")),
            "{body}"
        );
        let convergence = &body["checks"]["config:convergence"][0];
        assert_eq!(convergence["status"], "warn");
        assert!(convergence["output"]
            .as_str()
            .is_some_and(|o| o.contains("applied but not converged")));
        assert_eq!(body["config_watch"]["degraded"], true);

        let mut standby = session("starting");
        standby.lease = Some(LeaseReport {
            held: false,
            holder: Some("other:2:b".to_owned()),
            token: Some(8),
            expires_at: None,
        });
        let elsewhere = DeepReport {
            sessions: vec![standby],
            config_watch: Some(watch(false)),
            consumers: Vec::new(),
        };
        let (_, body) = render(&elsewhere, &Ok(()));
        assert_eq!(body["status"], "pass", "a standby is healthy here: {body}");

        let (code, body) = render(&healthy, &Err("sqlite store: gone".to_owned()));
        assert_eq!(
            (code, &body["status"]),
            (StatusCode::SERVICE_UNAVAILABLE, &json!("fail"))
        );
        assert_eq!(body["store"]["reachable"], false);
    }
}
