//! `wharf sessions` as real processes on both backends: seeding is explicit and idempotent
//! across its forms (`SESSION`, `SESSION=F,F`, `--filter`), names what is wrong, and `list`,
//! `show` and `plan` read the exact history beside the configured filters.

#![allow(clippy::unwrap_used)]

mod support;

use serde_json::Value;
use support::{Backend, TestStore};

macro_rules! on_both_backends {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(super::Backend::Sqlite).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(super::Backend::Postgres).await;
            }
        }
    };
}

const CONFIG: &str = r#"
[mqtt.sessions.plant]
brokers = ["mqtt://127.0.0.1:1883"]
client_id = "wharf-sessions-cli"
subscriptions = [
  { filter = "sensors/+/temp", qos = 1, topic = "sensors" },
  { filter = "$share/wharf/alarms/#", qos = 1, topic = "alarms" },
]
"#;

async fn store_with_config(backend: Backend) -> Option<TestStore> {
    let store = TestStore::migrated(backend).await?;
    std::fs::write(store.dir.path().join("wharf.toml"), CONFIG).unwrap();
    Some(store)
}

async fn sessions(store: &TestStore, args: &[&str]) -> support::Run {
    let mut all = vec!["--config", "wharf.toml", "sessions"];
    all.extend_from_slice(args);
    store.run(&all).await
}

/// `wharf audit sessions --session plant --json`: the ledger's entries, oldest first.
async fn audit_entries(store: &TestStore) -> Vec<Value> {
    let run = store
        .run(&[
            "--config",
            "wharf.toml",
            "audit",
            "sessions",
            "--session",
            "plant",
            "--json",
        ])
        .await;
    serde_json::from_str(run.success()).unwrap()
}

async fn list_json(store: &TestStore) -> Vec<Value> {
    let run = sessions(store, &["list", "--json"]).await;
    serde_json::from_str(run.success()).unwrap()
}

async fn seeding_is_explicit_and_idempotent(backend: Backend) {
    let Some(store) = store_with_config(backend).await else {
        return;
    };
    // Before any seed the history is unknown, and plan refuses naming the seed command.
    let listed = list_json(&store).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["name"], "plant");
    assert!(listed[0]["history"].is_null(), "{listed:?}");
    let refused = sessions(&store, &["plan", "plant"]).await;
    assert!(
        refused.failure().contains("wharf sessions seed plant"),
        "{refused}"
    );

    // The exact existing filters, shared form included; a comma-holding filter by flag.
    let seeded = sessions(
        &store,
        &[
            "seed",
            "plant=sensors/#,$share/old/sensors/#",
            "--filter",
            "odd,topic/+",
        ],
    )
    .await;
    assert!(
        seeded.success().contains("seeded the baseline of plant"),
        "{seeded}"
    );
    assert!(seeded.success().contains("3 filter(s)"), "{seeded}");

    // Again: nothing to do. An explicit empty seed keeps the established baseline.
    let again = sessions(&store, &["seed", "plant=sensors/#"]).await;
    assert!(again.success().contains("nothing to do"), "{again}");
    let empty = sessions(&store, &["seed", "plant", "--source", "init"]).await;
    assert!(empty.success().contains("nothing to do"), "{empty}");
    // A new filter extends it.
    let id = listed[0]["session_id"].as_str().unwrap().to_owned();
    let extended = sessions(&store, &["seed", &format!("{id}=extra/#,sensors/#")]).await;
    assert!(
        extended.success().contains("added 1 of the 2"),
        "{extended}"
    );

    let shown = sessions(&store, &["show", "plant", "--json"]).await;
    let shown: Value = serde_json::from_str(shown.success()).unwrap();
    let filters: Vec<&str> = shown["recorded"]["filters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["filter"].as_str().unwrap())
        .collect();
    assert_eq!(
        filters,
        [
            "$share/old/sensors/#",
            "extra/#",
            "odd,topic/+",
            "sensors/#"
        ]
    );
    assert_eq!(shown["recorded"]["baseline_source"], "cli");

    // The plan subscribes the desired, removes exactly the stale strings, forgets after verify.
    let plan = sessions(&store, &["plan", "plant", "--json"]).await;
    let plan: Value = serde_json::from_str(plan.success()).unwrap();
    let names = |key: &str| -> Vec<String> {
        plan[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                v.as_str()
                    .map_or_else(|| v["filter"].as_str().unwrap().to_owned(), str::to_owned)
            })
            .collect()
    };
    assert_eq!(
        names("subscribe"),
        ["$share/wharf/alarms/#", "sensors/+/temp"]
    );
    assert_eq!(
        names("remember"),
        ["$share/wharf/alarms/#", "sensors/+/temp"]
    );
    assert_eq!(
        names("unsubscribe"),
        [
            "$share/old/sensors/#",
            "extra/#",
            "odd,topic/+",
            "sensors/#"
        ]
    );
    assert_eq!(plan["recycle"], true);

    let listed = list_json(&store).await;
    assert_eq!(listed[0]["history"], 4);
    assert_eq!(listed[0]["pending_removal"].as_array().unwrap().len(), 4);

    // The session projection is derived data: a replay reproduces it exactly.
    let verified = store.run(&["projections", "rebuild", "--verify"]).await;
    verified.success();
    store.run(&["projections", "rebuild"]).await.success();
    assert_eq!(
        list_json(&store).await,
        listed,
        "a rebuild reproduces the sessions"
    );

    // The audit shows who seeded what, in ledger order; the idempotent repeats wrote nothing.
    let audit = audit_entries(&store).await;
    let events: Vec<&str> = audit.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["BaselineSeeded", "BaselineExtended"]);
    assert_eq!(audit[0]["detail"]["source"], "cli");
    assert_eq!(
        audit[1]["detail"]["filters"],
        serde_json::json!(["extra/#"])
    );
}

