//! The Postgres backend: cluster mode, many Wharf processes on many machines sharing one
//! database.
//!
//! Appends serialize on a transaction-scoped advisory lock taken just before the first event
//! insert and held to commit, so a smaller position can never become visible after a larger one:
//! catch-up that pages by `position > checkpoint` cannot skip an event that committed late
//! (ADR 0002). The lock key is derived from the schema, so several Wharf schemas in one database
//! do not contend. The store's clock is the database's `clock_timestamp()`.

mod clock;
mod events;
mod executor;
mod group;
mod kept;
mod optimistic;
mod rebuild;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Executor, PgConnection, PgPool};

use crate::error::StoreError;
use crate::migrate;
use crate::projector::PgProjector;

pub use events::{
    append_in_tx, load_in_tx, lock_appends, read_after_in_tx, read_range_in_tx, CATCH_UP_CHECK,
    EVENTS_IN_RANGE, QUERY_EVENTS,
};
pub use optimistic::snapshot_read_statement;

/// How a Postgres store connects.
#[derive(Debug, Clone)]
pub struct PgSettings {
    /// The connection URL (`postgres://...`).
    pub url: String,
    /// The schema Wharf's tables live in (`search_path`); `None` keeps the server default.
    pub schema: Option<String>,
    /// The most connections this process holds.
    pub max_connections: u32,
    /// How long to wait for a connection before failing.
    pub acquire_timeout: Duration,
}

impl PgSettings {
    /// Settings for `url` with defaults for the rest.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: None,
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
        }
    }
}

/// A Wharf store in a Postgres database.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    /// How to open connections outside the pool: for a `LISTEN`, held for as long as a
    /// listener runs, which must not take one of `max_connections` (with a pool of one it
    /// would take them all), and for a pool of a caller's own (`with_own_pool`).
    listen: Arc<ListenSettings>,
    projectors: Arc<Vec<Arc<dyn PgProjector>>>,
    /// The store's clock as this process last heard it, shared by the handle's clones: what a
    /// speculative attempt times its decision with (ADR 0052).
    clock: Arc<clock::StoreClock>,
    /// The connection of the handle's last successful attempt, kept for the next one for a few
    /// milliseconds (no return ping between registers; ADR 0052).
    kept: Arc<kept::KeptConnection>,
}

/// What [`PgStore::listen_pool`] opens its pools with: the store's own URL, options and schema.
struct ListenSettings {
    options: PgConnectOptions,
    schema: Option<String>,
    acquire_timeout: Duration,
}

/// A pooled connection idle at least this long is pinged before it is handed out.
const IDLE_BEFORE_PING: std::time::Duration = std::time::Duration::from_secs(1);

/// A lazily connecting pool of up to `max_connections` on `options`: no ping on checkout unless
/// idle for [`IDLE_BEFORE_PING`], and `search_path` set to `schema` on every new connection.
fn build_pool(
    options: PgConnectOptions,
    schema: Option<String>,
    max_connections: u32,
    acquire_timeout: Duration,
) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        // sqlx pings every connection it hands out by default: one round trip more on
        // every transaction. Only a connection idle for a while (one a server restart or a
        // network timeout may have cut) is checked; one in steady use fails its statement
        // and is dropped instead, and every caller retries a failed store call.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= IDLE_BEFORE_PING {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .after_connect(move |conn, _| {
            let schema = schema.clone();
            Box::pin(async move {
                if let Some(schema) = schema {
                    conn.execute(format!("SET search_path TO \"{schema}\"").as_str())
                        .await?;
                }
                Ok(())
            })
        })
        .connect_lazy_with(options)
}

impl PgStore {
    /// Connects (lazily: the first use dials) with the given inline projectors.
    pub fn connect(
        settings: &PgSettings,
        projectors: Vec<Arc<dyn PgProjector>>,
    ) -> Result<Self, StoreError> {
        let options: PgConnectOptions =
            settings
                .url
                .parse()
                .map_err(|e: sqlx::Error| StoreError::Url {
                    url: redact(&settings.url),
                    reason: e.to_string(),
                })?;
        if settings.max_connections == 0 {
            return Err(StoreError::Setting {
                field: "max_connections",
                value: settings.max_connections.to_string(),
                reason: "a pool needs at least 1 connection".into(),
            });
        }
        // Sessions show as `wharf` in `pg_stat_activity` unless the URL names them
        // (`application_name=...`, to tell services or processes apart).
        let options = match options.get_application_name() {
            Some(_) => options,
            None => options.application_name("wharf"),
        };
        // No JIT compilation in Wharf's sessions (ADR 0047): every statement it sends is a
        // short keyed read or write, and on stale statistics the planner's estimates passed
        // `jit_above_cost` and compiled a 2-4 ms statement for about 30 ms on every call. Set
        // as a startup option, after any the URL gives.
        let options = options.options([("jit", "off")]);
        let schema = settings.schema.clone();
        if let Some(schema) = &schema {
            check_schema_name(schema)?;
        }
        let pool = build_pool(
            options.clone(),
            schema.clone(),
            settings.max_connections,
            settings.acquire_timeout,
        );
        let listen = Arc::new(ListenSettings {
            options,
            schema,
            acquire_timeout: settings.acquire_timeout,
        });
        Ok(Self {
            pool,
            listen,
            projectors: Arc::new(projectors),
            clock: Arc::default(),
            kept: Arc::default(),
        })
    }

