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

/// `check --store` runs the identity guard against an existing store's session ledger: a
/// seeded session is known, an added one is reported unseeded, and a session whose identity
/// changed while the old identity still holds filters is refused, naming the session.
#[tokio::test]
async fn check_with_store_runs_the_identity_guard_against_the_ledger() {
    let store = support::TestStore::new(support::Backend::Sqlite)
        .await
        .unwrap();
    let file = |client: &str, extra: &str| {
        format!(
            "[mqtt.sessions.plant]\nbrokers = [\"mqtt://127.0.0.1:1883\"]\nclient_id = \"{client}\"\n\
             subscriptions = [{{ filter = \"plant/#\", topic = \"sensors\" }}]\n{extra}"
        )
    };
    std::fs::write(store.dir.path().join("w.toml"), file("wharf-plant", "")).unwrap();
    store.run(&["migrate"]).await.success();
    store
        .run(&["--config", "w.toml", "sessions", "seed", "plant=plant/#"])
        .await
        .success();

    let known = store.run(&["config", "check", "w.toml", "--store"]).await;
    let out = known.success();
    assert!(out.contains("mqtt session plant: ms-"), "{known}");
    assert!(out.contains("is seeded (1 filter(s)"), "{known}");
    assert!(out.contains("identity check OK"), "{known}");

    // An added session is not known yet: reported, not refused (it stays down until seeded).
    let added = file(
        "wharf-plant",
        "\n[mqtt.sessions.line2]\nbrokers = [\"mqtt://127.0.0.1:1883\"]\nclient_id = \"wharf-line2\"\n",
    );
    std::fs::write(store.dir.path().join("added.toml"), added).unwrap();
    let run = store
        .run(&["config", "check", "added.toml", "--store"])
        .await;
    assert!(run.success().contains("mqtt session line2: ms-"), "{run}");
    assert!(run.stdout.contains("is NOT known to the store"), "{run}");

    // The client ID changed: the old identity still holds plant/# and nobody manages it.
    std::fs::write(
        store.dir.path().join("renamed.toml"),
        file("wharf-renamed", ""),
    )
    .unwrap();
    let refused = store
        .run(&["config", "check", "renamed.toml", "--store"])
        .await;
    let err = refused.failure();
    assert!(err.contains("identity guard"), "{refused}");
    assert!(err.contains("mqtt.sessions.plant"), "{refused}");
    assert!(err.contains("config-rollback.md"), "{refused}");
    assert!(
        refused
            .stdout
            .contains("recorded but not configured here: ms-"),
        "{refused}"
    );

    // Without --store nothing is opened, as before.
    let offline = run_in_dir(&store, &["config", "check", "renamed.toml"]).await;
    assert!(offline.success().contains("configuration OK"), "{offline}");
}

async fn run_in_dir(store: &support::TestStore, args: &[&str]) -> support::Run {
    run(wharf_in(store.dir.path()), args, None).await
}
