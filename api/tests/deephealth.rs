//! `GET /api/v1/monitor/deephealth` over HTTP against real stores: `pass` with a healthy report
//! and a reachable SQLite store; `warn` (200) for a degraded configuration; `fail` (503) when
//! the store does not answer, while `/healthz` still passes (liveness never touches the store
//! or the deep-health source). The content type is `application/health+json` throughout.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::Value;
use wharf_api::{ApiState, ConfigWatchReport, DeepReport, DeepSession, LeaseReport};
use wharf_projections::ReadModel;
use wharf_store::{PgSettings, PgStore, SqliteStore, Store};

mod support;

async fn get(state: ApiState, path: &str) -> (u16, String, Value) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(wharf_api::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    let response = reqwest::get(format!("http://{address}{path}"))
        .await
        .unwrap();
    let code = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let text = response.text().await.unwrap();
    support::contract::assert_conforms("GET", path, code, &content_type, &text);
    let body = serde_json::from_str(&text).unwrap();
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    (code, content_type, body)
}

fn report(level: &str, degraded: bool) -> DeepReport {
    DeepReport {
        sessions: vec![DeepSession {
            name: "plant".into(),
            session_id: "ms-00000000000000000000000000000000".into(),
            level: level.into(),
            reason: (level != "full").then(|| "reconciling (starting)".into()),
            generation: Some(3),
            lease: Some(LeaseReport {
                held: true,
                holder: Some("host:1:abc".into()),
                token: Some(4),
                expires_at: None,
            }),
        }],
        config_watch: Some(ConfigWatchReport {
            applied_generation: 2,
            converged_generation: if degraded { 1 } else { 2 },
            degraded,
            reason: degraded.then(|| "applied but not converged: plant is starting".into()),
            strategy: "direct".into(),
            last_reload: None,
        }),
        consumers: Vec::new(),
    }
}

async fn sqlite() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("w.db"), wharf_projections::sqlite_inline())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    (dir, Store::Sqlite(store))
}

#[tokio::test]
async fn a_healthy_process_passes_and_a_degraded_one_warns_with_200() {
    let (_dir, store) = sqlite().await;
    let read = ReadModel::new(store, Duration::from_secs(60));
    let healthy = ApiState::new(read.clone()).with_deep_health(|| report("full", false));
    let (code, content_type, body) = get(healthy, "/api/v1/monitor/deephealth").await;
    assert_eq!(
        (code, content_type.as_str()),
        (200, "application/health+json")
    );
    assert_eq!(body["status"], "pass", "{body}");
    assert_eq!(body["store"]["reachable"], true);
    assert_eq!(body["sessions"][0]["lease"]["holder"], "host:1:abc");
    assert_eq!(body["sessions"][0]["lease"]["token"], 4);
    assert_eq!(body["config_watch"]["applied_generation"], 2);
    for key in [
        "store:reachability",
        "config:convergence",
        "mqtt-session:level",
    ] {
        assert_eq!(body["checks"][key][0]["status"], "pass", "{key}: {body}");
    }

    let degraded = ApiState::new(read).with_deep_health(|| report("starting", true));
    let (code, _, body) = get(degraded, "/api/v1/monitor/deephealth").await;
    assert_eq!(code, 200, "degraded but serving is 200: {body}");
    assert_eq!(body["status"], "warn");
    assert_eq!(body["config_watch"]["degraded"], true);
    let check = &body["checks"]["config:convergence"][0];
    assert_eq!(check["status"], "warn");
    assert!(check["output"]
        .as_str()
        .unwrap()
        .contains("applied but not converged"));
    assert_eq!(check["observedValue"]["converged_generation"], 1);
    assert_eq!(
        body["checks"]["mqtt-session:level"][0]["componentId"],
        "plant"
    );
}

#[tokio::test]
async fn an_unreachable_store_fails_deep_health_and_never_liveness() {
    let closed_port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let settings = PgSettings {
        acquire_timeout: Duration::from_millis(300),
        ..PgSettings::new(format!("postgres://postgres@127.0.0.1:{closed_port}/test"))
    };
    let pg = PgStore::connect(&settings, wharf_projections::pg_inline()).unwrap();
    let read = ReadModel::new(Store::Postgres(pg), Duration::from_secs(60));
    let state = ApiState::new(read).with_deep_health(|| report("full", false));
    let (code, content_type, body) = get(state.clone(), "/api/v1/monitor/deephealth").await;
    assert_eq!(
        (code, content_type.as_str()),
        (503, "application/health+json")
    );
    assert_eq!(body["status"], "fail", "{body}");
    assert_eq!(body["store"]["reachable"], false);
    assert_eq!(body["checks"]["store:reachability"][0]["status"], "fail");
    assert!(
        !body.to_string().contains(&closed_port.to_string()),
        "no connection detail leaks: {body}"
    );
    let (code, _, live) = get(state, "/healthz").await;
    assert_eq!(code, 200);
    assert_eq!(live["status"], "pass");
}