    /// The connection pool, for read models and tools that query the store directly.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A new pool of one connection beside [`pool`](Self::pool), for one `LISTEN` that holds
    /// its connection for as long as it runs (same URL, same schema). Each call opens a pool of
    /// its own (lazily: the first use dials), so listeners of several `Wharf`s on clones of one
    /// store never wait for each other's connection.
    pub fn listen_pool(&self) -> PgPool {
        let listen = &self.listen;
        build_pool(
            listen.options.clone(),
            listen.schema.clone(),
            1,
            listen.acquire_timeout,
        )
    }

    /// A handle on the same store over a pool of its own: at most `max_connections` (at least
    /// one), each waited for as long as the store's (at most `timeout`), and every statement
    /// on them cancelled by the server after `timeout` (`statement_timeout`). For a caller
    /// that bounds its reads where they run, apart from the claim loops and routers on
    /// [`pool`](Self::pool): the API (ADR 0067). A read its caller gave up on ends in the
    /// database too, and gives its connection back, instead of holding it until whatever
    /// blocks it goes.
    pub fn with_own_pool(&self, max_connections: u32, timeout: Duration) -> Self {
        let millis = timeout.as_millis().clamp(1, i32::MAX as u128);
        let options = self
            .listen
            .options
            .clone()
            .options([("statement_timeout", millis.to_string())]);
        Self {
            pool: build_pool(
                options,
                self.listen.schema.clone(),
                max_connections.max(1),
                self.listen.acquire_timeout.min(timeout),
            ),
            listen: self.listen.clone(),
            projectors: self.projectors.clone(),
            clock: self.clock.clone(),
            kept: Arc::default(),
        }
    }

    /// The inline projectors this store runs on every append.
    pub fn projectors(&self) -> &[Arc<dyn PgProjector>] {
        &self.projectors
    }

    /// Applies every migration not yet applied, serialized across processes by an advisory
    /// lock; returns the names applied now.
    pub async fn migrate(&self) -> Result<Vec<&'static str>, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':wharf.migrate'))")
            .execute(&mut *tx)
            .await?;
        let applied = migrate::apply(&mut PgMigration(&mut tx), migrate::POSTGRES).await?;
        tx.commit().await?;
        Ok(applied)
    }

    /// The schema version recorded in the database (0 when never migrated).
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        if !self.table_exists("wharf_schema_migrations").await? {
            return Ok(0);
        }
        Ok(
            sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM wharf_schema_migrations")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// Fails with [`StoreError::NotMigrated`] unless the schema is at least what this build
    /// needs; a newer schema passes unless its build recorded a compatibility floor above this
    /// build ([`migrate::check_readable`]).
    pub async fn ensure_migrated(&self) -> Result<(), StoreError> {
        migrate::ensure_readable(self, migrate::POSTGRES).await
    }

    /// Whether the schema has a table named `name`.
    async fn table_exists(&self, name: &str) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(name)
            .fetch_one(&self.pool)
            .await?)
    }

    /// The store's current time.
    pub async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        Ok(sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&self.pool)
            .await?)
    }

    /// Dials the server once, directly, and creates the schema named in `settings` if it does
    /// not exist. Start-up calls this so an unreachable server fails at once with the dial
    /// error, instead of after the pool's acquire timeout.
    ///
    /// `CREATE SCHEMA IF NOT EXISTS` is not safe under concurrency (two sessions can both see
    /// no schema and one fails on `pg_namespace`'s unique index), so any number of processes
    /// starting together serialize on a session advisory lock with a fixed key, taken on this
    /// dedicated connection before anything is created and released when it closes.
    pub async fn create_schema(settings: &PgSettings) -> Result<(), StoreError> {
        let Some(schema) = &settings.schema else {
            let _conn: PgConnection = sqlx::Connection::connect(&settings.url).await?;
            return Ok(());
        };
        check_schema_name(schema)?;
        let mut conn: PgConnection = sqlx::Connection::connect(&settings.url).await?;
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(CREATE_SCHEMA_LOCK)
            .execute(&mut conn)
            .await?;
        let created = conn
            .execute(format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"").as_str())
            .await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(CREATE_SCHEMA_LOCK)
            .execute(&mut conn)
            .await;
        let _ = sqlx::Connection::close(conn).await;
        created?;
        unlocked?;
        Ok(())
    }

    /// Dials the server once, directly, and fails with [`StoreError::Missing`] when the schema
    /// named in `settings` does not exist. Commands that never create a store call this
    /// instead of [`PgStore::create_schema`].
    pub async fn require_schema(settings: &PgSettings) -> Result<(), StoreError> {
        let mut conn: PgConnection = sqlx::Connection::connect(&settings.url).await?;
        let Some(schema) = &settings.schema else {
            return Ok(());
        };
        check_schema_name(schema)?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                .bind(schema)
                .fetch_one(&mut conn)
                .await?;
        let _ = sqlx::Connection::close(conn).await;
        if exists {
            Ok(())
        } else {
            Err(StoreError::Missing {
                location: format!("Postgres schema \"{schema}\" ({})", redact(&settings.url)),
            })
        }
    }
}

