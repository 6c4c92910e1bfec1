//! The listing API over HTTP, against real stores: a SQLite file always, and Postgres (a fresh
//! schema per test) when `WHARF_TEST_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`)
//! is reachable. With `WHARF_REQUIRE_SERVICES=1` an unreachable Postgres fails the PG tests
//! instead of skipping them.
//!
//! Data is seeded through the store's locked group executor and the domain's `decide`, the way
//! a registering worker writes it, so the API reads what production would hold; messages go
//! through `wharf_queue::Queue` (publish, route, claim, nack) as a producer and workers would.

// All of this file is test code (helpers included, which clippy's allow-unwrap-in-tests does
// not cover): a panic is how a failed check reports.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, Utc};
use cqrs_es::Aggregate;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use wharf_api::ApiState;
use wharf_domain::{
    decide, AppVersion, BindingSet, ConsumerGroup, DeclarationEvent, DeclarerId, GroupName,
    LiveInstance, OpenWait, Register, RegisterOutcome, TopicName,
};
use wharf_projections::ReadModel;
use wharf_queue::{Headers, NackOutcome, OutgoingMessage, Queue, QueueSettings};
use wharf_store::{
    migrate, GroupDecision, GroupLock, GroupSnapshot, GroupWrite, Heartbeat, NewEvent, PgSettings,
    PgStore, SqliteStore, Store,
};

mod support;

const TTL: Duration = Duration::from_secs(60);
const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

// ---------------------------------------------------------------------------------------------
// Harness: a running server and the stores behind it.
// ---------------------------------------------------------------------------------------------

/// The API served on an ephemeral loopback port.
struct App {
    base: String,
    client: reqwest::Client,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl App {
    async fn start(state: ApiState) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(wharf_api::serve(listener, state, async move {
            let _ = stopped.await;
        }));
        Self {
            base,
            client: reqwest::Client::new(),
            stop,
            task,
        }
    }

    async fn over(store: &Store) -> Self {
        Self::start(ApiState::new(ReadModel::new(store.clone(), TTL))).await
    }

    /// GETs `path_and_query` (sent as written) and returns the status and the JSON body.
    async fn get(&self, path_and_query: &str) -> (u16, Value) {
        let response = self
            .client
            .get(format!("{}{path_and_query}", self.base))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let text = response.text().await.unwrap();
        support::contract::assert_conforms("GET", path_and_query, status, &content_type, &text);
        let expected = if path_and_query == "/readyz" {
            "application/health+json"
        } else {
            "application/json"
        };
        assert!(
            content_type.starts_with(expected),
            "GET {path_and_query}: content-type {content_type:?}, body {text:?}"
        );
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("GET {path_and_query}: not JSON ({e}): {text:?}"));
        (status, body)
    }

    /// Asserts a 400 naming `field` and quoting `value` in the message.
    async fn expect_invalid(&self, path_and_query: &str, field: &str, value: &str) {
        let (status, body) = self.get(path_and_query).await;
        assert_eq!(status, 400, "GET {path_and_query}: {body}");
        assert_eq!(body["error"]["code"], "invalid_parameter", "{body}");
        assert_eq!(
            body["error"]["field"], field,
            "GET {path_and_query}: {body}"
        );
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("{value:?}")),
            "GET {path_and_query}: message {message:?} does not quote {value:?}"
        );
    }

    /// Stops the server gracefully and checks it ended cleanly.
    async fn shut_down(self) {
        self.stop.send(()).unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the server did not stop after the shutdown signal");
        ended.unwrap().unwrap();
    }
}

/// A migrated store in a temporary SQLite file.
async fn sqlite_store(dir: &tempfile::TempDir, name: &str, migrate: bool) -> Store {
    let store = SqliteStore::open(dir.path().join(name), wharf_projections::sqlite_inline())
        .await
        .unwrap();
    if migrate {
        store.migrate().await.unwrap();
    }
    Store::Sqlite(store)
}

/// A Postgres store in a schema of its own, dropped by [`PgDb::drop_schema`].
struct PgDb {
    store: Store,
    pg: PgStore,
    schema: String,
}

