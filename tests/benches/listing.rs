//! Benchmark: the listing API's latency over HTTP at 1M events (issue 8, item 5; goals: a page
//! of 100 under 20 ms p99 at 100 and at 10k groups on both backends, `GET
//! /api/v1/groups/{g}` under 10 ms p99 at any ledger size), against the same page read by one
//! plain SQL statement through the same driver, in the same run.
//!
//! Per backend and per fleet size (100 and 10k groups), a fresh store gets a generated ledger
//! of 1M events (`wharf_tests::fleet`: every event what `decide` returns; groups over ten
//! topics, every tenth with two open waiters; three groups with long ledgers of their own, 1k,
//! 10k and 100k events, each event a new declarer's wait, so 1k to 100k open waiters),
//! bulk-loaded, and the projections are built by the library (`ReadModel::rebuild`). State
//! that is not events is inserted directly (`listing/state.rs`): two worker instances per
//! group and 1,000 per long group, and each group's queue rows (its `consumer_group` row,
//! three deliveries). Nothing is analyzed (autovacuum is off on this machine): the store is as
//! a rebuild leaves it. With `WHARF_BENCH_KEEP=1` a Postgres store is kept after its run (its
//! schema is printed) for `EXPLAIN` by hand; drop it when done.
//!
//! The real API (`wharf_api::serve_with` on a loopback port 0) answers each case, its bound
//! on store reads at once (`http.max_concurrent_reads`: on Postgres its own pool, ADR 0067;
//! on SQLite permits, ADR 0059) at its default or `WHARF_BENCH_READS`; each case is `WHARF_BENCH_REQUESTS` requests (default 2,000) over
//! `WHARF_BENCH_CONNECTIONS` keep-alive connections (default 8, like wrk), the body read in
//! full; the baseline is the same read as one statement building the same page as JSON in the
//! database (`listing/baseline.rs`), over as many concurrent tasks. Each case first makes four
//! requests a connection on each side, unmeasured, so that every connection of the pools has
//! opened and planned its calls; then halves interleave (baseline, API, baseline, API); p50
//! and p99 are over all measured requests of a side. Ratio = baseline p99 / API p99.
//!
//! After the cases a second table gives each side's CPU time per request, of this process
//! (API, HTTP client, driver) and of the Postgres server (`listing/cpu.rs`, from `/proc`): at
//! 8 connections on two cores a page waits behind the others, so its p99 follows its CPU.
//! `WHARF_BENCH_SIDES=api` skips the baseline (for a profiler attached to the API's work).
//! With `WHARF_BENCH_EXPLAIN=1` the Postgres runs print `EXPLAIN (ANALYZE, BUFFERS)` of every
//! listing statement at the ledger's size (`listing/plans.rs`); with `WHARF_BENCH_PROFILE=1`
//! every run first times each part of a read alone (`listing/profile.rs`).
//!
//! Run: `cargo bench -p wharf-tests --bench listing` (`WHARF_BENCH_EVENTS=1000000`,
//! `WHARF_BENCH_GROUPS=100,10000`, `WHARF_BENCH_LONG=1000,10000,100000`,
//! `WHARF_BENCH_BACKENDS=sqlite|postgres`; `WHARF_BENCH_CASES=a,b` runs only the cases whose
//! label contains one of them, e.g. `first page,one group`).

#[path = "listing/baseline.rs"]
mod baseline;
#[path = "listing/cpu.rs"]
mod cpu;
#[path = "listing/plans.rs"]
mod plans;
#[path = "listing/profile.rs"]
mod profile;
#[path = "listing/state.rs"]
mod state;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::oneshot;
use wharf::domain::GroupName;
use wharf::projections::{GroupCursor, ReadModel};
use wharf::store::{Progress, RebuildMode, Store};
use wharf_api::ApiState;
use wharf_tests::fleet::{fleet, fleet_ledger, FleetGroup, Shape};
use wharf_tests::ledger::append_bulk;
use wharf_tests::{Backend, TestStore};

use baseline::Read;

