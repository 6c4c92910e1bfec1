//! A generated declaration ledger for the rebuild benchmark and tests: a fleet of groups that
//! deploy. Per group: an install, waiting retries of two declarers asking for a new set, the
//! swap to it (which resolves the other waiter), and a waiter for the old set; interleaved
//! across groups in position order. Loaded in bulk (the rows the register path writes, with no
//! projection), so a rebuild is what makes the projections.

use chrono::{DateTime, Duration, Utc};
use serde_json::Value;
use wharf::domain::declaration::AGGREGATE_TYPE;
use wharf::domain::{
    AppVersion, Attempt, BindingSet, DeclarationEvent, DeclarerId, GroupName, TopicName,
};
use wharf::store::Store;

/// Events per group in the generated ledger.
pub const PER_GROUP: usize = 23;

fn set(patterns: &[&str]) -> BindingSet {
    BindingSet::parse(patterns).expect("a valid set")
}

fn attempt(group: usize, who: &str, patterns: &BindingSet, at: DateTime<Utc>) -> Attempt {
    Attempt {
        group: GroupName::parse("g", &format!("group-{group:06}")).expect("group"),
        topic: TopicName::parse("t", "orders").expect("topic"),
        declarer: DeclarerId::parse("d", &format!("{who}-{group}")).expect("declarer"),
        version: AppVersion::parse("v", "1.0.0").expect("version"),
        patterns: patterns.clone(),
        declared_at: at,
        attempt_at: at,
    }
}

/// The `step`-th event of `group` (0..PER_GROUP).
fn event(group: usize, step: usize, base: DateTime<Utc>) -> DeclarationEvent {
    let old = set(&["orders/+/paid", "orders/eu/#"]);
    let new = set(&["orders/#"]);
    let at = base + Duration::milliseconds((step * 1_000 + group) as i64);
    let first_wait = base + Duration::milliseconds(1_000 + group as i64);
    let waiting =
        |who: &str, asks: &BindingSet, on: &BindingSet, since| DeclarationEvent::Waiting {
            attempt: Attempt {
                declared_at: since,
                ..attempt(group, who, asks, at)
            },
            incumbent: on.clone(),
            live_declarers: vec![DeclarerId::parse("d", &format!("a-{group}")).expect("declarer")],
        };
    match step {
        0 => DeclarationEvent::Installed {
            attempt: attempt(group, "a", &old, at),
            previous: None,
        },
        1..=20 if step % 2 == 1 => waiting("b", &new, &old, first_wait),
        1..=20 => waiting("c", &new, &old, first_wait),
        21 => DeclarationEvent::Installed {
            attempt: Attempt {
                declared_at: first_wait,
                ..attempt(group, "b", &new, at)
            },
            previous: Some(old),
        },
        _ => waiting("a", &set(&["orders/+/paid"]), &new, at),
    }
}

/// The ledger in position order, generated as it is taken: step by step, every group at
/// each step.
pub fn ledger(events: usize) -> impl Iterator<Item = (String, i64, DeclarationEvent)> {
    let groups = events.div_ceil(PER_GROUP);
    let base = Utc::now() - Duration::days(1);
    (0..PER_GROUP)
        .flat_map(move |step| (0..groups).map(move |group| (step, group)))
        .take(events)
        .map(move |(step, group)| {
            (
                format!("group-{group:06}"),
                step as i64 + 1,
                event(group, step, base),
            )
        })
}

/// Appends `events` generated events to `store` in bulk.
pub async fn load(store: &Store, events: usize) {
    append_bulk(store, ledger(events)).await;
}

/// Appends `rows` (group, sequence, event), in position order, to `store` in bulk: the rows
/// the register path writes, with no projection.
pub async fn append_bulk<I>(store: &Store, rows: I)
where
    I: Iterator<Item = (String, i64, DeclarationEvent)> + Send + 'static,
{
    let kind = |e: &DeclarationEvent| {
        if e.is_installed() {
            "DeclarationInstalled"
        } else {
            "DeclarationWaiting"
        }
    };
    match store {
        Store::Sqlite(s) => {
            s.write(move |ctx| {
                let mut insert = ctx.tx.prepare(
                    "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, \
                     event_version, payload, metadata, recorded_at) \
                     VALUES (?1, ?2, ?3, ?4, '1.0', ?5, '{}', ?6)",
                )?;
                for (group, sequence, event) in rows {
                    let payload = serde_json::to_string(&event).expect("payload");
                    insert.execute(rusqlite::params![
                        AGGREGATE_TYPE,
                        group,
                        sequence,
                        kind(&event),
                        payload,
                        event.attempt().attempt_at.timestamp_micros(),
                    ])?;
                }
                Ok(())
            })
            .await
            .expect("loading SQLite");
            // Settle the load into the main file, as a store at rest is.
            s.read(|conn| Ok(conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?))
                .await
                .expect("checkpointing the WAL");
        }
        Store::Postgres(s) => {
            let mut rows = rows.peekable();
            while rows.peek().is_some() {
                let chunk: Vec<_> = rows.by_ref().take(10_000).collect();
                let groups: Vec<&str> = chunk.iter().map(|r| r.0.as_str()).collect();
                let sequences: Vec<i64> = chunk.iter().map(|r| r.1).collect();
                let kinds: Vec<&str> = chunk.iter().map(|r| kind(&r.2)).collect();
                let payloads: Vec<Value> = chunk
                    .iter()
                    .map(|r| serde_json::to_value(&r.2).expect("payload"))
                    .collect();
                sqlx::query(
                    "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, \
                     event_version, payload, metadata) \
                     SELECT $1, g, s, k, '1.0', p, '{}' \
                     FROM unnest($2::text[], $3::bigint[], $4::text[], $5::json[]) AS r(g, s, k, p)",
                )
                .bind(AGGREGATE_TYPE)
                .bind(groups)
                .bind(sequences)
                .bind(kinds)
                .bind(payloads)
                .execute(s.pool())
                .await
                .expect("loading Postgres");
            }
        }
    }
}
