//! `EXPLAIN (ANALYZE, BUFFERS)` of every statement a listing read runs, on the bench's
//! Postgres ledger, under custom and generic plans (a cached statement may go generic; the
//! listing's own statements are unnamed and planned per call, the history read is cached):
//! prints each plan's scan lines (node, index, rows) with their buffers and the execution time.

use sqlx::postgres::PgArguments;
use sqlx::Arguments;
use wharf::store::postgres::QUERY_EVENTS;
use wharf::store::PgStore;
use wharf_projections::rows::{one_sql, page_sql, PG_GROUP_ROWS, PG_INSTANCES, PG_WAITERS};
use wharf_projections::summary::{pg_page_sql, pg_summary_sql};

/// The history read before ADR 0036 (ordered by position), for comparison.
const FORMER_HISTORY: &str = "SELECT position, aggregate_type, aggregate_id, sequence, \
     event_type, event_version, payload, metadata, recorded_at FROM events \
     WHERE aggregate_type = $1 AND aggregate_id = $2 AND position > $3 \
     AND ($4::timestamptz IS NULL OR recorded_at >= $4) \
     AND ($5::timestamptz IS NULL OR recorded_at < $5) \
     AND ($6::text IS NULL OR payload->>$6 = $7) ORDER BY position LIMIT $8";

/// The page of waiting groups before ADR 0036 (every waiting attempt walked), for comparison.
const FORMER_WAITING: &str = "SELECT DISTINCT ON (a.group_name) e.group_name, e.topic, \
     e.declarer, e.version, e.patterns, e.previous, e.declared_at, e.attempt_at, e.position, \
     e.installs FROM declarer_attempt a \
     CROSS JOIN LATERAL (SELECT * FROM effective_declaration g \
       WHERE g.group_name = a.group_name LIMIT 1) e \
     WHERE a.status = 'waiting' AND a.group_name > $1 AND a.patterns <> e.patterns \
     ORDER BY a.group_name LIMIT $2";

/// The catch-up check every listing read runs first.
const CATCH_UP: &str = "SELECT COALESCE((SELECT MAX(position) FROM events), 0), \
     COALESCE((SELECT position FROM projection_checkpoint WHERE projector = $1), 0)";

fn text(values: &[&str]) -> PgArguments {
    let mut args = PgArguments::default();
    for v in values {
        args.add(v.to_string()).expect("an argument");
    }
    args
}

/// One statement to explain: a label, its SQL, and its arguments.
struct Statement {
    what: String,
    sql: String,
    args: Box<dyn Fn() -> PgArguments>,
}

