//! Where a listing read's time goes (ADR 0038), on the bench's ledger: each part of a read
//! timed alone, one caller at a time (no concurrency), median and p99 of `runs` calls.
//!
//! - a bare round trip (`SELECT 1` on Postgres; an empty read on SQLite's reader pool) and a
//!   bare HTTP round trip (`/healthz`, which touches no store);
//! - the reads a page made before ADR 0038, each alone: the catch-up check, the store's clock,
//!   the page, the waiters, the instances (the public statements, run as the code ran them),
//!   the queue figures;
//! - the one-statement summary page and one-group read through `ReadModel`, and the queue
//!   figures beside them;
//! - JSON: encoding a page of 100 groups as the listing answered it before (each with a page
//!   of 100 waiters and of 100 instances) and as summaries, with the bytes of each.

use std::future::Future;
use std::time::Instant;

use wharf::domain::GroupName;
use wharf::projections::rows::{page_sql, PG_INSTANCES, PG_WAITERS};
use wharf::projections::{DeclarerAttempts, GroupQuery, MemberQuery, ReadModel};
use wharf::queue::{Queue, QueueSettings};
use wharf::store::Store;

async fn timed<F, Fut, T>(runs: usize, mut call: F) -> (f64, f64)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let mut millis = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        std::hint::black_box(call().await);
        millis.push(start.elapsed().as_secs_f64() * 1e3);
    }
    millis.sort_by(f64::total_cmp);
    let at = |q: f64| millis[((millis.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99))
}

fn row(what: &str, (p50, p99): (f64, f64), note: &str) {
    println!("| {what} | {p50:.3} | {p99:.3} | {note} |");
}

/// Prints the profile table for the store behind `read` and the API at `base`.
pub async fn profile(read: &ReadModel, client: &reqwest::Client, base: &str, runs: usize) {
    let store = read.store().clone();
    let queue = Queue::new(store.clone(), QueueSettings::default());
    let first = read
        .groups_page(&GroupQuery::default())
        .await
        .expect("a page");
    let names: Vec<GroupName> = first
        .groups
        .iter()
        .map(|g| GroupName::parse("group", &g.group).expect("a name"))
        .collect();
    let texts: Vec<String> = names.iter().map(ToString::to_string).collect();
    println!();
    println!("| part of a read (one caller) | p50 ms | p99 ms | note |");
    println!("|---|---|---|---|");
    let healthz = format!("{base}/healthz");
    row(
        "HTTP round trip, no store (`/healthz`)",
        timed(runs, || async {
            client
                .get(&healthz)
                .send()
                .await
                .expect("healthz")
                .bytes()
                .await
                .expect("a body")
                .len()
        })
        .await,
        "hyper + reqwest on loopback",
    );
    match &store {
        Store::Postgres(pg) => {
            row(
                "store round trip (`SELECT 1`)",
                timed(runs, || async {
                    sqlx::query_scalar::<_, i32>("SELECT 1")
                        .fetch_one(pg.pool())
                        .await
                        .expect("select 1")
                })
                .await,
                "pool acquire + one statement",
            );
            row(
                "store round trip, unnamed (`SELECT 1`)",
                timed(runs, || async {
                    sqlx::query_scalar::<_, i32>("SELECT 1")
                        .persistent(false)
                        .fetch_one(pg.pool())
                        .await
                        .expect("select 1")
                })
                .await,
                "parsed and planned per call",
            );
            let page = page_sql('$', false, false);
            row(
                "before: page statement",
                timed(runs, || async {
                    sqlx::query(&page)
                        .bind("")
                        .bind(101_i64)
                        .persistent(false)
                        .fetch_all(pg.pool())
                        .await
                        .expect("page")
                        .len()
                })
                .await,
                "101 effective rows",
            );
            row(
                "before: waiters statement",
                timed(runs, || async {
                    sqlx::query(PG_WAITERS)
                        .bind(&texts)
                        .bind(None::<chrono::DateTime<chrono::Utc>>)
                        .bind(None::<String>)
                        .bind(101_i64)
                        .persistent(false)
                        .fetch_all(pg.pool())
                        .await
                        .expect("waiters")
                        .len()
                })
                .await,
                "up to 101 per group of the page",
            );
            row(
                "before: instances statement",
                timed(runs, || async {
                    sqlx::query(PG_INSTANCES)
                        .bind(&texts)
                        .bind("")
                        .bind(101_i64)
                        .persistent(false)
                        .fetch_all(pg.pool())
                        .await
                        .expect("instances")
                        .len()
                })
                .await,
                "up to 101 per group of the page",
            );
        }
        Store::Sqlite(s) => {
            row(
                "store round trip (empty read)",
                timed(runs, || async {
                    s.read(|_| Ok(())).await.expect("a read");
                })
                .await,
                "reader pool + blocking thread",
            );
        }
    }
    row(
        "before: catch-up check (`ReadModel::catch_up`, nothing new)",
        timed(runs, || async { read.catch_up().await.expect("catch up") }).await,
        "one statement",
    );
    row(
        "before: the store's clock (`Store::now`)",
        timed(runs, || async { store.now().await.expect("now") }).await,
        "one statement on Postgres, none on SQLite",
    );
    row(
        "queue figures of the page (`group_stats_of`)",
        timed(runs, || async {
            queue.group_stats_of(&names).await.expect("stats").len()
        })
        .await,
        "one statement, kept (ADR 0038)",
    );
    row(
        "now: summary page (`groups_page`)",
        timed(runs, || async {
            read.groups_page(&GroupQuery::default())
                .await
                .expect("a page")
                .groups
                .len()
        })
        .await,
        "one statement on Postgres, one read transaction on SQLite",
    );
    let waiting = GroupQuery {
        waiting: true,
        ..GroupQuery::default()
    };
    let waiting_names: Vec<GroupName> = read
        .groups_page(&waiting)
        .await
        .expect("a page of waiting groups")
        .groups
        .iter()
        .map(|g| GroupName::parse("group", &g.group).expect("a name"))
        .collect();
    row(
        "now: summary page of waiting groups (`groups_page`)",
        timed(runs, || async {
            read.groups_page(&waiting)
                .await
                .expect("a page")
                .groups
                .len()
        })
        .await,
        "the walk of `waiting_group` (ADR 0060)",
    );
    row(
        "queue figures of that page (`group_stats_of`)",
        timed(runs, || async {
            queue
                .group_stats_of(&waiting_names)
                .await
                .expect("stats")
                .len()
        })
        .await,
        "one statement",
    );
    if let Store::Postgres(pg) = &store {
        undecoded_calls(pg, &texts, runs).await;
    }
    let one = names.first().expect("a group").clone();
    row(
        "now: one group (`group_members`)",
        one_group_timed(read, &one, runs).await,
        "one statement on Postgres, one read transaction on SQLite",
    );
    // The longest group the bench made (`fleet`'s names), if any: a page of 100 waiters and of
    // 100 instances.
    let mut long = None;
    for size in ["long-0100000", "long-0010000", "long-0001000"] {
        let name = GroupName::parse("group", size).expect("a name");
        let found = read.group_members(&name, &MemberQuery::default()).await;
        if let Some(view) = found.expect("a group") {
            long = Some((name, view));
            break;
        }
    }
    if let Some((long, view)) = long {
        let bytes = serde_json::to_vec(&view).expect("json").len();
        row(
            &format!("now: one group, {long} (`group_members`)"),
            one_group_timed(read, &long, runs).await,
            "its first 100 waiters and 100 instances",
        );
        if let Store::Postgres(pg) = &store {
            row(
                &format!("one group call, rows not decoded ({long})"),
                timed(runs, || async {
                    sqlx::query(wharf::projections::rows::PG_GROUP_ROWS_CALL)
                        .bind(long.as_str())
                        .bind(None::<chrono::DateTime<chrono::Utc>>)
                        .bind(None::<String>)
                        .bind(101_i64)
                        .bind("")
                        .bind(DeclarerAttempts::NAME)
                        .fetch_all(pg.pool())
                        .await
                        .expect("a group")
                        .len()
                })
                .await,
                "`wharf_group_rows`, its rows not decoded",
            );
        }
        row(
            &format!("JSON encode: {long}'s view ({bytes} bytes)"),
            timed(runs, || async {
                serde_json::to_vec(&view).expect("json").len()
            })
            .await,
            "serde_json, the view alone",
        );
    }
    // JSON: the page as it was answered (each group with a page of its members) and now.
    let mut views = Vec::new();
    for name in &names {
        let view = read
            .group_members(name, &MemberQuery::default())
            .await
            .expect("a group")
            .expect("declared");
        views.push(view);
    }
    let before_bytes = serde_json::to_vec(&views).expect("json").len();
    let now_bytes = serde_json::to_vec(&first.groups).expect("json").len();
    row(
        &format!("JSON encode, before: 100 groups with members ({before_bytes} bytes)"),
        timed(runs, || async {
            serde_json::to_vec(&views).expect("json").len()
        })
        .await,
        "serde_json, the views alone (no queue figures)",
    );
    row(
        &format!("JSON encode, now: 100 summaries ({now_bytes} bytes)"),
        timed(runs, || async {
            serde_json::to_vec(&first.groups).expect("json").len()
        })
        .await,
        "serde_json, the summaries alone",
    );
}