impl PgDb {
    /// A fresh schema (migrated when asked), or `None` when Postgres is unreachable and not
    /// required.
    async fn new(migrate: bool) -> Option<Self> {
        let url = std::env::var("WHARF_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into());
        let nanos = Utc::now().timestamp_nanos_opt().unwrap_or_default();
        let schema = format!("wharf_api_{}_{nanos}", std::process::id());
        let settings = PgSettings {
            schema: Some(schema.clone()),
            ..PgSettings::new(url.clone())
        };
        if let Err(e) = PgStore::create_schema(&settings).await {
            let url = wharf_store::postgres::redact(&url);
            let required = std::env::var("WHARF_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
            if required {
                panic!("WHARF_REQUIRE_SERVICES=1 but Postgres at {url} is unreachable: {e}");
            }
            eprintln!("notice: skipping a Postgres test: {url} is unreachable: {e}");
            return None;
        }
        let pg = PgStore::connect(&settings, wharf_projections::pg_inline()).unwrap();
        if migrate {
            pg.migrate().await.unwrap();
        }
        Some(Self {
            store: Store::Postgres(pg.clone()),
            pg,
            schema,
        })
    }

    async fn drop_schema(self) {
        let statement = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema);
        if let Err(e) = sqlx::query(&statement).execute(self.pg.pool()).await {
            eprintln!("notice: could not drop test schema {}: {e}", self.schema);
        }
        self.pg.pool().close().await;
    }
}

/// One Register attempt through the locked executor: fold the group's events, decide with the
/// live instances the store observed plus `live_instances`, append the events and, when the
/// declarer may consume, record its heartbeat.
async fn register(
    store: &Store,
    group: &str,
    topic: &str,
    declarer: &str,
    patterns: &[&str],
    live_instances: &[(&str, &[&str])],
) -> RegisterOutcome {
    let group_name = GroupName::parse("group", group).unwrap();
    let topic_name = TopicName::parse("topic", topic).unwrap();
    let declarer = DeclarerId::parse("declarer", declarer).unwrap();
    let requested = BindingSet::parse(patterns).unwrap();
    let extra: Vec<LiveInstance> = live_instances
        .iter()
        .map(|(who, set)| LiveInstance {
            declarer: DeclarerId::parse("declarer", who).unwrap(),
            patterns: BindingSet::parse(set).unwrap(),
        })
        .collect();
    let lock = GroupLock {
        group: group.to_owned(),
        topic: topic.to_owned(),
        declarer: declarer.to_string(),
        instance_ttl: TTL,
        after_sequence: 0,
    };
    let decide_in_lock = move |snapshot: &GroupSnapshot| -> GroupDecision<RegisterOutcome, String> {
        let mut state = ConsumerGroup::default();
        for recorded in &snapshot.events {
            let event: DeclarationEvent = recorded.decode().map_err(|e| e.to_string())?;
            state.apply(event);
        }
        let mut live = Vec::new();
        for row in &snapshot.observed.live {
            live.push(LiveInstance {
                declarer: DeclarerId::parse("declarer", &row.declarer)
                    .map_err(|e| e.to_string())?,
                patterns: BindingSet::parse(&row.patterns).map_err(|e| e.to_string())?,
            });
        }
        live.extend(extra);
        let command = Register {
            group: group_name,
            topic: topic_name,
            declarer,
            version: AppVersion::parse("version", "1.0.0").unwrap(),
            requested,
            first_declared_at: None,
            now: snapshot.now,
            live_instances: live,
            open_wait: snapshot.observed.open_wait.as_ref().map(|row| OpenWait {
                patterns: BindingSet::parse(&row.patterns).expect("a stored set"),
                declared_at: row.declared_at,
            }),
        };
        let decision = decide(&state, &command).map_err(|e| e.to_string())?;
        let events = decision
            .events
            .iter()
            .map(|event| NewEvent::from_domain(event, json!({})))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let heartbeat = decision.outcome.may_consume().then(|| Heartbeat {
            declarer: command.declarer.to_string(),
            version: command.version.to_string(),
            patterns: command.requested.patterns(),
        });
        Ok((
            GroupWrite {
                events,
                extra: heartbeat.map(Into::into),
            },
            decision.outcome,
        ))
    };
    store
        .execute_group(lock, decide_in_lock)
        .await
        .expect("the store failed")
        .expect("the decision refused")
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// A group view without the waiters' seconds and the queue's oldest-unacked age, which grow
/// between two reads.
fn without_clock_readings(group: &Value) -> Value {
    let mut group = group.clone();
    for waiter in group["waiters"].as_array_mut().into_iter().flatten() {
        let fields = waiter.as_object_mut().unwrap();
        fields.remove("waiting_seconds");
        fields.remove("silent_seconds");
    }
    if let Some(queue) = group["queue"].as_object_mut() {
        queue.remove("oldest_unacked_seconds");
    }
    group
}

/// A listing entry is the summary of the one-group read: the same group, topic, effective
/// declaration and queue figures, its counts those of the group's lists (each under a page
/// here), its oldest waiter the first of them.
fn assert_summarizes(entry: &Value, group: &Value) {
    let (entry, group) = (without_clock_readings(entry), without_clock_readings(group));
    for field in ["group", "topic", "effective", "queue"] {
        assert_eq!(entry[field], group[field], "{field}: {entry} vs {group}");
    }
    let waiters = group["waiters"].as_array().unwrap();
    let instances = group["instances"].as_array().unwrap();
    let live = instances.iter().filter(|i| i["live"] == true).count();
    assert_eq!(
        entry["waiters"],
        json!({ "count": waiters.len(), "more": false })
    );
    assert_eq!(entry["instances"], instances.len());
    assert_eq!(entry["live_instances"], live);
    let mut oldest = entry["oldest_waiter"].clone();
    if let Some(fields) = oldest.as_object_mut() {
        fields.remove("waiting_seconds");
        fields.remove("silent_seconds");
    }
    assert_eq!(oldest, waiters.first().cloned().unwrap_or(Value::Null));
}

/// The queue figures of a group with nothing routed, in flight or dead.
fn idle_queue(routed_position: i64, routed_lag: i64) -> Value {
    json!({
        "routed_position": routed_position,
        "routed_lag": routed_lag,
        "claimable": 0,
        "in_flight": 0,
        "backing_off": 0,
        "dead_letters": 0,
        "oldest_unacked_seconds": null,
        "set_aside": 0,
        "rescan_remaining": 0,
    })
}

fn positions(page: &Value) -> Vec<i64> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["position"].as_i64().unwrap())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Scenarios, each run on SQLite and on Postgres.
// ---------------------------------------------------------------------------------------------

/// Group listing and one group: empty and seeded, bad name, unknown name.
async fn listing(store: Store) {
    let app = App::over(&store).await;

    let (status, body) = app.get("/api/v1/groups").await;
    assert_eq!(
        (status, body),
        (200, json!({ "groups": [], "next_after": null }))
    );

    let installed = register(
        &store,
        "billing",
        "events",
        "host-a:1:aa",
        &["orders/+/created"],
        &[],
    )
    .await;
    assert!(
        matches!(installed, RegisterOutcome::Installed { .. }),
        "{installed:?}"
    );
    // host-a is live with another set, so host-b waits.
    let waiting = register(
        &store,
        "billing",
        "events",
        "host-b:2:bb",
        &["orders/#"],
        &[],
    )
    .await;
    assert!(
        matches!(waiting, RegisterOutcome::Waiting { .. }),
        "{waiting:?}"
    );
    // A whole-topic group whose change waits on a live instance the caller reports.
    register(&store, "shipping", "parcels", "host-c:3:cc", &[], &[]).await;
    let ghost: &[(&str, &[&str])] = &[("host-z:9:zz", &[])];
    let waiting = register(
        &store,
        "shipping",
        "parcels",
        "host-d:4:dd",
        &["eu/#"],
        ghost,
    )
    .await;
    assert!(
        matches!(waiting, RegisterOutcome::Waiting { .. }),
        "{waiting:?}"
    );

    let (status, body) = app.get("/api/v1/groups").await;
    assert_eq!(status, 200, "{body}");
    let groups = body["groups"].as_array().unwrap();
    let names: Vec<&str> = groups
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["billing", "shipping"]);
    assert_eq!(groups[1]["effective"]["whole_topic"], true);
    assert_eq!(groups[1]["effective"]["patterns"], json!([]));
    assert_eq!(groups[1]["oldest_waiter"]["declarer"], "host-d:4:dd");
    assert_eq!(groups[1]["waiters"], json!({ "count": 1, "more": false }));
    assert_eq!(groups[1]["instances"], 1);

