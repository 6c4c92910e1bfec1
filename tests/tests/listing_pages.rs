//! The paged group listing over HTTP, on real stores (ADR 0024):
//!
//! - a walk of `GET /api/v1/groups` with a small `limit` lists every group that existed
//!   throughout it exactly once, and never one twice, while other groups are being created;
//!   the `topic` and `waiting` filters page the same way;
//! - a cursor handed out by one server is answered by a fresh server over a reopened store;
//! - `GET /api/v1/groups/{group}` pages its waiters and its instances, each by its own cursor,
//!   and carries every field of each as stored (on Postgres they come back as rows of their
//!   own, ADR 0065); a group never declared is a 404;
//! - a bad cursor, limit or filter is a 400 naming the field.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::oneshot;
use wharf::domain::DeclarerId;
use wharf::projections::ReadModel;
use wharf::store::Store;
use wharf::{Consumer, ConsumerState, Registration, Wharf};
use wharf_api::ApiState;
use wharf_tests::{on_both_backends, Backend, TestStore};

/// Every response these tests receive is held to the generated OpenAPI document (ADR 0033).
#[path = "../../api/tests/support/contract.rs"]
#[allow(dead_code)]
mod contract;

const DEADLINE: Duration = Duration::from_secs(20);

/// The API served on a loopback port until dropped.
struct Server {
    base: String,
    client: reqwest::Client,
    _stop: oneshot::Sender<()>,
}

impl Server {
    async fn start(store: Store) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let state = ApiState::new(ReadModel::new(store, Duration::from_secs(60)));
        tokio::spawn(wharf_api::serve(listener, state, async move {
            let _ = stopped.await;
        }));
        Self {
            base,
            client: reqwest::Client::new(),
            _stop: stop,
        }
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let content_type = content_type(&response);
        let text = response.text().await.unwrap();
        contract::assert_conforms("GET", path, status, &content_type, &text);
        (status, serde_json::from_str(&text).unwrap())
    }

    async fn ok(&self, path: &str) -> Value {
        let (status, body) = self.get(path).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// Walks the listing from the start with `query` (`limit=...&...`); returns the group names
    /// in the order listed and the number of pages.
    async fn walk(&self, query: &str) -> (Vec<String>, usize) {
        let mut names = Vec::new();
        let mut pages = 0;
        let mut after: Option<String> = None;
        loop {
            let path = match &after {
                Some(cursor) => format!("/api/v1/groups?{query}&after={cursor}"),
                None => format!("/api/v1/groups?{query}"),
            };
            let page = self.ok(&path).await;
            pages += 1;
            names.extend(
                page["groups"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|g| g["group"].as_str().unwrap().to_owned()),
            );
            match page["next_after"].as_str() {
                Some(cursor) => after = Some(cursor.to_owned()),
                None => return (names, pages),
            }
            assert!(pages < 1_000, "the walk does not end");
        }
    }

    async fn expect_invalid(&self, path: &str, field: &str) {
        let (status, body) = self.get(path).await;
        assert_eq!(status, 400, "GET {path}: {body}");
        assert_eq!(body["error"]["code"], "invalid_parameter", "{body}");
        assert_eq!(body["error"]["field"], field, "GET {path}: {body}");
    }
}

async fn declare(wharf: &Wharf, group: &str, topic: &str, patterns: &[&str]) {
    let registration = Registration::new(group, topic, "1", patterns).unwrap();
    wharf.register(&registration).await.unwrap();
}

fn assert_each_once(names: &[String]) -> BTreeSet<String> {
    let set: BTreeSet<String> = names.iter().cloned().collect();
    assert_eq!(
        set.len(),
        names.len(),
        "a group was listed twice: {names:?}"
    );
    set
}