/// The allocator `wharf serve` runs on (ADR 0071): this process serves the API as the binary
/// would, so it allocates as the binary does (the HTTP client and the driver too).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use cpu::CpuClock;

fn list(var: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(var)
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn number(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn backends() -> Vec<Backend> {
    match std::env::var("WHARF_BENCH_BACKENDS").as_deref() {
        Ok("sqlite") => vec![Backend::Sqlite],
        Ok("postgres") => vec![Backend::Postgres],
        _ => vec![Backend::Sqlite, Backend::Postgres],
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Latencies of one side of a case, in milliseconds, and the bytes of the last answer.
#[derive(Default)]
struct Side {
    millis: Vec<f64>,
    bytes: usize,
}

impl Side {
    fn absorb(&mut self, other: Side) {
        self.millis.extend(other.millis);
        self.bytes = self.bytes.max(other.bytes);
    }

    /// The `q` quantile of the side's latencies; NaN for a side not run.
    fn quantile(&mut self, q: f64) -> f64 {
        if self.millis.is_empty() {
            return f64::NAN;
        }
        self.millis.sort_by(f64::total_cmp);
        let i = ((self.millis.len() as f64 - 1.0) * q).round() as usize;
        self.millis[i]
    }
}

/// Runs `requests` calls of `call` over `connections` concurrent tasks; adds their latencies.
async fn measure<F, Fut>(side: &mut Side, requests: usize, connections: usize, call: F)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = usize> + Send,
{
    let tasks: Vec<_> = (0..connections)
        .map(|c| {
            let call = call.clone();
            let share = requests / connections + usize::from(c < requests % connections);
            tokio::spawn(async move {
                let mut out = Vec::with_capacity(share);
                let mut bytes = 0;
                for _ in 0..share {
                    let start = Instant::now();
                    bytes = call().await;
                    out.push(start.elapsed().as_secs_f64() * 1e3);
                }
                (out, bytes)
            })
        })
        .collect();
    for task in tasks {
        let (millis, bytes) = task.await.expect("a request task");
        side.millis.extend(millis);
        side.bytes = side.bytes.max(bytes);
    }
}

/// The API on a loopback port until dropped.
struct Server {
    base: String,
    client: reqwest::Client,
    _stop: oneshot::Sender<()>,
}

impl Server {
    async fn start(store: Store, max_concurrent_reads: usize) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let base = format!("http://{}", listener.local_addr().expect("an address"));
        let (stop, stopped) = oneshot::channel::<()>();
        let state = ApiState::new(ReadModel::new(store, Duration::from_secs(60)));
        let limits = wharf_api::HttpLimits {
            max_concurrent_reads,
            ..wharf_api::HttpLimits::default()
        };
        tokio::spawn(wharf_api::serve_with(listener, state, limits, async move {
            let _ = stopped.await;
        }));
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .expect("a client");
        Self {
            base,
            client,
            _stop: stop,
        }
    }

    /// GETs `path`, expecting 200; returns the body's length.
    async fn bytes(client: &reqwest::Client, url: &str) -> usize {
        let response = client.get(url).send().await.expect("a response");
        let status = response.status();
        let body = response.bytes().await.expect("a body");
        assert!(status.is_success(), "GET {url}: {status} {body:?}");
        body.len()
    }

    async fn json(&self, path: &str) -> Value {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("a response");
        assert!(response.status().is_success(), "GET {path}");
        response.json().await.expect("JSON")
    }
}

/// One case: what the API is asked and the baseline's equivalent read.
struct Case {
    label: String,
    path: String,
    read: Read,
    /// The goal on the API's p99, in milliseconds.
    goal: f64,
    /// Checks the first answer (page sizes), so a case measures what it says.
    expect: Box<dyn Fn(&Value)>,
}

fn groups_len(n: usize) -> Box<dyn Fn(&Value)> {
    Box::new(move |v: &Value| assert_eq!(v["groups"].as_array().map(Vec::len), Some(n), "{v:.200}"))
}

fn waiters_len(n: usize) -> Box<dyn Fn(&Value)> {
    Box::new(move |v: &Value| assert_eq!(v["waiters"].as_array().map(Vec::len), Some(n), "waiters"))
}

fn entries_len(n: usize) -> Box<dyn Fn(&Value)> {
    Box::new(move |v: &Value| assert_eq!(v["entries"].as_array().map(Vec::len), Some(n), "entries"))
}

fn cursor(name: &str) -> String {
    GroupCursor(GroupName::parse("group", name).expect("a name")).encode()
}

/// Walks the listing's whole cursor chain once: every group exactly once.
async fn walk(server: &Server, groups: &[FleetGroup]) -> (usize, f64) {
    let start = Instant::now();
    let (mut seen, mut pages, mut after) = (Vec::new(), 0, None::<String>);
    loop {
        let path = match &after {
            Some(c) => format!("/api/v1/groups?limit=100&after={c}"),
            None => "/api/v1/groups?limit=100".to_owned(),
        };
        let page = server.json(&path).await;
        pages += 1;
        for g in page["groups"].as_array().expect("groups") {
            seen.push(g["group"].as_str().expect("a name").to_owned());
        }
        match page["next_after"].as_str() {
            Some(c) => after = Some(c.to_owned()),
            None => break,
        }
    }
    let mut names: Vec<String> = groups.iter().map(|g| g.name.clone()).collect();
    names.sort();
    assert_eq!(seen, names, "the walk lists every group once, in order");
    (pages, start.elapsed().as_secs_f64())
}

/// The cursor of the waiter page that starts at about the middle of `group`'s waiters.
async fn middle_waiters(server: &Server, group: &FleetGroup) -> (String, (i64, String)) {
    let half = (group.events - 1) / 2;
    let mut after: Option<String> = None;
    let mut last = None;
    let mut passed = 0;
    while passed < half {
        let limit = (half - passed).min(1_000);
        let path = match &after {
            Some(c) => format!(
                "/api/v1/groups/{}?limit={limit}&waiters_after={c}",
                group.name
            ),
            None => format!("/api/v1/groups/{}?limit={limit}", group.name),
        };
        let view = server.json(&path).await;
        let waiters = view["waiters"].as_array().expect("waiters");
        passed += waiters.len();
        let w = waiters.last().expect("a waiter");
        let at = chrono::DateTime::parse_from_rfc3339(w["declared_at"].as_str().expect("a time"))
            .expect("a time")
            .timestamp_micros();
        last = Some((at, w["declarer"].as_str().expect("a declarer").to_owned()));
        after = view["waiters_next_after"].as_str().map(str::to_owned);
    }
    (after.expect("more waiters"), last.expect("a waiter"))
}

async fn cases(server: &Server, store: &Store, groups: &[FleetGroup]) -> Vec<Case> {
    const PAGE_GOAL: f64 = 20.0;
    const GROUP_GOAL: f64 = 10.0;
    let mut names: Vec<&FleetGroup> = groups.iter().collect();
    names.sort_by(|a, b| a.name.cmp(&b.name));
    let fleet_only: Vec<&&FleetGroup> = names.iter().filter(|g| g.shape != Shape::Long).collect();
    let middle = fleet_only[fleet_only.len() / 2].name.clone();
    let after_middle = |filter: &dyn Fn(&FleetGroup) -> bool| {
        names
            .iter()
            .filter(|g| g.name > middle && filter(g))
            .count()
            .min(100)
    };
    let topic_count = |after: &str| {
        names
            .iter()
            .filter(|g| g.name.as_str() > after && g.topic == "orders-3")
            .count()
            .min(100)
    };
    let has_waiter = |g: &FleetGroup| g.shape != Shape::Swapped;
    let mut out = vec![
        Case {
            label: "groups, first page".into(),
            path: "/api/v1/groups?limit=100".into(),
            read: Read::default(),
            goal: PAGE_GOAL,
            expect: groups_len(names.len().min(100)),
        },
        Case {
            label: "groups, page after the middle group".into(),
            path: format!("/api/v1/groups?limit=100&after={}", cursor(&middle)),
            read: Read {
                after: middle.clone(),
                ..Read::default()
            },
            goal: PAGE_GOAL,
            expect: groups_len(after_middle(&|_| true)),
        },
        Case {
            label: "topic filter, first page".into(),
            path: "/api/v1/groups?limit=100&topic=orders-3".into(),
            read: Read {
                topic: Some("orders-3".into()),
                ..Read::default()
            },
            goal: PAGE_GOAL,
            expect: groups_len(topic_count("")),
        },
        Case {
            label: "topic filter, after the middle".into(),
            path: format!(
                "/api/v1/groups?limit=100&topic=orders-3&after={}",
                cursor(&middle)
            ),
            read: Read {
                after: middle.clone(),
                topic: Some("orders-3".into()),
                ..Read::default()
            },
            goal: PAGE_GOAL,
            expect: groups_len(topic_count(&middle)),
        },
        Case {
            label: "waiting filter, first page".into(),
            path: "/api/v1/groups?limit=100&waiting=true".into(),
            read: Read {
                waiting: true,
                ..Read::default()
            },
            goal: PAGE_GOAL,
            expect: groups_len(names.iter().filter(|g| has_waiter(g)).count().min(100)),
        },
        Case {
            label: "waiting filter, after the middle".into(),
            path: format!(
                "/api/v1/groups?limit=100&waiting=true&after={}",
                cursor(&middle)
            ),
            read: Read {
                after: middle.clone(),
                waiting: true,
                ..Read::default()
            },
            goal: PAGE_GOAL,
            expect: groups_len(after_middle(&has_waiter)),
        },
    ];
    let fleet_group = fleet_only
        .iter()
        .find(|g| g.shape == Shape::StillWaiting)
        .expect("a waiting fleet group");
    let mut one_groups: Vec<&FleetGroup> = vec![fleet_group];
    one_groups.extend(names.iter().filter(|g| g.shape == Shape::Long));
    for g in &one_groups {
        let waiters = if g.shape == Shape::Long {
            (g.events - 1).min(100)
        } else {
            2
        };
        out.push(Case {
            label: format!("one group {} ({} events)", g.name, g.events),
            path: format!("/api/v1/groups/{}", g.name),
            read: Read {
                group: Some(g.name.clone()),
                ..Read::default()
            },
            goal: GROUP_GOAL,
            expect: waiters_len(waiters),
        });
    }
    if let Some(longest) = names
        .iter()
        .filter(|g| g.shape == Shape::Long && g.events > 201)
        .max_by_key(|g| g.events)
    {
        let (cursor, key) = middle_waiters(server, longest).await;
        out.push(Case {
            label: format!("{}: waiters after the middle", longest.name),
            path: format!("/api/v1/groups/{}?waiters_after={cursor}", longest.name),
            read: Read {
                group: Some(longest.name.clone()),
                waiters_after: Some(key),
                ..Read::default()
            },
            goal: GROUP_GOAL,
            expect: waiters_len(100),
        });
        let first = server
            .json(&format!("/api/v1/groups/{}", longest.name))
            .await;
        let instances = first["instances_next_after"]
            .as_str()
            .expect("more instances");
        let last = first["instances"][99]["declarer"]
            .as_str()
            .expect("an instance");
        out.push(Case {
            label: format!("{}: second page of instances", longest.name),
            path: format!(
                "/api/v1/groups/{}?instances_after={instances}",
                longest.name
            ),
            read: Read {
                group: Some(longest.name.clone()),
                instances_after: last.to_owned(),
                ..Read::default()
            },
            goal: GROUP_GOAL,
            expect: Box::new(|v: &Value| {
                assert_eq!(v["instances"].as_array().map(Vec::len), Some(100))
            }),
        });
    }
    for g in &one_groups {
        let middle_position = middle_position(store, &g.name, g.events).await;
        for (label, after) in [("first page", 0), ("after the middle", middle_position)] {
            let left = if after == 0 {
                g.events
            } else {
                g.events - g.events / 2
            };
            out.push(Case {
                label: format!("declarations of {}, {label}", g.name),
                path: format!(
                    "/api/v1/groups/{}/declarations?limit=100&after={after}",
                    g.name
                ),
                read: Read {
                    group: Some(g.name.clone()),
                    history_after: Some(after),
                    ..Read::default()
                },
                goal: PAGE_GOAL,
                expect: entries_len(left.min(100)),
            });
        }
    }
    out
}

/// The position of `group`'s event at half its sequence.
async fn middle_position(store: &Store, group: &str, events: usize) -> i64 {
    let sequence = (events / 2).max(1) as i64;
    match store {
        Store::Postgres(s) => sqlx::query_scalar(
            "SELECT position FROM events WHERE aggregate_type = 'consumer_group' \
             AND aggregate_id = $1 AND sequence = $2",
        )
        .bind(group)
        .bind(sequence)
        .fetch_one(s.pool())
        .await
        .expect("a position"),
        Store::Sqlite(s) => {
            let group = group.to_owned();
            s.read(move |conn| {
                Ok(conn.query_row(
                    "SELECT position FROM events WHERE aggregate_type = 'consumer_group' \
                     AND aggregate_id = ?1 AND sequence = ?2",
                    rusqlite::params![group, sequence],
                    |r| r.get(0),
                )?)
            })
            .await
            .expect("a position")
        }
    }
}

/// Requests per connection each side makes, unmeasured, before a case's measured halves.
const WARM_UP_PER_CONNECTION: usize = 4;

/// Runs one case, prints its row and returns its row of CPU time per request.
async fn run_case(
    server: &Server,
    store: &Store,
    case: &Case,
    requests: usize,
    conns: usize,
) -> String {
    // `WHARF_BENCH_SIDES=api` times the API alone (the SQL columns then read NaN): for a
    // profiler attached to the run, which should see only the API's work.
    let api_only = std::env::var("WHARF_BENCH_SIDES").is_ok_and(|v| v == "api");
    (case.expect)(&server.json(&case.path).await);
    let url = Arc::new(format!("{}{}", server.base, case.path));
    let (mut api, mut sql) = (Side::default(), Side::default());
    let (mut api_cpu, mut sql_cpu) = (CpuClock::default(), CpuClock::default());
    // Round 0 warms both sides and is dropped: every connection of the client, of the API's
    // pool and of the baseline's has opened, prepared its statements and planned its calls,
    // so the first case no longer pays for the pool's growth (about 11 ms on a connection's
    // first page) and every case measures connections as a service holds them.
    for round in 0..3 {
        let (share, keep) = match round {
            0 => (WARM_UP_PER_CONNECTION * conns, false),
            _ => (requests / 2, true),
        };
        let (mut sql_round, mut api_round) = (Side::default(), Side::default());
        let (store, read) = (store.clone(), Arc::new(case.read.clone()));
        let started = CpuClock::read();
        if !api_only {
            measure(&mut sql_round, share, conns, move || {
                let (store, read) = (store.clone(), read.clone());
                async move { baseline::run(&store, &read).await }
            })
            .await;
        }
        let between = CpuClock::read();
        let (client, url) = (server.client.clone(), url.clone());
        measure(&mut api_round, share, conns, move || {
            let (client, url) = (client.clone(), url.clone());
            async move { Server::bytes(&client, &url).await }
        })
        .await;
        if keep {
            sql.absorb(sql_round);
            api.absorb(api_round);
            if let (Some(started), Some(between), Some(ended)) =
                (started, between, CpuClock::read())
            {
                sql_cpu.add(between.since(started));
                api_cpu.add(ended.since(between));
            }
        }
    }
    let (a50, a99, s50, s99) = (
        api.quantile(0.5),
        api.quantile(0.99),
        sql.quantile(0.5),
        sql.quantile(0.99),
    );
    let status = if a99 < case.goal { "met" } else { "NOT met" };
    println!(
        "| {} | {a50:.2} | {a99:.2} | {s50:.2} | {s99:.2} | {:.2} | {} / {} | < {} ms: {status} |",
        case.label,
        s99 / a99,
        api.bytes,
        sql.bytes,
        case.goal
    );
    let measured = api.millis.len();
    let (api_own, api_server) = api_cpu.per_request(measured);
    let (sql_own, sql_server) = sql_cpu.per_request(measured);
    format!(
        "| {} | {api_own:.2} | {api_server:.2} | {:.2} | {sql_own:.2} | {sql_server:.2} | {:.2} |",
        case.label,
        api_own + api_server,
        sql_own + sql_server
    )
}

async fn rebuild(test: &TestStore) -> f64 {
    let quiet: Progress = Arc::new(|_, _| {});
    let start = Instant::now();
    let report = test
        .wharf()
        .read_model()
        .rebuild(RebuildMode::Apply, quiet)
        .await
        .expect("rebuild");
    assert!(report.is_clean(), "{:?}", report.differences);
    start.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let events = number("WHARF_BENCH_EVENTS", 1_000_000);
    let requests = number("WHARF_BENCH_REQUESTS", 2_000);
    let conns = number("WHARF_BENCH_CONNECTIONS", 8);
    let reads = number(
        "WHARF_BENCH_READS",
        wharf_api::default_max_concurrent_reads(),
    );
    let long = list("WHARF_BENCH_LONG", &[1_000, 10_000, 100_000]);
    let explain = std::env::var("WHARF_BENCH_EXPLAIN").is_ok_and(|v| v == "1");
    let profiling = std::env::var("WHARF_BENCH_PROFILE").is_ok_and(|v| v == "1");
    let only: Vec<String> = std::env::var("WHARF_BENCH_CASES")
        .map(|s| s.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    for backend in backends() {
        for group_count in list("WHARF_BENCH_GROUPS", &[100, 10_000]) {
            let test = TestStore::new(backend).await;
            let groups = fleet(group_count, events, &long);
            let start = Instant::now();
            append_bulk(&test.store, fleet_ledger(groups.clone())).await;
            let loaded = start.elapsed().as_secs_f64();
            let rebuilt = rebuild(&test).await;
            state::insert_state(&test.store).await;
            let server = Server::start(test.store.clone(), reads).await;
            let (pages, walked) = walk(&server, &groups).await;
            println!();
            println!(
                "### {backend:?}, {events} events, {} groups (long: {long:?}): loaded in \
                 {loaded:.1} s, rebuilt in {rebuilt:.1} s, whole chain of {pages} pages walked \
                 in {walked:.2} s; API reads at once: {reads}; load {}",
                groups.len(),
                load_average()
            );
            if profiling {
                let read = ReadModel::new(test.store.clone(), Duration::from_secs(60));
                profile::profile(&read, &server.client, &server.base, requests).await;
            }
            println!();
            println!(
                "| case | API p50 ms | API p99 ms | SQL p50 ms | SQL p99 ms | ratio (p99) | \
                 bytes API / SQL | goal |"
            );
            println!("|---|---|---|---|---|---|---|---|");
            let mut cpu_rows = Vec::new();
            for case in cases(&server, &test.store, &groups).await {
                if !only.is_empty() && !only.iter().any(|o| case.label.contains(o.as_str())) {
                    continue;
                }
                cpu_rows.push(run_case(&server, &test.store, &case, requests, conns).await);
            }
            println!();
            println!(
                "| case, CPU ms per request | API: bench process | API: Postgres | API: all | \
                 SQL: bench process | SQL: Postgres | SQL: all |"
            );
            println!("|---|---|---|---|---|---|---|");
            for row in cpu_rows {
                println!("{row}");
            }
            println!("(load after: {})", load_average());
            if let (true, Store::Postgres(pg)) = (explain, &test.store) {
                let middle = groups[groups.len() / 2].name.clone();
                let longest = groups
                    .iter()
                    .filter(|g| g.shape == Shape::Long)
                    .max_by_key(|g| g.events)
                    .map_or(middle.clone(), |g| g.name.clone());
                plans::explain_all(pg, &middle, &longest, &groups[0].name).await;
            }
            if std::env::var("WHARF_BENCH_KEEP").is_ok_and(|v| v == "1") {
                if let Some(schema) = test.keep() {
                    println!("(kept: schema {schema})");
                }
            }
        }
    }
}