    let (status, group) = app.get("/api/v1/groups/billing").await;
    assert_eq!(status, 200, "{group}");
    assert_summarizes(&groups[0], &group);
    assert_eq!(group["group"], "billing");
    assert_eq!(group["topic"], "events");
    let effective = &group["effective"];
    assert_eq!(effective["patterns"], json!(["orders/+/created"]));
    assert_eq!(effective["whole_topic"], false);
    assert_eq!(effective["declarer"], "host-a:1:aa");
    assert_eq!(effective["version"], "1.0.0");
    assert_eq!(effective["installs"], 1);
    assert_eq!(effective["previous"], Value::Null);
    assert!(effective["position"].as_i64().unwrap() > 0);
    assert!(effective["installed_at"]
        .as_str()
        .unwrap()
        .parse::<DateTime<Utc>>()
        .is_ok());

    let waiters = group["waiters"].as_array().unwrap();
    assert_eq!(waiters.len(), 1, "{group}");
    assert_eq!(waiters[0]["declarer"], "host-b:2:bb");
    assert_eq!(waiters[0]["patterns"], json!(["orders/#"]));
    assert_eq!(waiters[0]["incumbent"], json!(["orders/+/created"]));
    assert!(waiters[0]["waiting_seconds"].as_f64().unwrap() >= 0.0);

    let instances = group["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 1, "only the installer consumes: {group}");
    assert_eq!(instances[0]["declarer"], "host-a:1:aa");
    assert_eq!(instances[0]["patterns"], json!(["orders/+/created"]));
    assert_eq!(instances[0]["live"], true);
    // Nothing was ever published to the group's topic: every queue figure is zero.
    assert_eq!(group["queue"], idle_queue(0, 0), "{group}");

    let (status, body) = app.get("/api/v1/groups/bad$name").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_parameter");
    assert_eq!(body["error"]["field"], "group");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("bad$name"));
    app.expect_invalid("/api/v1/groups/with%20space", "group", "with space")
        .await;

    app.expect_invalid("/api/v1/groups/a%2Fb", "group", "a/b")
        .await;
    let (status, body) = app.get("/api/v1/groups/%FF").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["field"], "group", "{body}");

    let (status, body) = app.get("/api/v1/groups/never-declared").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("never-declared"));
    assert!(body["error"].get("field").is_none(), "{body}");

    app.shut_down().await;
}

/// The declarations listing: paging, filters, 404 and every 400.
async fn declarations(store: Store) {
    let app = App::over(&store).await;
    let (status, body) = app.get("/api/v1/groups/audit/declarations").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");

    register(&store, "audit", "events", "host-a:1:aa", &["a/1"], &[]).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let between_first_and_second = store.now().await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    register(&store, "audit", "events", "host-b:2:bb", &["a/2"], &[]).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let between_second_and_third = store.now().await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    register(&store, "audit", "events", "host-b:2:bb", &["a/2"], &[]).await;

    // The whole history on one page.
    let (status, all) = app.get("/api/v1/groups/audit/declarations").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(all["next_after"], Value::Null);
    let entries = all["entries"].as_array().unwrap();
    let statuses: Vec<&str> = entries
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["installed", "waiting", "waiting"]);
    let sequences: Vec<i64> = entries
        .iter()
        .map(|e| e["sequence"].as_i64().unwrap())
        .collect();
    assert_eq!(sequences, [1, 2, 3]);
    assert_eq!(entries[0]["declarer"], "host-a:1:aa");
    assert_eq!(entries[0]["patterns"], json!(["a/1"]));
    assert_eq!(entries[0]["previous"], Value::Null);
    assert_eq!(entries[1]["incumbent"], json!(["a/1"]));
    assert_eq!(entries[1]["live_declarers"], json!(["host-a:1:aa"]));
    assert_eq!(
        entries[2]["declared_at"], entries[1]["declared_at"],
        "a retry keeps declared_at"
    );
    let p = positions(&all);
    assert!(p[0] < p[1] && p[1] < p[2], "{p:?}");

    // Paging: limit=1 hands out next_after, and following it yields the next entry.
    let (status, first) = app.get("/api/v1/groups/audit/declarations?limit=1").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(positions(&first), [p[0]]);
    assert_eq!(first["next_after"], p[0]);
    let (status, second) = app
        .get(&format!(
            "/api/v1/groups/audit/declarations?limit=1&after={}",
            p[0]
        ))
        .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(positions(&second), [p[1]]);
    assert_eq!(second["entries"][0], entries[1]);
    assert_eq!(second["next_after"], p[1]);
    let (_, last) = app
        .get(&format!(
            "/api/v1/groups/audit/declarations?after={}&limit=5",
            p[1]
        ))
        .await;
    assert_eq!(positions(&last), [p[2]]);
    assert_eq!(last["next_after"], Value::Null);

    // The declarer filter.
    let (status, by_b) = app
        .get("/api/v1/groups/audit/declarations?declarer=host-b:2:bb")
        .await;
    assert_eq!(status, 200, "{by_b}");
    assert_eq!(positions(&by_b), [p[1], p[2]]);
    let (_, by_a) = app
        .get("/api/v1/groups/audit/declarations?declarer=host-a%3A1%3Aaa")
        .await;
    assert_eq!(positions(&by_a), [p[0]]);
    let (status, nobody) = app
        .get("/api/v1/groups/audit/declarations?declarer=nobody")
        .await;
    assert_eq!(
        (status, nobody),
        (200, json!({ "entries": [], "next_after": null }))
    );

    // The time filters: since is inclusive, until exclusive, by the ledger's recorded_at.
    let t1 = rfc3339(between_first_and_second);
    let t2 = rfc3339(between_second_and_third);
    let (status, since) = app
        .get(&format!("/api/v1/groups/audit/declarations?since={t1}"))
        .await;
    assert_eq!(status, 200, "{since}");
    assert_eq!(positions(&since), [p[1], p[2]]);
    let (_, until) = app
        .get(&format!("/api/v1/groups/audit/declarations?until={t1}"))
        .await;
    assert_eq!(positions(&until), [p[0]]);
    let (_, window) = app
        .get(&format!(
            "/api/v1/groups/audit/declarations?since={t1}&until={t2}&declarer=host-b:2:bb"
        ))
        .await;
    assert_eq!(positions(&window), [p[1]]);
    // An offset with '+' sent unencoded arrives as a space and is still understood; %2B works.
    let offset = between_first_and_second
        .format("%Y-%m-%dT%H:%M:%S%.6f+00:00")
        .to_string();
    let (status, raw_plus) = app
        .get(&format!("/api/v1/groups/audit/declarations?since={offset}"))
        .await;
    assert_eq!(status, 200, "{raw_plus}");
    assert_eq!(positions(&raw_plus), [p[1], p[2]]);
    let encoded = offset.replace('+', "%2B");
    let (_, encoded_plus) = app
        .get(&format!(
            "/api/v1/groups/audit/declarations?since={encoded}"
        ))
        .await;
    assert_eq!(positions(&encoded_plus), [p[1], p[2]]);

    // Each bad parameter is a JSON 400 naming the parameter and quoting the value.
    let path = "/api/v1/groups/audit/declarations";
    app.expect_invalid(&format!("{path}?since=yesterday"), "since", "yesterday")
        .await;
    app.expect_invalid(
        &format!("{path}?until=2024-02-30T00:00:00Z"),
        "until",
        "2024-02-30T00:00:00Z",
    )
    .await;
    app.expect_invalid(&format!("{path}?after=abc"), "after", "abc")
        .await;
    app.expect_invalid(&format!("{path}?after=-3"), "after", "-3")
        .await;
    app.expect_invalid(&format!("{path}?limit=ten"), "limit", "ten")
        .await;
    app.expect_invalid(&format!("{path}?limit=0"), "limit", "0")
        .await;
    app.expect_invalid(&format!("{path}?limit=1001"), "limit", "1001")
        .await;
    app.expect_invalid(&format!("{path}?limit=-1"), "limit", "-1")
        .await;
    app.expect_invalid(&format!("{path}?limit=1&limit=2"), "limit", "2")
        .await;
    app.expect_invalid(&format!("{path}?declarer="), "declarer", "")
        .await;
    app.expect_invalid(&format!("{path}?colour=blue"), "colour", "blue")
        .await;
    app.expect_invalid(
        &format!("{path}?since=2024-01-02T00:00:00Z&until=2024-01-01T00:00:00Z"),
        "until",
        "2024-01-01T00:00:00Z",
    )
    .await;
    app.expect_invalid(&format!("{path}?since={t1}&until={t1}"), "until", &t1)
        .await;
    app.expect_invalid("/api/v1/groups/bad$name/declarations", "group", "bad$name")
        .await;
    // Parameters are checked before the group is looked up.
    app.expect_invalid("/api/v1/groups/unknown/declarations?limit=0", "limit", "0")
        .await;

    app.shut_down().await;
}