/// The session advisory lock every process takes before creating a schema: a fixed key, so
/// processes naming different schemas also serialize (creating a schema takes milliseconds).
/// The value spells "wharfSCH" in ASCII.
const CREATE_SCHEMA_LOCK: i64 = 0x7768_6172_6653_4348;

/// A migration run's statements on its transaction (the advisory lock held).
struct PgMigration<'c>(&'c mut PgConnection);

impl migrate::MigrationTx for PgMigration<'_> {
    async fn ensure_ledger(&mut self) -> Result<(), StoreError> {
        self.0
            .execute(
                "CREATE TABLE IF NOT EXISTS wharf_schema_migrations (
                     version BIGINT PRIMARY KEY, name TEXT NOT NULL,
                     applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
            )
            .await?;
        Ok(())
    }

    async fn current(&mut self) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM wharf_schema_migrations")
                .fetch_one(&mut *self.0)
                .await?,
        )
    }

    async fn run(&mut self, script: &'static migrate::Migration) -> Result<(), StoreError> {
        // A script is several statements: sent as one simple query, as `raw_sql` would, through
        // the executor's boxed future (`raw_sql`'s own would lose `Send` for some borrows).
        self.0.execute(script.sql).await?;
        sqlx::query("INSERT INTO wharf_schema_migrations (version, name) VALUES ($1, $2)")
            .bind(script.version)
            .bind(script.name)
            .execute(&mut *self.0)
            .await?;
        Ok(())
    }
}

impl migrate::SchemaReads for PgStore {
    async fn version(&self) -> Result<i64, StoreError> {
        self.schema_version().await
    }

    async fn readers_from(&self) -> Result<Option<i64>, StoreError> {
        if !self.table_exists(migrate::COMPAT_TABLE).await? {
            return Ok(None);
        }
        let sql = format!("SELECT MAX(readers_from) FROM {}", migrate::COMPAT_TABLE);
        Ok(sqlx::query_scalar(&sql).fetch_one(&self.pool).await?)
    }
}

/// Checks a Postgres schema name: 1 to 63 ASCII letters, digits or `_` (so it can be quoted
/// into statements safely). Digits alone (`2024`) are a valid name.
pub fn check_schema_name(schema: &str) -> Result<(), StoreError> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Schema {
            schema: schema.to_owned(),
            reason: "a schema name must be 1 to 63 ASCII letters, digits or '_'".into(),
        })
    }
}

/// The URL with any password replaced, for error messages and logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &userinfo[..colon],
                    &url[at..]
                ),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// The futures whose logic is written once over a dialect trait stay `Send` for any borrow of
/// the store, so callers can box them (an async trait, a spawned task): a dialect's `async fn`
/// in a trait can lose that, and only a build notices.
#[cfg(test)]
#[allow(dead_code)]
mod futures_stay_send {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;

    use super::PgStore;
    use crate::{PgProjector, StoreError};

    type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

    fn catch_up(store: &PgStore, projector: Arc<dyn PgProjector>) -> Boxed<'_, u64> {
        Box::pin(async move { store.catch_up(projector, 1).await })
    }

    fn migrate(store: &PgStore) -> Boxed<'_, Vec<&'static str>> {
        Box::pin(async move { store.migrate().await })
    }

    fn ensure_migrated(store: &PgStore) -> Boxed<'_, ()> {
        Box::pin(async move { store.ensure_migrated().await })
    }

    fn rebuild(
        store: &PgStore,
        projectors: Vec<Arc<dyn PgProjector>>,
        progress: crate::Progress,
    ) -> Boxed<'_, crate::RebuildReport> {
        Box::pin(async move {
            store
                .rebuild(projectors, crate::RebuildMode::Verify, progress)
                .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_of_no_connections_is_refused_not_a_panic() {
        let settings = PgSettings {
            max_connections: 0,
            ..PgSettings::new("postgres://postgres@127.0.0.1:1/test")
        };
        let refused = PgStore::connect(&settings, Vec::new()).err();
        let message = refused.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains("max_connections") && message.contains('0'),
            "{message}"
        );
    }
}