async fn pages_list_every_group_once_while_groups_are_created(backend: Backend) {
    let test = TestStore::new(backend).await;
    let wharf = test.wharf();
    // Even numbers exist before the walk; odd ones are created during it, between them.
    let early: BTreeSet<String> = (0..40).step_by(2).map(|i| format!("g-{i:03}")).collect();
    for name in &early {
        declare(&wharf, name, "orders", &["orders/#"]).await;
    }
    let server = Server::start(test.store.clone()).await;
    let creator = tokio::spawn({
        let wharf = wharf.clone();
        async move {
            for i in (1..40).step_by(2) {
                declare(&wharf, &format!("g-{i:03}"), "orders", &["orders/#"]).await;
            }
        }
    });
    let (listed, pages) = server.walk("limit=3").await;
    creator.await.unwrap();
    let listed_set = assert_each_once(&listed);
    assert!(pages >= early.len() / 3, "{pages} pages");
    assert!(
        early.is_subset(&listed_set),
        "missing: {:?}",
        early.difference(&listed_set).collect::<Vec<_>>()
    );

    // Once creation is over, a walk lists all 40, each once, in name order.
    let (listed, _) = server.walk("limit=7").await;
    assert_each_once(&listed);
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(listed, sorted);
    assert_eq!(listed.len(), 40);

    // Filters page the same way: by topic, and groups with an open waiter.
    declare(&wharf, "p-1", "parcels", &[]).await;
    declare(&wharf, "p-2", "parcels", &[]).await;
    let (parcels, pages) = server.walk("limit=1&topic=parcels").await;
    assert_eq!(parcels, ["p-1", "p-2"]);
    assert_eq!(pages, 2, "the last page names no cursor");
    let (none, _) = server.walk("waiting=true").await;
    assert!(none.is_empty(), "{none:?}");
    let _incumbent = live_consumer(&wharf, "g-007", "orders", &["orders/#"]).await;
    let _other = live_consumer(&wharf, "g-031", "orders", &["orders/#"]).await;
    for group in ["g-007", "g-031"] {
        let waiter = wharf.as_declarer(DeclarerId::parse("d", "waiter:1").unwrap());
        declare(&waiter, group, "orders", &["orders/eu/#"]).await;
    }
    let (waiting, _) = server.walk("limit=1&waiting=true").await;
    assert_eq!(waiting, ["g-007", "g-031"]);
    let (waiting_parcels, _) = server.walk("waiting=true&topic=parcels").await;
    assert!(waiting_parcels.is_empty());
}

on_both_backends!(
    pages_list_every_group_once_while_groups_are_created,
    pages_list_every_group_once_while_groups_are_created
);

/// Starts a consumer and waits until it consumes (it is then a live declarer).
async fn live_consumer(wharf: &Wharf, group: &str, topic: &str, patterns: &[&str]) -> Consumer {
    let consumer = wharf.consume(Registration::new(group, topic, "1", patterns).unwrap());
    let mut watch = consumer.watch();
    tokio::time::timeout(
        DEADLINE,
        watch.wait_for(|s| matches!(s, ConsumerState::Consuming { .. })),
    )
    .await
    .unwrap_or_else(|_| panic!("{group}: stuck in {:?}", consumer.state()))
    .unwrap();
    consumer
}

async fn a_cursor_survives_a_restart(backend: Backend) {
    let test = TestStore::new(backend).await;
    let wharf = test.wharf();
    for i in 0..7 {
        declare(&wharf, &format!("r-{i}"), "orders", &[]).await;
    }
    let first = Server::start(test.store.clone()).await;
    let page = first.ok("/api/v1/groups?limit=3").await;
    let cursor = page["next_after"].as_str().unwrap().to_owned();
    drop(first);

    // A new server over a newly opened store (a restarted process) answers the cursor.
    let reopened = wharf::open_existing_store(&test.config().store)
        .await
        .unwrap();
    let second = Server::start(reopened).await;
    let page = second
        .ok(&format!("/api/v1/groups?limit=3&after={cursor}"))
        .await;
    let names: Vec<&str> = page["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["r-3", "r-4", "r-5"]);
    let last = second
        .ok(&format!(
            "/api/v1/groups?limit=3&after={}",
            page["next_after"].as_str().unwrap()
        ))
        .await;
    assert_eq!(last["groups"].as_array().unwrap().len(), 1);
    assert_eq!(last["next_after"], Value::Null);
}

on_both_backends!(a_cursor_survives_a_restart, a_cursor_survives_a_restart);

/// Follows `field`'s cursor through the group's pages of `list`; the declarers in order.
async fn member_walk(server: &Server, group: &str, list: &str, limit: usize) -> Vec<String> {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/groups/{group}?limit={limit}&{list}_after={c}"),
            None => format!("/api/v1/groups/{group}?limit={limit}"),
        };
        let body = server.ok(&path).await;
        let items = body[list].as_array().unwrap();
        assert!(items.len() <= limit, "{body}");
        seen.extend(
            items
                .iter()
                .map(|i| i["declarer"].as_str().unwrap().to_owned()),
        );
        match body[format!("{list}_next_after")].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return seen,
        }
    }
}

