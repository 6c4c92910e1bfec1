//! Ledger maintenance: the deferred pruner, which deletes superseded events from the `events`
//! table (ADR 0004, ADR 0075).
//!
//! What is superseded is stated by the caller as [`Superseded`] rules, one per aggregate type
//! and event type, naming both by the domain's constants (the store knows positions,
//! sequences and aggregates, not what an event means): an event of the rule's aggregate type
//! and event type is superseded when a later event of the same stream (same aggregate type and
//! id, greater sequence) either carries the same value in a named top-level payload field
//! ([`SupersededBy::SameField`]) or is of one of the named event types
//! ([`SupersededBy::EventTypes`]). The field comparison is the one place the store looks into
//! a payload, and it only compares the field's text between two events of one stream.
//!
//! The mechanism, whatever the rules:
//! - Only events recorded before the cutoff (the store's clock minus the retention) are
//!   eligible; a retention longer than the clock can count back makes the cutoff the earliest
//!   time, so nothing is eligible.
//! - A superseded event has a later event in its stream by definition, so the stream's newest
//!   event is never deleted and the next append's sequence is unaffected. A rule whose
//!   superseding events are never themselves deleted last (the caller's rules: a declarer's
//!   newest event, a lease stream's newest event) keeps concurrent pruners and writers safe:
//!   writers only add newer rows, and a row goes only while a newer one exists.
//! - Deletes run in transactions of at most `batch` rows until one deletes fewer; a dry run
//!   counts what is eligible and deletes nothing.
//! - It refuses on a store migrated by a newer build ([`StoreError::NewerSchema`]), whose rows
//!   may mean what this build does not know.
//!
//! It writes no projection row: a rule must only name events whose deletion leaves every
//! projector's fold of the stream unchanged, so a rebuild from the pruned ledger reproduces the
//! projections (the callers' rules and `tests/tests/rebuild_prune.rs` hold to it).

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::{PgStore, SqliteStore, Store, StoreError};

/// How the pruner runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneOptions {
    /// Superseded events younger than this are kept.
    pub retention: std::time::Duration,
    /// Count what would be deleted, delete nothing.
    pub dry_run: bool,
    /// At most this many rows per delete transaction.
    pub batch: i64,
}

/// What a prune did (or, dry, would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Events recorded before this time were eligible.
    pub cutoff: DateTime<Utc>,
    /// Superseded events older than the cutoff.
    pub eligible: u64,
    /// How many were deleted (0 in a dry run).
    pub deleted: u64,
    /// Whether this was a dry run.
    pub dry_run: bool,
}

/// Which later event of the same stream supersedes an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SupersededBy {
    /// Any later event whose payload carries the same value in this top-level field.
    SameField(&'static str),
    /// Any later event of one of these types.
    EventTypes(&'static [&'static str]),
}

/// One pruning rule: the events of one type in one aggregate type's streams that a later event
/// of the same stream supersedes. Built only by its `const` constructors, which accept names of
/// ASCII letters, digits and `_` (the domain's constants are), so a rule's names go into the
/// statement as literals and a bad name fails where the rule is built (at compile time for a
/// `const` rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superseded {
    aggregate_type: &'static str,
    event_type: &'static str,
    by: SupersededBy,
}

impl Superseded {
    /// Events of `event_type` in `aggregate_type`'s streams, superseded by any later event of
    /// the stream with the same value in the payload's top-level `field`.
    pub const fn by_same_field(
        aggregate_type: &'static str,
        event_type: &'static str,
        field: &'static str,
    ) -> Self {
        assert_name(aggregate_type);
        assert_name(event_type);
        assert_name(field);
        Self {
            aggregate_type,
            event_type,
            by: SupersededBy::SameField(field),
        }
    }