fn statements(middle: &str, long_group: &str, fleet_group: &str) -> Vec<Statement> {
    let (middle, long_group, fleet_group) = (
        middle.to_owned(),
        long_group.to_owned(),
        fleet_group.to_owned(),
    );
    let page = |after: String, topic: Option<&'static str>| {
        move || {
            let mut args = PgArguments::default();
            args.add(after.clone()).expect("after");
            args.add(101i64).expect("limit");
            if let Some(topic) = topic {
                args.add(topic.to_owned()).expect("topic");
            }
            args
        }
    };
    let members = |group: String, waiters: bool| {
        move || {
            let mut args = PgArguments::default();
            args.add(vec![group.clone()]).expect("groups");
            if waiters {
                args.add(None::<chrono::DateTime<chrono::Utc>>).expect("at");
                args.add(None::<String>).expect("declarer");
            } else {
                args.add(String::new()).expect("after");
            }
            args.add(101i64).expect("count");
            args
        }
    };
    let history = |group: String| {
        move || {
            let mut args = PgArguments::default();
            args.add("consumer_group".to_owned()).expect("type");
            args.add(group.clone()).expect("id");
            args.add(0i64).expect("after");
            args.add(None::<chrono::DateTime<chrono::Utc>>)
                .expect("since");
            args.add(None::<chrono::DateTime<chrono::Utc>>)
                .expect("until");
            args.add(None::<String>).expect("field");
            args.add(None::<String>).expect("value");
            args.add(100i64).expect("limit");
            args
        }
    };
    let summaries = |after: String, topic: Option<&'static str>| {
        move || {
            let mut args = PgArguments::default();
            args.add(after.clone()).expect("after");
            args.add(101i64).expect("limit");
            args.add(topic.map(str::to_owned)).expect("topic");
            // Unused by the statement (it picks the form, as in `wharf_group_summaries`).
            args.add(false).expect("waiting");
            args.add("declarer_attempts".to_owned()).expect("projector");
            args.add(60_000_000i64).expect("ttl");
            args
        }
    };
    let group_read = |group: String| {
        move || {
            let mut args = PgArguments::default();
            args.add(group.clone()).expect("group");
            args.add(None::<chrono::DateTime<chrono::Utc>>).expect("at");
            args.add(None::<String>).expect("declarer");
            args.add(101i64).expect("count");
            args.add(String::new()).expect("instances after");
            args.add("declarer_attempts".to_owned()).expect("projector");
            args
        }
    };
    vec![
        Statement {
            what: "summary page, first (one statement)".into(),
            sql: pg_summary_sql(false, false),
            args: Box::new(summaries(String::new(), None)),
        },
        Statement {
            what: "summary page with its queue figures, first (the API's, ADR 0072)".into(),
            sql: pg_page_sql(false, false),
            args: Box::new(summaries(String::new(), None)),
        },
        Statement {
            what: "summary page by topic after the middle".into(),
            sql: pg_summary_sql(true, false),
            args: Box::new(summaries(middle.clone(), Some("orders-3"))),
        },
        Statement {
            what: "summary page of waiting groups, first".into(),
            sql: pg_summary_sql(false, true),
            args: Box::new(summaries(String::new(), None)),
        },
        Statement {
            what: format!("one group in one statement ({long_group})"),
            sql: PG_GROUP_ROWS.into(),
            args: Box::new(group_read(long_group.clone())),
        },
        Statement {
            what: "catch-up check".into(),
            sql: CATCH_UP.into(),
            args: Box::new(|| text(&["declarer_attempts"])),
        },
        Statement {
            what: "first page".into(),
            sql: page_sql('$', false, false),
            args: Box::new(page(String::new(), None)),
        },
        Statement {
            what: "page after the middle group".into(),
            sql: page_sql('$', false, false),
            args: Box::new(page(middle.clone(), None)),
        },
        Statement {
            what: "topic page after the middle".into(),
            sql: page_sql('$', true, false),
            args: Box::new(page(middle.clone(), Some("orders-3"))),
        },
        Statement {
            what: "waiting page, first".into(),
            sql: page_sql('$', false, true),
            args: Box::new(page(String::new(), None)),
        },
        Statement {
            what: "waiting page after the middle".into(),
            sql: page_sql('$', false, true),
            args: Box::new(page(middle.clone(), None)),
        },
        Statement {
            what: "former waiting page after the middle".into(),
            sql: FORMER_WAITING.into(),
            args: Box::new(page(middle, None)),
        },
        Statement {
            what: format!("one group ({long_group})"),
            sql: one_sql('$'),
            args: Box::new({
                let g = long_group.clone();
                move || text(&[&g])
            }),
        },
        Statement {
            what: format!("waiters of {long_group}"),
            sql: PG_WAITERS.into(),
            args: Box::new(members(long_group.clone(), true)),
        },
        Statement {
            what: format!("instances of {long_group}"),
            sql: PG_INSTANCES.into(),
            args: Box::new(members(long_group.clone(), false)),
        },
        Statement {
            what: format!("history of {long_group}"),
            sql: QUERY_EVENTS.into(),
            args: Box::new(history(long_group.clone())),
        },
        Statement {
            what: format!("former history of {long_group}"),
            sql: FORMER_HISTORY.into(),
            args: Box::new(history(long_group.clone())),
        },
        Statement {
            what: format!("history of {fleet_group}"),
            sql: QUERY_EVENTS.into(),
            args: Box::new(history(fleet_group)),
        },
    ]
}

/// The key lines of a text plan: scan and join nodes, their buffers, the execution time.
fn key_lines(plan: &[String]) -> Vec<String> {
    plan.iter()
        .filter(|line| {
            [
                "Scan",
                "Buffers",
                "Execution Time",
                "Sort Method",
                "Nested Loop",
                "Join",
            ]
            .iter()
            .any(|k| line.contains(k))
        })
        .map(|line| line.trim_end().to_owned())
        .collect()
}

/// Explains every listing statement on `store` and prints the key lines.
pub async fn explain_all(store: &PgStore, middle: &str, long_group: &str, fleet_group: &str) {
    let mut conn = store.pool().acquire().await.expect("a connection");
    for statement in statements(middle, long_group, fleet_group) {
        for mode in ["force_custom_plan", "force_generic_plan"] {
            sqlx::query(&format!("SET plan_cache_mode = {mode}"))
                .execute(&mut *conn)
                .await
                .expect("plan mode");
            let plan: Vec<String> = sqlx::query_scalar_with(
                &format!("EXPLAIN (ANALYZE, BUFFERS) {}", statement.sql),
                (statement.args)(),
            )
            .fetch_all(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", statement.what));
            println!("-- {} ({mode})", statement.what);
            for line in key_lines(&plan) {
                println!("   {line}");
            }
        }
    }
    sqlx::query("RESET plan_cache_mode")
        .execute(&mut *conn)
        .await
        .expect("plan mode");
}