fn dead_positions(page: &Value) -> Vec<i64> {
    page["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["position"].as_i64().unwrap())
        .collect()
}

/// The queue listing: topics, each group's queue figures as messages are published, routed,
/// claimed and nacked, and the dead letters with their paging and refusals.
async fn queue_listing(store: Store) {
    // The app's own queue: one attempt, so the first nack dead-letters.
    let queue = Queue::new(
        store.clone(),
        QueueSettings {
            max_attempts: 1,
            ..QueueSettings::default()
        },
    );
    let state = ApiState::new(ReadModel::new(store.clone(), TTL)).with_queue(queue.clone());
    let app = App::start(state).await;

    let (status, body) = app.get("/api/v1/topics").await;
    assert_eq!((status, body), (200, json!({ "topics": [] })));

    register(
        &store,
        "billing",
        "orders",
        "host-a:1:aa",
        &["orders/+/paid"],
        &[],
    )
    .await;
    register(
        &store,
        "refunds",
        "orders",
        "host-b:2:bb",
        &["orders/+/refunded"],
        &[],
    )
    .await;
    let billing = GroupName::parse("group", "billing").unwrap();
    let refunds = GroupName::parse("group", "refunds").unwrap();
    let (_, group) = app.get("/api/v1/groups/billing").await;
    assert_eq!(group["queue"], idle_queue(0, 0), "{group}");

    let topic = TopicName::parse("topic", "orders").unwrap();
    let first_payload = b"\xff\x00paid-eu".to_vec();
    let messages = [
        OutgoingMessage::new(
            "orders/eu/paid",
            first_payload.clone(),
            Headers::from([("trace".to_owned(), "t-1".to_owned())]),
        )
        .unwrap(),
        OutgoingMessage::new("orders/eu/refunded", b"refund".to_vec(), Headers::new()).unwrap(),
        OutgoingMessage::new("orders/us/paid", b"paid-us".to_vec(), Headers::new()).unwrap(),
    ];
    assert_eq!(queue.publish(&topic, &messages).await.unwrap(), [1, 2, 3]);

    let (status, body) = app.get("/api/v1/topics").await;
    assert_eq!(
        (status, body),
        (
            200,
            json!({ "topics": [{ "topic": "orders", "head": 3, "size": 3 }] })
        )
    );

    // Published, not routed: the whole log is the group's routing lag.
    let (status, group) = app.get("/api/v1/groups/billing").await;
    assert_eq!(status, 200, "{group}");
    assert_eq!(group["queue"], idle_queue(0, 3), "{group}");

    // Routed: two of three match the group's set and are claimable.
    let report = queue.route(&billing).await.unwrap();
    assert_eq!((report.routed, report.position), (2, 3), "{report:?}");
    let (_, group) = app.get("/api/v1/groups/billing").await;
    let figures = &group["queue"];
    assert_eq!(figures["routed_position"], 3, "{group}");
    assert_eq!(figures["routed_lag"], 0, "{group}");
    assert_eq!(figures["claimable"], 2, "{group}");
    assert_eq!(figures["in_flight"], 0, "{group}");
    assert!(
        figures["oldest_unacked_seconds"].as_f64().unwrap() >= 0.0,
        "{group}"
    );

    // Claimed: in flight, no longer claimable.
    let claimed = queue.claim(&billing, "host-a:1:aa", 10).await.unwrap();
    assert_eq!(claimed.len(), 2);
    let (_, group) = app.get("/api/v1/groups/billing").await;
    assert_eq!(group["queue"]["claimable"], 0, "{group}");
    assert_eq!(group["queue"]["in_flight"], 2, "{group}");
    assert_eq!(group["queue"]["dead_letters"], 0, "{group}");

    // Nacked with one attempt allowed: dead letters, nothing left unacked.
    for message in &claimed {
        let outcome = queue.nack(message, "boom").await.unwrap();
        assert_eq!(outcome, NackOutcome::DeadLettered);
    }
    let (_, group) = app.get("/api/v1/groups/billing").await;
    assert_eq!(
        group["queue"],
        json!({
            "routed_position": 3,
            "routed_lag": 0,
            "claimable": 0,
            "in_flight": 0,
            "backing_off": 0,
            "dead_letters": 2,
            "oldest_unacked_seconds": null,
            "set_aside": 0,
            "rescan_remaining": 0,
        }),
        "{group}"
    );

    // The other group retries (default settings): its nacked message backs off.
    let retrying = Queue::new(store.clone(), QueueSettings::default());
    let claimed_refund = retrying.fetch(&refunds, "host-b:2:bb", 10).await.unwrap();
    assert_eq!(claimed_refund.len(), 1);
    let outcome = retrying.nack(&claimed_refund[0], "later").await.unwrap();
    assert!(
        matches!(outcome, NackOutcome::Retrying { .. }),
        "{outcome:?}"
    );

    // The list joins each group with its own figures.
    let (status, body) = app.get("/api/v1/groups").await;
    assert_eq!(status, 200, "{body}");
    let groups = body["groups"].as_array().unwrap();
    let names: Vec<&str> = groups
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["billing", "refunds"]);
    assert_summarizes(&groups[0], &group);
    let refund_figures = &groups[1]["queue"];
    assert_eq!(refund_figures["routed_position"], 3, "{body}");
    assert_eq!(refund_figures["backing_off"], 1, "{body}");
    assert_eq!(refund_figures["claimable"], 0, "{body}");
    assert_eq!(refund_figures["in_flight"], 0, "{body}");
    assert_eq!(refund_figures["dead_letters"], 0, "{body}");
    assert!(
        refund_figures["oldest_unacked_seconds"].is_number(),
        "{body}"
    );

    // The dead letters, whole.
    let (status, page) = app.get("/api/v1/groups/billing/dead-letters").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["next_after"], Value::Null);
    assert_eq!(dead_positions(&page), [1, 3]);
    let first = &page["dead_letters"][0];
    assert_eq!(first["topic"], "orders");
    assert_eq!(first["subject"], "orders/eu/paid");
    assert_eq!(first["payload_base64"], "/wBwYWlkLWV1");
    let decoded = STANDARD
        .decode(first["payload_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(decoded, first_payload);
    assert_eq!(first["headers"], json!({ "trace": "t-1" }));
    assert_eq!(first["attempts"], 1);
    assert_eq!(first["last_error"], "boom");
    let claimed_first = claimed.iter().find(|c| c.position == 1).unwrap();
    assert_eq!(
        first["published_at"],
        serde_json::to_value(claimed_first.published_at).unwrap()
    );
    let published: DateTime<Utc> = first["published_at"].as_str().unwrap().parse().unwrap();
    let dead_at: DateTime<Utc> = first["dead_at"].as_str().unwrap().parse().unwrap();
    assert!(dead_at >= published, "{first}");
    assert!(first.get("payload").is_none(), "{first}");
    let second = &page["dead_letters"][1];
    assert_eq!(second["subject"], "orders/us/paid");
    assert_eq!(second["payload_base64"], STANDARD.encode(b"paid-us"));
    assert_eq!(second["headers"], json!({}));

    // Paging: limit=1 hands out next_after, and following it yields the next dead letter.
    let path = "/api/v1/groups/billing/dead-letters";
    let (status, one) = app.get(&format!("{path}?limit=1")).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(dead_positions(&one), [1]);
    assert_eq!(one["next_after"], 1);
    assert_eq!(one["dead_letters"][0], *first);
    let (_, two) = app.get(&format!("{path}?after=1&limit=1")).await;
    assert_eq!(dead_positions(&two), [3]);
    assert_eq!(two["next_after"], 3);
    let (status, past) = app.get(&format!("{path}?limit=1&after=3")).await;
    assert_eq!(
        (status, past),
        (200, json!({ "dead_letters": [], "next_after": null }))
    );
    let (status, none) = app.get("/api/v1/groups/refunds/dead-letters").await;
    assert_eq!(
        (status, none),
        (200, json!({ "dead_letters": [], "next_after": null }))
    );

    // An unknown group is a 404; each bad parameter a 400 naming it, checked before the lookup.
    let (status, body) = app.get("/api/v1/groups/unknown/dead-letters").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("unknown"));
    app.expect_invalid(&format!("{path}?limit=0"), "limit", "0")
        .await;
    app.expect_invalid(&format!("{path}?limit=1001"), "limit", "1001")
        .await;
    app.expect_invalid(&format!("{path}?limit=many"), "limit", "many")
        .await;
    app.expect_invalid(&format!("{path}?after=-1"), "after", "-1")
        .await;
    app.expect_invalid(&format!("{path}?after=1&after=2"), "after", "2")
        .await;
    app.expect_invalid(&format!("{path}?colour=blue"), "colour", "blue")
        .await;
    app.expect_invalid(
        &format!("{path}?since=2024-01-01T00:00:00Z"),
        "since",
        "2024-01-01T00:00:00Z",
    )
    .await;
    app.expect_invalid("/api/v1/groups/unknown/dead-letters?limit=0", "limit", "0")
        .await;
    app.expect_invalid("/api/v1/groups/bad$name/dead-letters", "group", "bad$name")
        .await;

    // A swap with an unacked delivery of the old set: the group's figures and the swaps
    // listing count it as set aside.
    queue
        .publish(
            &topic,
            &[OutgoingMessage::new("orders/us/paid", b"late".to_vec(), Headers::new()).unwrap()],
        )
        .await
        .unwrap();
    assert_eq!(queue.route(&billing).await.unwrap().routed, 1);
    assert!(store.leave("billing", "host-a:1:aa").await.unwrap());
    let outcome = register(
        &store,
        "billing",
        "orders",
        "host-c:3:cc",
        &["orders/eu/#"],
        &[],
    )
    .await;
    assert!(
        matches!(outcome, RegisterOutcome::Installed { .. }),
        "{outcome:?}"
    );
    // orders/eu/refunded, routed past under the old set, is the new set's now; orders/eu/paid
    // was dead-lettered under the old set, so it is not handed out again.
    let handed = queue.fetch(&billing, "host-c:3:cc", 10).await.unwrap();
    let subjects: Vec<&str> = handed.iter().map(|c| c.subject.as_str()).collect();
    assert_eq!(subjects, ["orders/eu/refunded"]);
    queue.ack(&handed[0]).await.unwrap();
    let (_, group) = app.get("/api/v1/groups/billing").await;
    assert_eq!(group["queue"]["set_aside"], 1, "{group}");
    assert_eq!(group["queue"]["claimable"], 0, "{group}");
    let (status, swaps) = app.get("/api/v1/groups/billing/swaps").await;
    assert_eq!(status, 200, "{swaps}");
    let newest = &swaps["swaps"][0];
    assert_eq!(newest["patterns"], json!(["orders/eu/#"]), "{swaps}");
    assert_eq!(
        (&newest["kept"], &newest["set_aside"], &newest["restored"]),
        (&json!(0), &json!(1), &json!(0)),
        "{swaps}"
    );
    let (_, one) = app.get("/api/v1/groups/billing/swaps?limit=1").await;
    assert_eq!(one["swaps"].as_array().unwrap().len(), 1, "{one}");
    app.expect_invalid("/api/v1/groups/billing/swaps?limit=0", "limit", "0")
        .await;
    app.expect_invalid("/api/v1/groups/billing/swaps?after=1", "after", "1")
        .await;
    let (status, _) = app.get("/api/v1/groups/unknown/swaps").await;
    assert_eq!(status, 404);

    app.shut_down().await;
}