    /// Events of `event_type` in `aggregate_type`'s streams, superseded by any later event of
    /// the stream whose type is one of `by` (at least one).
    pub const fn by_event_types(
        aggregate_type: &'static str,
        event_type: &'static str,
        by: &'static [&'static str],
    ) -> Self {
        assert_name(aggregate_type);
        assert_name(event_type);
        assert!(
            !by.is_empty(),
            "a pruning rule needs at least one superseding event type"
        );
        let mut i = 0;
        while i < by.len() {
            assert_name(by[i]);
            i += 1;
        }
        Self {
            aggregate_type,
            event_type,
            by: SupersededBy::EventTypes(by),
        }
    }

    /// The aggregate type whose streams the rule prunes.
    pub fn aggregate_type(&self) -> &'static str {
        self.aggregate_type
    }

    /// The event type the rule prunes.
    pub fn event_type(&self) -> &'static str {
        self.event_type
    }

    /// What supersedes it.
    pub fn by(&self) -> SupersededBy {
        self.by
    }

    /// The positions of this rule's eligible events, with the cutoff as `cutoff` (a parameter).
    fn eligible_sql(&self, backend: Backend, cutoff: &str) -> String {
        let Self {
            aggregate_type,
            event_type,
            by,
        } = self;
        let superseding = match (by, backend) {
            (SupersededBy::SameField(field), Backend::Sqlite) => format!(
                "json_extract(n.payload, '$.{field}') = json_extract(e.payload, '$.{field}')"
            ),
            (SupersededBy::SameField(field), Backend::Postgres) => {
                format!("n.payload->>'{field}' = e.payload->>'{field}'")
            }
            (SupersededBy::EventTypes(types), _) => {
                let types = types
                    .iter()
                    .map(|t| format!("'{t}'"))
                    .collect::<Vec<_>>()
                    .join(", ");
                format!("n.event_type IN ({types})")
            }
        };
        format!(
            "SELECT e.position FROM events e \
             WHERE e.aggregate_type = '{aggregate_type}' AND e.event_type = '{event_type}' \
             AND e.recorded_at < {cutoff} AND EXISTS (SELECT 1 FROM events n \
               WHERE n.aggregate_type = e.aggregate_type AND n.aggregate_id = e.aggregate_id \
               AND n.sequence > e.sequence AND {superseding})"
        )
    }
}

/// A name a rule may hold: ASCII letters, digits and `_`, at least one.
const fn assert_name(name: &str) {
    let bytes = name.as_bytes();
    assert!(!bytes.is_empty(), "a pruning rule's name is empty");
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        assert!(
            b.is_ascii_alphanumeric() || b == b'_',
            "a pruning rule's names are ASCII letters, digits and _"
        );
        i += 1;
    }
}

#[derive(Debug, Clone, Copy)]
enum Backend {
    Sqlite,
    Postgres,
}

/// The positions of every rule's eligible events, or `None` for no rule.
fn eligible_sql(rules: &[Superseded], backend: Backend, cutoff: &str) -> Option<String> {
    (!rules.is_empty()).then(|| {
        rules
            .iter()
            .map(|rule| rule.eligible_sql(backend, cutoff))
            .collect::<Vec<_>>()
            .join(" UNION ALL ")
    })
}

impl Store {
    /// Runs the deferred pruner once with `rules` (see the [module](self) documentation).
    /// Refused on a store migrated by a newer build.
    pub async fn prune(
        &self,
        rules: &[Superseded],
        options: PruneOptions,
    ) -> Result<PruneReport, StoreError> {
        self.ensure_not_newer("prune").await?;
        // A retention longer than the clock can count back means nothing is old enough: the
        // cutoff saturates at the earliest time rather than failing.
        let now = self.now().await?;
        let cutoff = chrono::Duration::from_std(options.retention)
            .ok()
            .and_then(|retention| now.checked_sub_signed(retention))
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let batch = options.batch.max(1);
        let dry_run = options.dry_run;
        let (eligible, deleted) = match self {
            Store::Sqlite(store) => {
                prune_with(&SqlitePrune { store, cutoff }, rules, batch, dry_run).await?
            }
            Store::Postgres(store) => {
                prune_with(&PgPrune { store, cutoff }, rules, batch, dry_run).await?
            }
        };
        Ok(PruneReport {
            cutoff,
            eligible,
            deleted,
            dry_run,
        })
    }
}

/// A backend's statements for a prune: its placeholders, the count and one batch's delete.
trait PruneDialect {
    /// Which backend's SQL the rules write.
    const BACKEND: Backend;
    /// The placeholders of the cutoff and of the batch size.
    const CUTOFF: &'static str;
    const BATCH: &'static str;

    /// Runs the count `sql` (the cutoff bound); its value.
    async fn count(&self, sql: String) -> Result<i64, StoreError>;

    /// Runs one batch's delete `sql` (the cutoff and `batch` bound); how many it deleted.
    async fn delete(&self, sql: String, batch: i64) -> Result<u64, StoreError>;
}

/// The prune itself, written once: counts what `rules` make eligible, and unless `dry_run`
/// deletes it in batches of `batch` events, each its own transaction, until one falls short.
/// `(eligible, deleted)`.
async fn prune_with<D: PruneDialect>(
    db: &D,
    rules: &[Superseded],
    batch: i64,
    dry_run: bool,
) -> Result<(u64, u64), StoreError> {
    let Some(eligible_sql) = eligible_sql(rules, D::BACKEND, D::CUTOFF) else {
        return Ok((0, 0));
    };
    let eligible = db
        .count(format!("SELECT COUNT(*) FROM ({eligible_sql}) eligible"))
        .await? as u64;
    if dry_run {
        return Ok((eligible, 0));
    }
    let delete = format!(
        "DELETE FROM events WHERE position IN ({eligible_sql} LIMIT {})",
        D::BATCH
    );
    let mut deleted = 0u64;
    loop {
        let removed = db.delete(delete.clone(), batch).await?;
        deleted += removed;
        if (removed as i64) < batch {
            return Ok((eligible, deleted));
        }
    }
}