async fn a_group_pages_its_waiters_and_instances(backend: Backend) {
    let test = TestStore::new(backend).await;
    let wharf = test.steady_wharf();
    let _consumers = [
        live_consumer(&wharf, "busy", "orders", &["orders/#"]).await,
        live_consumer(&wharf, "busy", "orders", &["orders/#"]).await,
        live_consumer(&wharf, "busy", "orders", &["orders/#"]).await,
    ];
    let waiters: Vec<String> = (0..5).map(|i| format!("waiter:{i}")).collect();
    for who in &waiters {
        let other = wharf.as_declarer(DeclarerId::parse("d", who).unwrap());
        declare(&other, "busy", "orders", &["orders/eu/#"]).await;
    }
    let server = Server::start(test.store.clone()).await;

    let listed = member_walk(&server, "busy", "waiters", 2).await;
    assert_eq!(
        listed, waiters,
        "every waiter once, by when it first waited"
    );
    let instances = member_walk(&server, "busy", "instances", 2).await;
    assert_each_once(&instances);
    assert_eq!(instances.len(), 3, "{instances:?}");

    // The listing carries a summary: the counts and the oldest waiter, not the lists.
    let page = server.ok("/api/v1/groups").await;
    let busy = &page["groups"][0];
    assert_eq!(
        busy["waiters"],
        json!({ "count": 5, "more": false }),
        "{busy}"
    );
    assert_eq!(busy["instances"], 3, "{busy}");
    assert_eq!(busy["live_instances"], 3, "{busy}");
    assert_eq!(
        busy["oldest_waiter"]["declarer"],
        waiters[0].as_str(),
        "{busy}"
    );
    assert!(busy.get("waiters_next_after").is_none(), "{busy}");
}

on_both_backends!(
    a_group_pages_its_waiters_and_instances,
    a_group_pages_its_waiters_and_instances
);