/// The document, the probes and the JSON fallbacks.
async fn probes_and_docs(store: Store) {
    let app = App::over(&store).await;

    let (status, doc) = app.get("/api/v1/openapi.json").await;
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    for path in [
        wharf_api::TOPICS_PATH,
        wharf_api::GROUPS_PATH,
        wharf_api::GROUP_PATH,
        wharf_api::DECLARATIONS_PATH,
        wharf_api::DEAD_LETTERS_PATH,
        wharf_api::OPENAPI_PATH,
        wharf_api::HEALTHZ_PATH,
        wharf_api::READYZ_PATH,
        wharf_api::METRICS_PATH,
    ] {
        assert!(
            doc["paths"][path]["get"].is_object(),
            "{path} is not documented"
        );
    }

    assert_eq!(
        app.get("/healthz").await,
        (200, json!({ "status": "pass" }))
    );
    assert_eq!(
        app.get("/readyz").await,
        (
            200,
            json!({
                "status": "pass",
                "checks": {
                    "store:schema": [{ "status": "pass" }],
                    "projections:catch-up": [{ "status": "pass" }],
                }
            })
        )
    );

    for unknown in [
        "/nope",
        "/api/v1/groups/",
        "/api/v2/groups",
        "/api/v1/groups/a/b/c",
    ] {
        let (status, body) = app.get(unknown).await;
        assert_eq!(status, 404, "GET {unknown}: {body}");
        assert_eq!(body["error"]["code"], "not_found", "GET {unknown}");
        assert!(body["error"]["message"].as_str().unwrap().contains(unknown));
    }

    let response = app
        .client
        .post(format!("{}/api/v1/groups", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 405);
    let allow = response
        .headers()
        .get("allow")
        .map(|v| v.to_str().unwrap().to_owned());
    assert!(
        allow.is_some_and(|a| a.contains("GET")),
        "405 without an Allow: GET header"
    );
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = response.text().await.unwrap();
    support::contract::assert_conforms("POST", "/api/v1/groups", 405, &content_type, &text);
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed");

    app.shut_down().await;
}

// ---------------------------------------------------------------------------------------------
// SQLite.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn sqlite_listing() {
    let dir = tempfile::tempdir().unwrap();
    listing(sqlite_store(&dir, "wharf.db", true).await).await;
}