/// A prune on SQLite: the count on a reader, each batch a write transaction.
struct SqlitePrune<'s> {
    store: &'s SqliteStore,
    cutoff: DateTime<Utc>,
}

impl PruneDialect for SqlitePrune<'_> {
    const BACKEND: Backend = Backend::Sqlite;
    const CUTOFF: &'static str = "?1";
    const BATCH: &'static str = "?2";

    async fn count(&self, sql: String) -> Result<i64, StoreError> {
        let cutoff = self.cutoff.timestamp_micros();
        self.store
            .read(move |conn| Ok(conn.query_row(&sql, [cutoff], |r| r.get(0))?))
            .await
    }

    async fn delete(&self, sql: String, batch: i64) -> Result<u64, StoreError> {
        let cutoff = self.cutoff.timestamp_micros();
        let removed = self
            .store
            .write(move |ctx| Ok(ctx.tx.execute(&sql, rusqlite::params![cutoff, batch])?))
            .await?;
        Ok(removed as u64)
    }
}

/// A prune on Postgres: each statement on the pool, each batch its own transaction.
struct PgPrune<'s> {
    store: &'s PgStore,
    cutoff: DateTime<Utc>,
}

impl PruneDialect for PgPrune<'_> {
    const BACKEND: Backend = Backend::Postgres;
    const CUTOFF: &'static str = "$1";
    const BATCH: &'static str = "$2";

    async fn count(&self, sql: String) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(&sql)
            .bind(self.cutoff)
            .fetch_one(self.store.pool())
            .await?)
    }

    async fn delete(&self, sql: String, batch: i64) -> Result<u64, StoreError> {
        Ok(sqlx::query(&sql)
            .bind(self.cutoff)
            .bind(batch)
            .execute(self.store.pool())
            .await?
            .rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{NewEvent, Payload};

    const KEYED: Superseded = Superseded::by_same_field("keyed", "Tried", "who");
    const TYPED: Superseded = Superseded::by_event_types("typed", "Renewed", &["Renewed", "Ended"]);

    async fn store(dir: &tempfile::TempDir) -> Store {
        let sqlite = SqliteStore::open(dir.path().join("w.db"), Vec::new())
            .await
            .unwrap();
        sqlite.migrate().await.unwrap();
        Store::Sqlite(sqlite)
    }

    fn event(event_type: &str, payload: serde_json::Value) -> NewEvent {
        NewEvent {
            event_type: event_type.to_owned(),
            event_version: "1.0".to_owned(),
            payload: Payload::to_json(&payload).unwrap(),
            metadata: serde_json::Value::Null,
        }
    }

    /// Each stream's events, oldest first, as (type, payload) pairs.
    async fn kept(store: &Store, aggregate_type: &str, id: &str) -> Vec<(String, String)> {
        store
            .load(aggregate_type, id)
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.event_type, e.payload.get().to_owned()))
            .collect()
    }

    fn options(retention: Duration, dry_run: bool, batch: i64) -> PruneOptions {
        PruneOptions {
            retention,
            dry_run,
            batch,
        }
    }

    #[tokio::test]
    async fn deletes_what_a_later_event_of_the_stream_supersedes_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let tried = |who: &str, n: i64| event("Tried", serde_json::json!({ "who": who, "n": n }));
        // a's first two tries are superseded by its third; b's one try is its newest; c's try
        // is followed only by an event of another type naming another declarer.
        store
            .append(
                "keyed",
                "g",
                0,
                vec![
                    tried("a", 1),
                    tried("b", 1),
                    tried("a", 2),
                    tried("c", 1),
                    tried("a", 3),
                    event("Done", serde_json::json!({ "who": "d" })),
                ],
            )
            .await
            .unwrap();
        // Another stream's "a" does not supersede this one's.
        store
            .append("keyed", "h", 0, vec![tried("a", 9)])
            .await
            .unwrap();
        store
            .append(
                "typed",
                "s",
                0,
                vec![
                    event("Renewed", serde_json::json!({ "n": 1 })),
                    event("Renewed", serde_json::json!({ "n": 2 })),
                    event("Lost", serde_json::json!({ "n": 3 })),
                    event("Renewed", serde_json::json!({ "n": 4 })),
                    event("Lost", serde_json::json!({ "n": 5 })),
                ],
            )
            .await
            .unwrap();
        let rules = [KEYED, TYPED];

        let dry = store
            .prune(&rules, options(Duration::ZERO, true, 1))
            .await
            .unwrap();
        assert_eq!((dry.eligible, dry.deleted, dry.dry_run), (4, 0, true));
        assert_eq!(
            kept(&store, "keyed", "g").await.len(),
            6,
            "a dry run deletes nothing"
        );

        let report = store
            .prune(&rules, options(Duration::ZERO, false, 2))
            .await
            .unwrap();
        assert_eq!((report.eligible, report.deleted), (4, 4));
        let types = |events: Vec<(String, String)>| {
            events
                .into_iter()
                .map(|(t, p)| format!("{t} {p}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            types(kept(&store, "keyed", "g").await),
            [
                r#"Tried {"n":1,"who":"b"}"#,
                r#"Tried {"n":1,"who":"c"}"#,
                r#"Tried {"n":3,"who":"a"}"#,
                r#"Done {"who":"d"}"#,
            ]
        );
        assert_eq!(kept(&store, "keyed", "h").await.len(), 1);
        assert_eq!(
            types(kept(&store, "typed", "s").await),
            [r#"Lost {"n":3}"#, r#"Renewed {"n":4}"#, r#"Lost {"n":5}"#,],
            "a renewal followed only by events of other types stays"
        );
        // The stream goes on from its own head.
        store
            .append("keyed", "g", 6, vec![tried("a", 4)])
            .await
            .unwrap();
        let again = store
            .prune(&rules, options(Duration::ZERO, false, 2))
            .await
            .unwrap();
        assert_eq!((again.eligible, again.deleted), (1, 1));
    }

    #[tokio::test]
    async fn keeps_what_is_younger_than_the_retention_and_runs_no_rule_when_given_none() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let tried = |n: i64| event("Tried", serde_json::json!({ "who": "a", "n": n }));
        store
            .append("keyed", "g", 0, vec![tried(1), tried(2)])
            .await
            .unwrap();
        let young = store
            .prune(&[KEYED], options(Duration::from_secs(3600), false, 10))
            .await
            .unwrap();
        assert_eq!((young.eligible, young.deleted), (0, 0));
        let none = store
            .prune(&[], options(Duration::ZERO, false, 10))
            .await
            .unwrap();
        assert_eq!((none.eligible, none.deleted), (0, 0));
        assert_eq!(kept(&store, "keyed", "g").await.len(), 2);
    }

    #[tokio::test]
    async fn a_retention_beyond_the_clock_prunes_nothing_instead_of_failing() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let report = store
            .prune(&[KEYED, TYPED], options(Duration::MAX, false, 10))
            .await
            .unwrap();
        assert_eq!((report.eligible, report.deleted), (0, 0));
        assert_eq!(report.cutoff, DateTime::<Utc>::MIN_UTC);
    }

    #[tokio::test]
    async fn refuses_on_a_store_a_newer_build_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let Store::Sqlite(sqlite) = &store else {
            unreachable!()
        };
        let newer = store.known_version() + 1;
        sqlite
            .write(move |ctx| {
                Ok(ctx.tx.execute(
                    "INSERT INTO wharf_schema_migrations (version, name, applied_at) \
                     VALUES (?1, 'from a newer build', 0)",
                    [newer],
                )?)
            })
            .await
            .unwrap();
        let refused = store
            .prune(&[KEYED], options(Duration::ZERO, true, 10))
            .await
            .unwrap_err();
        assert!(
            matches!(
                refused,
                StoreError::NewerSchema {
                    operation: "prune",
                    ..
                }
            ),
            "{refused}"
        );
    }

    #[test]
    fn a_rule_names_its_events_as_literals_on_each_backend() {
        assert_eq!(
            KEYED.eligible_sql(Backend::Postgres, "$1"),
            "SELECT e.position FROM events e WHERE e.aggregate_type = 'keyed' \
             AND e.event_type = 'Tried' AND e.recorded_at < $1 AND EXISTS (SELECT 1 FROM events n \
             WHERE n.aggregate_type = e.aggregate_type AND n.aggregate_id = e.aggregate_id \
             AND n.sequence > e.sequence AND n.payload->>'who' = e.payload->>'who')"
        );
        assert!(TYPED
            .eligible_sql(Backend::Sqlite, "?1")
            .ends_with("AND n.event_type IN ('Renewed', 'Ended'))"));
        assert!(KEYED
            .eligible_sql(Backend::Sqlite, "?1")
            .ends_with("json_extract(n.payload, '$.who') = json_extract(e.payload, '$.who'))"));
    }

    #[test]
    #[should_panic(expected = "ASCII letters, digits and _")]
    fn a_rule_refuses_a_name_that_is_not_a_plain_identifier() {
        let _ = Superseded::by_same_field("keyed", "Tried' OR '1'='1", "who");
    }
}