/// `group`'s view with its first page of members, read `runs` times through `ReadModel`.
async fn one_group_timed(read: &ReadModel, group: &GroupName, runs: usize) -> (f64, f64) {
    timed(runs, || async {
        read.group_members(group, &MemberQuery::default())
            .await
            .expect("a group")
            .is_some()
    })
    .await
}

/// The Postgres summary and figures calls of a plain page and of a page of waiting groups,
/// their rows fetched but not decoded: against the rows above, what decoding costs the
/// client; against the server's own time (`EXPLAIN ANALYZE`), what the wire does.
async fn undecoded_calls(pg: &wharf::store::PgStore, plain_names: &[String], runs: usize) {
    use wharf::projections::summary::PG_SUMMARIES_CALL;
    for waiting in [false, true] {
        row(
            &format!("summary call, rows not decoded (waiting={waiting})"),
            timed(runs, || async {
                sqlx::query(PG_SUMMARIES_CALL)
                    .bind("")
                    .bind(101_i64)
                    .bind(None::<String>)
                    .bind(waiting)
                    .bind(DeclarerAttempts::NAME)
                    .bind(30_000_000_i64)
                    .fetch_all(pg.pool())
                    .await
                    .expect("summaries")
                    .len()
            })
            .await,
            "`wharf_group_summaries`, the rows as sqlx returns them",
        );
    }
    row(
        "figures call, rows not decoded (plain page)",
        timed(runs, || async {
            sqlx::query("SELECT * FROM wharf_group_figures($1)")
                .bind(plain_names)
                .fetch_all(pg.pool())
                .await
                .expect("figures")
                .len()
        })
        .await,
        "`wharf_group_figures`, the rows as sqlx returns them",
    );
}