#[tokio::test]
async fn sqlite_declarations() {
    let dir = tempfile::tempdir().unwrap();
    declarations(sqlite_store(&dir, "wharf.db", true).await).await;
}

#[tokio::test]
async fn sqlite_queue_listing() {
    let dir = tempfile::tempdir().unwrap();
    queue_listing(sqlite_store(&dir, "wharf.db", true).await).await;
}

#[tokio::test]
async fn sqlite_probes_and_docs() {
    let dir = tempfile::tempdir().unwrap();
    probes_and_docs(sqlite_store(&dir, "wharf.db", true).await).await;
}

#[tokio::test]
async fn sqlite_unmigrated_store_is_live_but_not_ready_and_leaks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // A migrated file beside an unmigrated one: readiness is about the store the API uses.
    let _migrated = sqlite_store(&dir, "migrated.db", true).await;
    let app = App::over(&sqlite_store(&dir, "fresh.db", false).await).await;

    assert_eq!(
        app.get("/healthz").await,
        (200, json!({ "status": "pass" }))
    );
    let (status, body) = app.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "fail");
    assert!(
        body["output"].as_str().unwrap().contains("migrate"),
        "{body}"
    );
    assert_eq!(
        body["checks"]["store:schema"][0]["status"], "fail",
        "{body}"
    );

    let (status, body) = app.get("/api/v1/groups").await;
    // Reading missing tables is an internal error today (500); a store that reported it as
    // NotMigrated would make it 503. Either way the detail stays in the log.
    assert!(status == 500 || status == 503, "{status}: {body}");
    let code = body["error"]["code"].as_str().unwrap();
    assert!(code == "internal" || code == "unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        !message.contains("no such table"),
        "detail leaked: {message}"
    );
    assert!(!message.contains("sqlite"), "detail leaked: {message}");

    app.shut_down().await;
}

#[tokio::test]
async fn a_custom_readiness_probe_decides_and_is_bounded_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let read_model = ReadModel::new(sqlite_store(&dir, "wharf.db", true).await, TTL);

    let draining = ApiState::with_readiness(read_model.clone(), || async {
        Err("draining for shutdown".to_owned())
    });
    let app = App::start(draining).await;
    assert_eq!(
        app.get("/readyz").await,
        (
            503,
            json!({
                "status": "fail",
                "output": "draining for shutdown",
                "checks": {
                    "readiness:probe": [{ "status": "fail", "output": "draining for shutdown" }]
                }
            })
        )
    );
    app.shut_down().await;

    let stuck = ApiState::with_readiness(read_model, || async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(())
    })
    .ready_timeout(Duration::from_millis(100));
    let app = App::start(stuck).await;
    let (status, body) = app.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["output"].as_str().unwrap().contains("did not finish"),
        "{body}"
    );
    app.shut_down().await;
}

