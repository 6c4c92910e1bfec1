//! `wharf config check` and `wharf config show` as real processes: a check validates a file and
//! the environment (MQTT sessions and their identities included) and opens nothing; show prints
//! the effective values with every secret redacted.

#![allow(clippy::unwrap_used)]

mod support;

use support::{run, wharf_in};

const GOOD: &str = r#"
[store]
url = "postgres://wharf:s3cret-pw@db.example/wharf"

[mqtt.sessions.plant]
brokers = ["mqtt://ingest:broker-pw@broker.example:1883"]
client_id = "wharf-plant"
password = "hunter2-session"
subscriptions = [{ filter = "$share/w/sensors/#", topic = "sensors" }]
"#;

#[tokio::test]
async fn check_validates_without_starting_anything() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("good.toml"), GOOD).unwrap();
    let ok = run(
        wharf_in(dir.path()),
        &["config", "check", "good.toml"],
        None,
    )
    .await;
    let out = ok.success();
    assert!(out.contains("configuration OK (good.toml)"), "{ok}");
    assert!(out.contains("mqtt session plant: ms-"), "{ok}");
    assert!(
        out.contains("$share") || out.contains("1 subscription(s)"),
        "{ok}"
    );
    for secret in ["s3cret-pw", "broker-pw", "hunter2-session"] {
        assert!(!out.contains(secret), "{secret} leaked: {ok}");
    }
    // Nothing was created or dialed: the folder holds only the file.
    let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(entries.len(), 1);

    std::fs::write(
        dir.path().join("bad.toml"),
        GOOD.replace("$share/w/sensors/#", "$share/w/sensors/#/x"),
    )
    .unwrap();
    let bad = run(wharf_in(dir.path()), &["config", "check", "bad.toml"], None).await;
    let err = bad.failure();
    assert!(
        err.contains("mqtt.sessions.plant.subscriptions[0].filter"),
        "{bad}"
    );
    let mut command = wharf_in(dir.path());
    command.env("WHARF_MQTT__NOPE", "1");
    let unknown = run(command, &["config", "check", "good.toml"], None).await;
    assert!(unknown.failure().contains("nope"), "{unknown}");
}

#[tokio::test]
async fn show_prints_the_effective_values_with_secrets_redacted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("good.toml"), GOOD).unwrap();
    let mut command = wharf_in(dir.path());
    command.env("WHARF_HTTP__LISTEN", "127.0.0.1:9999");
    let shown = run(command, &["--config", "good.toml", "config", "show"], None).await;
    let out = shown.success();
    assert!(
        out.contains("listen = \"127.0.0.1:9999\""),
        "the environment applies: {shown}"
    );
    assert!(
        out.contains("postgres://wharf:***@db.example/wharf"),
        "{shown}"
    );
    for secret in ["s3cret-pw", "broker-pw", "hunter2-session"] {
        assert!(!out.contains(secret), "{secret} leaked: {shown}");
    }
    // What show prints is a configuration that loads again.
    std::fs::write(dir.path().join("shown.toml"), out).unwrap();
    run(
        wharf_in(dir.path()),
        &["config", "check", "shown.toml"],
        None,
    )
    .await
    .success();
}