/// Each member's fields come back as stored: several patterns, the incumbent, versions and
/// times, each list beside the group's own row; a group never declared is a 404 even when
/// another has members.
async fn a_group_read_carries_each_members_fields(backend: Backend) {
    let test = TestStore::new(backend).await;
    let wharf = test.steady_wharf();
    let _consumer = live_consumer(&wharf, "fields", "orders", &["orders/#"]).await;
    let waiter = wharf.as_declarer(DeclarerId::parse("d", "waiter:a").unwrap());
    let asked =
        Registration::new("fields", "orders", "2.5.0", &["orders/us/#", "orders/eu/#"]).unwrap();
    waiter.register(&asked).await.unwrap();
    let server = Server::start(test.store.clone()).await;

    let view = server.ok("/api/v1/groups/fields").await;
    assert_eq!(view["group"], "fields", "{view}");
    assert_eq!(view["topic"], "orders", "{view}");
    let effective = &view["effective"];
    assert_eq!(effective["patterns"], json!(["orders/#"]), "{view}");
    assert_eq!(effective["version"], "1", "{view}");
    assert_eq!(effective["previous"], Value::Null, "{view}");
    assert_eq!(effective["installs"], 1, "{view}");
    let summary = server.ok("/api/v1/groups").await;
    assert_eq!(&summary["groups"][0]["effective"], effective, "{summary}");

    let waiters = view["waiters"].as_array().unwrap();
    assert_eq!(waiters.len(), 1, "{view}");
    let w = &waiters[0];
    assert_eq!(w["declarer"], "waiter:a", "{w}");
    assert_eq!(w["version"], "2.5.0", "{w}");
    let mut asked_set = vec!["orders/eu/#", "orders/us/#"];
    let mut got: Vec<&str> = w["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    got.sort_unstable();
    asked_set.sort_unstable();
    assert_eq!(got, asked_set, "{w}");
    assert_eq!(w["incumbent"], json!(["orders/#"]), "{w}");
    assert!(
        time(&w["declared_at"]) <= time(&w["last_attempt_at"]),
        "{w}"
    );
    assert_eq!(
        timeless(w),
        timeless(&summary["groups"][0]["oldest_waiter"]),
        "the page's oldest waiter is the group's first"
    );

    let instances = view["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 1, "{view}");
    let i = &instances[0];
    assert_eq!(i["version"], "1", "{i}");
    assert_eq!(i["patterns"], json!(["orders/#"]), "{i}");
    assert_eq!(i["live"], true, "{i}");
    assert!(time(&i["started_at"]) <= time(&i["heartbeat_at"]), "{i}");
    assert_eq!(view["waiters_next_after"], Value::Null, "{view}");
    assert_eq!(view["instances_next_after"], Value::Null, "{view}");

    let (status, body) = server.get("/api/v1/groups/never-declared").await;
    assert_eq!(status, 404, "{body}");
}

fn time(value: &Value) -> chrono::DateTime<chrono::FixedOffset> {
    chrono::DateTime::parse_from_rfc3339(value.as_str().unwrap()).unwrap()
}

on_both_backends!(
    a_group_read_carries_each_members_fields,
    a_group_read_carries_each_members_fields
);

/// A summary counts up to 100 and says when more follow; the group's own read pages them all.
async fn a_summary_counts_up_to_the_cap(backend: Backend) {
    let test = TestStore::new(backend).await;
    let wharf = test.steady_wharf();
    let _consumer = live_consumer(&wharf, "crowd", "orders", &["orders/#"]).await;
    // Zero-padded, so the declarers' order is the order they first waited in.
    let waiters: Vec<String> = (0..101).map(|i| format!("waiter:{i:03}")).collect();
    for who in &waiters {
        let other = wharf.as_declarer(DeclarerId::parse("d", who).unwrap());
        declare(&other, "crowd", "orders", &["orders/eu/#"]).await;
    }
    let server = Server::start(test.store.clone()).await;

    let page = server.ok("/api/v1/groups").await;
    let crowd = &page["groups"][0];
    assert_eq!(crowd["group"], "crowd", "{page}");
    assert_eq!(
        crowd["waiters"],
        json!({ "count": 100, "more": true }),
        "{crowd}"
    );
    assert_eq!(crowd["oldest_waiter"]["declarer"], "waiter:000", "{crowd}");
    assert_eq!(crowd["instances"], 1, "{crowd}");
    assert_eq!(crowd["live_instances"], 1, "{crowd}");
    // The pages of waiting groups count and window the waiters in the walk that admits the
    // group (ADR 0061): the same summary as the plain page's.
    for filter in ["waiting=true", "waiting=true&topic=orders"] {
        let page = server.ok(&format!("/api/v1/groups?{filter}")).await;
        let listed = &page["groups"][0];
        assert_eq!(listed["group"], "crowd", "{filter}: {page}");
        for field in [
            "effective",
            "waiters",
            "oldest_waiter",
            "instances",
            "live_instances",
        ] {
            assert_eq!(
                timeless(&listed[field]),
                timeless(&crowd[field]),
                "{filter}: {field} of {listed}"
            );
        }
    }

    let listed = member_walk(&server, "crowd", "waiters", 100).await;
    assert_eq!(listed, waiters, "the group's read pages every waiter");
}

/// `value` without the ages a read computes from its own clock.
fn timeless(value: &Value) -> Value {
    let mut value = value.clone();
    if let Some(fields) = value.as_object_mut() {
        fields.remove("silent_seconds");
        fields.remove("waiting_seconds");
    }
    value
}

on_both_backends!(
    a_summary_counts_up_to_the_cap,
    a_summary_counts_up_to_the_cap
);

async fn bad_cursors_limits_and_filters_are_400_naming_the_field(backend: Backend) {
    let test = TestStore::new(backend).await;
    declare(&test.wharf(), "g", "orders", &[]).await;
    let server = Server::start(test.store.clone()).await;
    let listing = "/api/v1/groups";
    server
        .expect_invalid(&format!("{listing}?after=g"), "after")
        .await;
    server
        .expect_invalid(&format!("{listing}?after=%E2%9C%93"), "after")
        .await;
    for limit in ["0", "1001", "-1", "ten", ""] {
        server
            .expect_invalid(&format!("{listing}?limit={limit}"), "limit")
            .await;
    }
    server
        .expect_invalid(&format!("{listing}?waiting=yes"), "waiting")
        .await;
    server
        .expect_invalid(&format!("{listing}?topic=a%2Fb"), "topic")
        .await;
    server
        .expect_invalid(&format!("{listing}?page=2"), "page")
        .await;
    // A waiter cursor is not a group cursor, nor an instance cursor.
    let body = server.ok("/api/v1/groups/g?limit=1").await;
    assert_eq!(body["waiters_next_after"], Value::Null);
    let waiter_cursor = wharf::projections::WaiterCursor {
        declared_at_micros: 1,
        declarer: "d".to_owned(),
    }
    .encode();
    server
        .expect_invalid(&format!("{listing}?after={waiter_cursor}"), "after")
        .await;
    server
        .expect_invalid(
            &format!("/api/v1/groups/g?instances_after={waiter_cursor}"),
            "instances_after",
        )
        .await;
    server
        .expect_invalid("/api/v1/groups/g?waiters_after=zz", "waiters_after")
        .await;
    server
        .expect_invalid("/api/v1/groups/g?limit=1001", "limit")
        .await;
}

on_both_backends!(
    bad_cursors_limits_and_filters_are_400_naming_the_field,
    bad_cursors_limits_and_filters_are_400_naming_the_field
);

fn content_type(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}