/// A store that answers but whose catch-up projection fails (its table is gone, as a damaged
/// page would make it unreadable) is not ready, with the reason under its check's key; the
/// liveness probe does not look at the store.
#[tokio::test]
async fn a_failing_catch_up_makes_readiness_fail_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir, "wharf.db", true).await;
    register(
        &store,
        "billing",
        "orders",
        "alpha-1",
        &["orders/+/paid"],
        &[],
    )
    .await;
    let app = App::over(&store).await;
    let (status, body) = app.get("/readyz").await;
    assert_eq!((status, &body["status"]), (200, &json!("pass")), "{body}");

    let Store::Sqlite(sqlite) = &store else {
        unreachable!()
    };
    sqlite
        .write(|ctx| Ok(ctx.tx.execute_batch("DROP TABLE declarer_attempt")?))
        .await
        .unwrap();
    register(&store, "billing", "orders", "beta-1", &["orders/eu/#"], &[]).await;

    let (status, body) = app.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "fail", "{body}");
    assert_eq!(
        body["checks"]["store:schema"][0]["status"], "pass",
        "{body}"
    );
    let check = &body["checks"]["projections:catch-up"][0];
    assert_eq!(check["status"], "fail", "{body}");
    assert!(
        check["output"]
            .as_str()
            .unwrap()
            .contains("declarer_attempt"),
        "{body}"
    );
    assert_eq!(body["output"], check["output"], "{body}");
    assert_eq!(
        app.get("/healthz").await,
        (200, json!({ "status": "pass" }))
    );
    app.shut_down().await;
}

/// A store migrated by a newer build serves reads: ready, with a warning naming both versions.
#[tokio::test]
async fn a_newer_schema_is_ready_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_store(&dir, "wharf.db", true).await;
    let Store::Sqlite(sqlite) = &store else {
        unreachable!()
    };
    sqlite
        .write(|ctx| {
            Ok(ctx.tx.execute_batch(
                "INSERT INTO wharf_schema_migrations VALUES (99, '0099_newer.sql', 0)",
            )?)
        })
        .await
        .unwrap();
    let app = App::over(&store).await;
    let (status, body) = app.get("/readyz").await;
    assert_eq!((status, &body["status"]), (200, &json!("warn")), "{body}");
    let output = body["checks"]["store:schema"][0]["output"]
        .as_str()
        .unwrap();
    let known = format!("({})", migrate::needed(migrate::SQLITE));
    assert!(output.contains("99") && output.contains(&known), "{body}");
    app.shut_down().await;
}

// ---------------------------------------------------------------------------------------------
// Postgres.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn postgres_listing() {
    let Some(db) = PgDb::new(true).await else {
        return;
    };
    listing(db.store.clone()).await;
    db.drop_schema().await;
}

#[tokio::test]
async fn postgres_declarations() {
    let Some(db) = PgDb::new(true).await else {
        return;
    };
    declarations(db.store.clone()).await;
    db.drop_schema().await;
}

#[tokio::test]
async fn postgres_queue_listing() {
    let Some(db) = PgDb::new(true).await else {
        return;
    };
    queue_listing(db.store.clone()).await;
    db.drop_schema().await;
}

#[tokio::test]
async fn postgres_probes_and_docs() {
    let Some(db) = PgDb::new(true).await else {
        return;
    };
    probes_and_docs(db.store.clone()).await;
    db.drop_schema().await;
}

#[tokio::test]
async fn postgres_unmigrated_schema_is_not_ready() {
    let Some(db) = PgDb::new(false).await else {
        return;
    };
    let app = App::over(&db.store).await;
    assert_eq!(
        app.get("/healthz").await,
        (200, json!({ "status": "pass" }))
    );
    let (status, body) = app.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["output"].as_str().unwrap().contains("migrate"),
        "{body}"
    );
    assert_eq!(
        body["checks"]["store:schema"][0]["status"], "fail",
        "{body}"
    );
    app.shut_down().await;
    db.drop_schema().await;
}

/// A Postgres nobody listens on: the listing answers 503 `unavailable` with a generic message,
/// readiness fails, liveness still passes. Needs no running Postgres.
#[tokio::test]
async fn unreachable_postgres_is_unavailable_but_live() {
    let closed_port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let settings = PgSettings {
        acquire_timeout: Duration::from_millis(500),
        ..PgSettings::new(format!("postgres://postgres@127.0.0.1:{closed_port}/test"))
    };
    let pg = PgStore::connect(&settings, wharf_projections::pg_inline()).unwrap();
    let app = App::over(&Store::Postgres(pg)).await;

    assert_eq!(
        app.get("/healthz").await,
        (200, json!({ "status": "pass" }))
    );
    let (status, body) = app.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "fail");

    for path in [
        "/api/v1/topics",
        "/api/v1/groups",
        "/api/v1/groups/billing",
        "/api/v1/groups/billing/declarations",
        "/api/v1/groups/billing/dead-letters",
    ] {
        let (status, body) = app.get(path).await;
        assert_eq!(status, 503, "GET {path}: {body}");
        assert_eq!(body["error"]["code"], "unavailable", "GET {path}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            !message.contains(&closed_port.to_string()),
            "detail leaked: {message}"
        );
    }
    app.shut_down().await;
}

// ---------------------------------------------------------------------------------------------
// Managed MQTT sessions
// ---------------------------------------------------------------------------------------------

/// A runtime report as a session source would give it.
fn live_session(name: &str, session_id: &str, level: &str) -> wharf_api::LiveSession {
    wharf_api::LiveSession {
        name: name.into(),
        session_id: session_id.into(),
        identity: "mqtt://127.0.0.1:1883 client=c mode=persistent".into(),
        level: level.into(),
        ready: level == "full",
        reason: (level != "full").then(|| "the managed-filter history is unknown".into()),
        generation: None,
        pending_stale: Vec::new(),
        last_reconcile: None,
        ingested: 0,
        held: 0,
        dropped_unmatched: 0,
        lease: None,
    }
}

/// Acquires a session's HA lease for `holder` through the locked executor, as an exclusive
/// runtime does.
async fn acquire_lease(store: &Store, session_id: &str, holder: &str) {
    use wharf_domain::lease::{Lease, LeaseCommand, LeaseEvent, LeaseHolder, LEASE_AGGREGATE};
    let holder = LeaseHolder::parse("holder", holder).unwrap();
    let lock = wharf_store::SessionLock {
        stream_type: LEASE_AGGREGATE,
        lock_type: wharf_domain::session::MANAGED_SESSION_AGGREGATE,
        session_id: session_id.into(),
        after_sequence: 0,
        fence: None,
    };
    store
        .execute(lock, move |snapshot| {
            let events: Vec<LeaseEvent> = snapshot
                .events
                .iter()
                .map(|e| LeaseEvent::decode(&e.event_type, e.payload.get()).unwrap())
                .collect();
            let command = LeaseCommand::Acquire {
                holder,
                ttl: std::time::Duration::from_secs(45),
                now: snapshot.now,
            };
            let new = Lease::fold(&events).decide(&command).unwrap();
            let new = new
                .iter()
                .map(|e| NewEvent::from_domain(e, json!({})).unwrap())
                .collect();
            Ok::<_, std::convert::Infallible>((wharf_store::Write::events(new), ()))
        })
        .await
        .unwrap()
        .unwrap();
}

