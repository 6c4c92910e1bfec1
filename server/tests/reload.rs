//! Reloads of a real `wharf serve`, observed over HTTP: the configuration file rewritten (the
//! supervisor polls it) or SIGHUP. An identity change is refused and the old runtime keeps its
//! connection (deep health `warn`, the refusal's reason, `wharf_config_last_reload_successful
//! 0`); a tuning change is applied (generation 2) and converges; `/healthz` passes throughout.

#![allow(clippy::unwrap_used)]

mod support;

/// Every response these tests receive is held to the generated OpenAPI document (ADR 0033).
#[path = "../../api/tests/support/contract.rs"]
#[allow(dead_code)]
mod contract;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use support::broker::Broker;
use support::{Backend, Running, TestStore};
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(60);
const DEEPHEALTH: &str = "/api/v1/monitor/deephealth";

fn config_toml(broker: &Broker, client_id: &str, keep_alive: &str, poll: &str) -> String {
    format!(
        "[http]\nlisten = \"127.0.0.1:0\"\n\n\
         [mqtt]\nunmatched_grace = \"200ms\"\nconnect_timeout = \"1s\"\nsubscribe_timeout = \"1s\"\n\
         drain_timeout = \"1s\"\nreload_poll_interval = \"{poll}\"\n\n\
         [mqtt.sessions.plant]\nbrokers = [\"{}\"]\nclient_id = \"{client_id}\"\n\
         keep_alive = \"{keep_alive}\"\nsession_expiry = \"10m\"\n\
         subscriptions = [{{ filter = \"reload/#\", qos = 1, topic = \"sensors\" }}]\n",
        broker.url()
    )
}