on_both_backends!(seeding_is_explicit_and_idempotent);

async fn bad_seeds_name_what_is_wrong(backend: Backend) {
    let Some(store) = store_with_config(backend).await else {
        return;
    };
    let unknown = sessions(&store, &["seed", "nope"]).await;
    assert!(
        unknown.failure().contains("no session named \"nope\""),
        "{unknown}"
    );
    assert!(unknown.failure().contains("configured: plant"), "{unknown}");
    let bad = sessions(&store, &["seed", "plant=sensors/#/x"]).await;
    assert!(bad.failure().contains("sensors/#/x"), "{bad}");
    let share = sessions(&store, &["seed", "plant", "--filter", "$share/a+b/x"]).await;
    assert!(share.failure().contains("--filter"), "{share}");
    // Nothing was written by the refused seeds.
    assert!(list_json(&store).await[0]["history"].is_null());
}

on_both_backends!(bad_seeds_name_what_is_wrong);

async fn a_required_migration_is_listed_and_resolved_by_the_operator(backend: Backend) {
    let Some(store) = store_with_config(backend).await else {
        return;
    };
    sessions(&store, &["seed", "plant=$share/old/a/#"])
        .await
        .success();
    let id = list_json(&store).await[0]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let wharf = store.wharf().await;
    let filter = wharf::domain::session::ExactFilter::parse("$share/old/a/#").unwrap();
    wharf_server::supervisor::session_ledger(&wharf)
        .require_migration(&id, "a replay through $share/old/a/#".into(), vec![filter])
        .await
        .unwrap();
    let listed = list_json(&store).await;
    assert_eq!(
        listed[0]["migration_required"],
        "a replay through $share/old/a/#"
    );

    let resolved = sessions(&store, &["resolve-migration", "plant"]).await;
    assert!(
        resolved.success().contains("migration resolved"),
        "{resolved}"
    );
    assert!(list_json(&store).await[0]["migration_required"].is_null());
    let again = sessions(&store, &["resolve-migration", "plant"]).await;
    assert!(again.failure().contains("nothing to resolve"), "{again}");

    let audit = audit_entries(&store).await;
    let events: Vec<&str> = audit.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(
        events,
        ["BaselineSeeded", "MigrationRequired", "MigrationResolved"]
    );
}

on_both_backends!(a_required_migration_is_listed_and_resolved_by_the_operator);