/// Seeds a session's baseline through the locked executor, as `wharf sessions seed` does.
async fn seed_session(store: &Store, session_id: &str, filters: &[&str]) {
    use wharf_domain::session::{
        ExactFilter, ManagedFilterEvent, ManagedSession, ManagedSessionCommand,
        MANAGED_SESSION_AGGREGATE,
    };
    let filters: Vec<ExactFilter> = filters
        .iter()
        .map(|f| ExactFilter::parse(f).unwrap())
        .collect();
    let lock = wharf_store::StreamLock {
        aggregate_type: MANAGED_SESSION_AGGREGATE,
        aggregate_id: session_id.into(),
        after_sequence: 0,
    };
    store
        .execute(lock, move |snapshot| {
            let events: Vec<ManagedFilterEvent> = snapshot
                .events
                .iter()
                .map(|e| ManagedFilterEvent::decode(&e.event_type, e.payload.get()).unwrap())
                .collect();
            let command = ManagedSessionCommand::Seed {
                filters,
                source: "test".into(),
            };
            let new = ManagedSession::fold(&events).decide(&command).unwrap();
            let new = new
                .iter()
                .map(|e| NewEvent::from_domain(e, json!({})).unwrap())
                .collect();
            Ok::<_, std::convert::Infallible>((wharf_store::Write::events(new), ()))
        })
        .await
        .unwrap()
        .unwrap();
}

async fn sessions(store: Store) {
    seed_session(
        &store,
        "ms-00000000000000000000000000000001",
        &["a/#", "$share/g/b/+"],
    )
    .await;
    seed_session(&store, "ms-00000000000000000000000000000002", &[]).await;
    let read_model = ReadModel::new(store.clone(), TTL);
    let levels = std::sync::Arc::new(std::sync::Mutex::new("starting"));
    let reported = levels.clone();
    let state = ApiState::new(read_model).with_sessions(move || {
        let level = *reported.lock().unwrap();
        vec![live_session(
            "plant",
            "ms-00000000000000000000000000000001",
            level,
        )]
    });
    let app = App::start(state).await;

    let (status, body) = app.get("/api/v1/sessions").await;
    assert_eq!(status, 200, "{body}");
    let listed = body["sessions"].as_array().unwrap();
    assert_eq!(
        listed.len(),
        2,
        "the running session, then the recorded one: {body}"
    );
    assert_eq!(listed[0]["live"]["name"], "plant");
    assert_eq!(listed[0]["live"]["level"], "starting");
    let filters: Vec<&str> = listed[0]["history"]["filters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["filter"].as_str().unwrap())
        .collect();
    assert_eq!(filters, ["$share/g/b/+", "a/#"]);
    assert!(listed[1]["live"].is_null());
    assert_eq!(
        listed[1]["history"]["filters"],
        json!([]),
        "an explicit empty baseline"
    );

    assert!(listed[0]["lease"].is_null(), "never acquired: {body}");
    assert!(listed[0]["live"]["lease"].is_null());

    let (status, one) = app.get("/api/v1/sessions/plant").await;
    assert_eq!(status, 200);
    assert_eq!(one["session_id"], "ms-00000000000000000000000000000001");

    // The audit of both streams, paged by ledger position.
    acquire_lease(&store, "ms-00000000000000000000000000000001", "host-a:1:s1").await;
    let (status, page) = app.get("/api/v1/sessions/plant/events").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["stream"], "filters");
    assert_eq!(page["events"][0]["event"], "BaselineSeeded");
    assert_eq!(page["events"].as_array().unwrap().len(), 1);
    assert!(page["next_after"].is_null());
    let (status, lease) = app
        .get("/api/v1/sessions/ms-00000000000000000000000000000001/events?stream=lease&limit=1")
        .await;
    assert_eq!(status, 200, "{lease}");
    assert_eq!(lease["events"][0]["event"], "LeaseAcquired");
    assert_eq!(lease["events"][0]["detail"]["holder"], "host-a:1:s1");
    assert_eq!(lease["next_after"], lease["events"][0]["position"]);
    let (status, rest) = app
        .get(&format!(
            "/api/v1/sessions/plant/events?stream=lease&after={}",
            lease["next_after"]
        ))
        .await;
    assert_eq!(status, 200);
    assert_eq!(rest["events"], json!([]));
    let (status, bad) = app.get("/api/v1/sessions/plant/events?stream=bogus").await;
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["error"]["field"], "stream");
    assert!(
        bad["error"]["message"].as_str().unwrap().contains("bogus"),
        "{bad}"
    );
    let (status, _) = app.get("/api/v1/sessions/nope/events").await;
    assert_eq!(status, 404);
    let (_, listed) = app.get("/api/v1/sessions").await;
    assert_eq!(listed["sessions"][0]["lease"]["holder"], "host-a:1:s1");
    assert_eq!(listed["sessions"][0]["lease"]["token"], 1);
    let (status, missing) = app.get("/api/v1/sessions/nope").await;
    assert_eq!(status, 404, "{missing}");
    assert_eq!(missing["error"]["code"], "not_found");

    // Readiness waits for every session to be full, naming the one that is not.
    let (status, ready) = app.get("/readyz").await;
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["checks"]["mqtt:sessions"][0]["status"], "fail");
    assert!(
        ready["output"]
            .as_str()
            .unwrap()
            .contains("plant is starting"),
        "{ready}"
    );
    *levels.lock().unwrap() = "full";
    let (status, ready) = app.get("/readyz").await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["checks"]["mqtt:sessions"][0]["status"], "pass");
    app.shut_down().await;
}

#[tokio::test]
async fn sqlite_sessions() {
    let dir = tempfile::tempdir().unwrap();
    sessions(sqlite_store(&dir, "wharf.db", true).await).await;
}

#[tokio::test]
async fn pg_sessions() {
    let Some(db) = PgDb::new(true).await else {
        return;
    };
    sessions(db.store.clone()).await;
    db.drop_schema().await;
}