/// Replaces `wharf.toml` at once (a write and a rename), as a deploy tool does.
fn write_config(store: &TestStore, text: &str) {
    let next = store.dir.path().join("wharf.toml.next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, store.dir.path().join("wharf.toml")).unwrap();
}

async fn get_text(address: SocketAddr, path: &str) -> (u16, String, String) {
    let response = reqwest::get(format!("http://{address}{path}"))
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let text = response.text().await.unwrap();
    contract::assert_conforms("GET", path, status, &content_type, &text);
    (status, content_type, text)
}

/// Polls deep health until `condition` holds on (status, body); returns the body.
async fn wait_deep(
    address: SocketAddr,
    serve: &Running,
    what: &str,
    condition: impl Fn(u16, &Value) -> bool,
) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (status, content_type, text) = get_text(address, DEEPHEALTH).await;
        assert_eq!(content_type, "application/health+json");
        let body: Value = serde_json::from_str(&text).unwrap();
        if condition(status, &body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {DEADLINE:?}; last: {status} {body}\n{}",
            serve.transcript()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A migrated store with session `plant` seeded empty and `serve` running on `toml`.
async fn serve_seeded(store: &TestStore, toml: &str) -> (Running, SocketAddr) {
    write_config(store, toml);
    store.run(&["migrate"]).await.success();
    store
        .run(&["--config", "wharf.toml", "sessions", "seed", "plant"])
        .await
        .success();
    let mut serve = Running::start(
        "serve",
        store.command(),
        &["--config", "wharf.toml", "serve"],
    );
    let address = serve.serving_address().await;
    (serve, address)
}

fn watch(body: &Value) -> &Value {
    &body["config_watch"]
}

async fn a_rewritten_file_is_refused_on_identity_and_applied_on_tuning(backend: Backend) {
    let Some(store) = TestStore::new(backend).await else {
        return;
    };
    let broker = Broker::start();
    let client = format!("wharf-reload-{:08x}", rand::random::<u32>());
    let (mut serve, address) =
        serve_seeded(&store, &config_toml(&broker, &client, "30s", "100ms")).await;
    let healthy = wait_deep(address, &serve, "pass at generation 1", |code, b| {
        code == 200 && b["status"] == "pass" && watch(b)["converged_generation"] == 1
    })
    .await;
    assert_eq!(healthy["sessions"][0]["level"], "full", "{healthy}");
    assert_eq!(healthy["store"]["reachable"], true);
    assert_eq!(healthy["checks"]["store:reachability"][0]["status"], "pass");
    let connection = healthy["sessions"][0]["generation"].clone();

    // A changed client ID is a new durable identity: refused, the old runtime untouched.
    write_config(
        &store,
        &config_toml(&broker, "wharf-renamed", "30s", "100ms"),
    );
    let refused = wait_deep(address, &serve, "the refusal", |_, b| {
        watch(b)["last_reload"]["outcome"] == "refused"
    })
    .await;
    let reason = watch(&refused)["last_reload"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("identity guard") && reason.contains("mqtt.sessions.plant"),
        "{reason}"
    );
    assert!(reason.contains("client_id"), "{reason}");
    assert_eq!(watch(&refused)["last_reload"]["trigger"], "file changed");
    assert_eq!(refused["status"], "warn", "{refused}");
    assert_eq!(refused["checks"]["config:last-reload"][0]["status"], "warn");
    assert_eq!(watch(&refused)["applied_generation"], 1);
    assert_eq!(refused["sessions"][0]["generation"], connection);
    assert_eq!(refused["sessions"][0]["level"], "full");
    let (code, _, metrics) = get_text(address, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("wharf_config_last_reload_successful 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("wharf_config_reloads_total{outcome=\"refused\"} 1\n"),
        "{metrics}"
    );
    let (code, _, live) = get_text(address, "/healthz").await;
    assert_eq!((code, live.as_str()), (200, "{\"status\":\"pass\"}"));

    // A bad value is refused naming the key and the value; still generation 1.
    write_config(&store, &config_toml(&broker, &client, "0s", "100ms"));
    let bad = wait_deep(address, &serve, "the bad value's refusal", |_, b| {
        watch(b)["last_reload"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("keep_alive"))
    })
    .await;
    let reason = watch(&bad)["last_reload"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("mqtt.sessions.plant.keep_alive") && reason.contains("got 0s"),
        "{reason}"
    );
    assert_eq!(watch(&bad)["applied_generation"], 1);

    // A tuning change is applied and converges: generation 2, pass again.
    write_config(&store, &config_toml(&broker, &client, "20s", "100ms"));
    let applied = wait_deep(address, &serve, "generation 2 converged", |code, b| {
        code == 200 && watch(b)["converged_generation"] == 2 && b["status"] == "pass"
    })
    .await;
    assert_eq!(watch(&applied)["applied_generation"], 2);
    assert_eq!(watch(&applied)["last_reload"]["outcome"], "applied");
    assert_eq!(watch(&applied)["degraded"], false);
    let (_, _, metrics) = get_text(address, "/metrics").await;
    assert!(
        metrics.contains("wharf_config_last_reload_successful 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("wharf_config_applied_generation 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("wharf_mqtt_session_level{level=\"full\",session=\"plant\"} 1\n"),
        "{metrics}"
    );
    assert_eq!(serve.terminate().await, Some(0), "{}", serve.transcript());
}

mod file_changes {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::a_rewritten_file_is_refused_on_identity_and_applied_on_tuning(
            super::Backend::Sqlite,
        )
        .await;
    }
}

async fn sighup_reloads_the_file(backend: Backend) {
    let Some(store) = TestStore::new(backend).await else {
        return;
    };
    let broker = Broker::start();
    let client = format!("wharf-hup-{:08x}", rand::random::<u32>());
    // No polling: only SIGHUP reloads.
    let (mut serve, address) =
        serve_seeded(&store, &config_toml(&broker, &client, "30s", "0s")).await;
    wait_deep(address, &serve, "generation 1 converged", |_, b| {
        watch(b)["converged_generation"] == 1
    })
    .await;
    write_config(&store, &config_toml(&broker, &client, "25s", "0s"));
    serve.signal("HUP");
    let applied = wait_deep(address, &serve, "the SIGHUP reload", |_, b| {
        watch(b)["last_reload"]["outcome"] == "applied"
    })
    .await;
    assert_eq!(watch(&applied)["last_reload"]["trigger"], "SIGHUP");
    assert_eq!(watch(&applied)["applied_generation"], 2);
    wait_deep(address, &serve, "generation 2 converged", |code, b| {
        code == 200 && watch(b)["converged_generation"] == 2
    })
    .await;
    assert_eq!(serve.terminate().await, Some(0), "{}", serve.transcript());
}

mod sighup {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::sighup_reloads_the_file(super::Backend::Postgres).await;
    }
}
