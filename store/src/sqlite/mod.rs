//! The SQLite backend: the embedded default (one process, zero setup).
//!
//! One writer connection serializes every write transaction (`BEGIN IMMEDIATE`), so the global
//! position is commit order and catch-up can page by position without skipping anything.
//! Readers use their own connections (WAL mode). All rusqlite calls run on tokio's blocking pool.
//! The store's clock is this process's clock in microseconds, kept monotonic; writes read it
//! under the writer lock, so their times follow commit order.

pub mod build_options;
mod events;
mod executor;
mod group;
mod rebuild;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};

use crate::error::StoreError;
use crate::event::from_micros;
use crate::migrate;
use crate::projector::SqliteProjector;
use crate::ready::run_ready;

pub use events::{
    append_in_tx, load_after_in_tx, load_in_tx, read_after_in_tx, read_range_in_tx, CATCH_UP_CHECK,
    EVENTS_IN_RANGE, QUERY_EVENTS,
};

/// A Wharf store in one SQLite file.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// Whether connections may create the file (false for [`SqliteStore::open_existing`]).
    create: bool,
    writer: Mutex<Writer>,
    readers: Mutex<Vec<Connection>>,
    projectors: Vec<Arc<dyn SqliteProjector>>,
    clock: Clock,
}

/// The writer connection.
struct Writer {
    conn: Connection,
}

/// The store's clock: the process clock in microseconds (what SQLite stores), never repeating
/// or going backwards across calls. A write reads it under the writer lock, so its times are
/// in commit order; a read (`now`) needs no lock at all.
struct Clock {
    last_micros: AtomicI64,
}

impl Clock {
    fn tick(&self) -> DateTime<Utc> {
        let wall = Utc::now().timestamp_micros();
        let mut last = self.last_micros.load(Ordering::SeqCst);
        loop {
            let next = wall.max(last.saturating_add(1));
            match self
                .last_micros
                .compare_exchange(last, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return from_micros(next),
                Err(seen) => last = seen,
            }
        }
    }
}

/// What a write closure gets: the transaction, the store's time, and the inline projectors.
pub struct WriteCtx<'a> {
    /// The open `BEGIN IMMEDIATE` transaction.
    pub tx: &'a Transaction<'a>,
    /// The store's time for this transaction.
    pub now: DateTime<Utc>,
    /// The inline projectors to run on appended events.
    pub projectors: &'a [Arc<dyn SqliteProjector>],
}

impl SqliteStore {
    /// Opens (creating if needed) the SQLite file at `path` with the given inline projectors.
    /// Does not migrate: call [`SqliteStore::migrate`] or [`SqliteStore::ensure_migrated`].
    pub async fn open(
        path: impl AsRef<Path>,
        projectors: Vec<Arc<dyn SqliteProjector>>,
    ) -> Result<Self, StoreError> {
        Self::open_with(path.as_ref(), projectors, true).await
    }

    /// Opens the SQLite file at `path` only if it exists: fails with [`StoreError::Missing`]
    /// otherwise and never creates it. Commands that must not create a store use this.
    pub async fn open_existing(
        path: impl AsRef<Path>,
        projectors: Vec<Arc<dyn SqliteProjector>>,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(StoreError::Missing {
                location: format!("SQLite file {}", path.display()),
            });
        }
        Self::open_with(path, projectors, false).await
    }

    async fn open_with(
        path: &Path,
        projectors: Vec<Arc<dyn SqliteProjector>>,
        create: bool,
    ) -> Result<Self, StoreError> {
        let path = path.to_path_buf();
        let conn = blocking({
            let path = path.clone();
            move || {
                let conn = open_connection(&path, create)?;
                build_options::warn_once_if_contended(&conn);
                Ok(conn)
            }
        })
        .await?;
        Ok(Self {
            inner: Arc::new(Inner {
                path,
                create,
                writer: Mutex::new(Writer { conn }),
                readers: Mutex::new(Vec::new()),
                projectors,
                clock: Clock {
                    last_micros: AtomicI64::new(i64::MIN),
                },
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The inline projectors this store runs on every append.
    pub fn projectors(&self) -> &[Arc<dyn SqliteProjector>] {
        &self.inner.projectors
    }

    /// Applies every migration not yet applied; returns the names applied now.
    pub async fn migrate(&self) -> Result<Vec<&'static str>, StoreError> {
        self.write(|ctx| {
            let mut tx = SqliteMigration {
                tx: ctx.tx,
                now: ctx.now.timestamp_micros(),
            };
            run_ready(migrate::apply(&mut tx, migrate::SQLITE))
        })
        .await
    }

    /// The schema version recorded in the file (0 when never migrated).
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        self.read(|conn| {
            if !table_exists(conn, "wharf_schema_migrations")? {
                return Ok(0);
            }
            Ok(conn.query_row(
                "SELECT COALESCE(MAX(version), 0) FROM wharf_schema_migrations",
                [],
                |row| row.get(0),
            )?)
        })
        .await
    }

    /// Fails with [`StoreError::NotMigrated`] unless the schema is at least what this build
    /// needs; a newer schema passes unless its build recorded a compatibility floor above this
    /// build ([`migrate::check_readable`]).
    pub async fn ensure_migrated(&self) -> Result<(), StoreError> {
        migrate::ensure_readable(self, migrate::SQLITE).await
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction on the writer; commits when it returns `Ok`.
    pub async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&WriteCtx<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        self.write_or_rollback(|ctx| f(ctx).map(|value| (value, true)))
            .await
    }

    /// Like [`SqliteStore::write`], but the closure decides whether to commit: it returns the
    /// value and `true` to commit, `false` to roll back.
    pub async fn write_or_rollback<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&WriteCtx<'_>) -> Result<(T, bool), StoreError> + Send + 'static,
    {
        let inner = self.inner.clone();
        blocking(move || {
            let mut writer = lock(&inner.writer);
            let now = inner.clock.tick();
            let tx = writer
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let ctx = WriteCtx {
                tx: &tx,
                now,
                projectors: &inner.projectors,
            };
            let (value, commit) = f(&ctx)?;
            if commit {
                tx.commit()?;
            } else {
                tx.rollback()?;
            }
            Ok(value)
        })
        .await
    }

    /// Runs `f` on a reader connection (a consistent snapshot for the duration of one statement,
    /// or of an explicit transaction the closure opens).
    pub async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let inner = self.inner.clone();
        blocking(move || {
            let pooled = lock(&inner.readers).pop();
            let mut conn = match pooled {
                Some(conn) => conn,
                None => open_connection(&inner.path, inner.create)?,
            };
            let result = f(&mut conn);
            lock(&inner.readers).push(conn);
            result
        })
        .await
    }

    /// The store's current time.
    pub async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        Ok(self.inner.clock.tick())
    }
}

/// Whether the file has a table or view named `name`.
fn table_exists(conn: &Connection, name: &str) -> Result<bool, StoreError> {
    Ok(conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = ?1)",
        [name],
        |row| row.get(0),
    )?)
}

/// A migration run's statements on the writer's transaction, at the store's time `now`.
struct SqliteMigration<'a, 't> {
    tx: &'a rusqlite::Transaction<'t>,
    now: i64,
}

impl migrate::MigrationTx for SqliteMigration<'_, '_> {
    async fn ensure_ledger(&mut self) -> Result<(), StoreError> {
        self.tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS wharf_schema_migrations (
                 version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
        )?;
        Ok(())
    }

    async fn current(&mut self) -> Result<i64, StoreError> {
        Ok(self.tx.query_row(
            "SELECT COALESCE(MAX(version), 0) FROM wharf_schema_migrations",
            [],
            |row| row.get(0),
        )?)
    }

    async fn run(&mut self, script: &'static migrate::Migration) -> Result<(), StoreError> {
        self.tx.execute_batch(script.sql)?;
        self.tx.execute(
            "INSERT INTO wharf_schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
            rusqlite::params![script.version, script.name, self.now],
        )?;
        Ok(())
    }
}

impl migrate::SchemaReads for SqliteStore {
    async fn version(&self) -> Result<i64, StoreError> {
        self.schema_version().await
    }

    async fn readers_from(&self) -> Result<Option<i64>, StoreError> {
        self.read(|conn| {
            if !table_exists(conn, migrate::COMPAT_TABLE)? {
                return Ok(None);
            }
            let sql = format!("SELECT MAX(readers_from) FROM {}", migrate::COMPAT_TABLE);
            Ok(conn.query_row(&sql, [], |row| row.get(0))?)
        })
        .await
    }
}

fn open_connection(path: &Path, create: bool) -> Result<Connection, StoreError> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let conn = Connection::open_with_flags(path, flags)?;
    // The busy timeout first: switching a new file to WAL takes the file's write lock, and
    // several processes opening one file at once must wait for each other, not fail.
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    // WAL lets readers proceed beside the writer; FULL makes every commit durable (fsync).
    switch_to_wal(&conn)?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Room for every statement the writer runs (declarations, queue, retention) to stay
    // compiled; rusqlite's default of 16 would evict hot-path statements.
    conn.set_prepared_statement_cache_capacity(128);
    Ok(conn)
}

/// Switches the file to WAL. On a new file, connections of several processes opening it at
/// once each hold a read lock while asking for the write lock the switch needs; SQLite answers
/// one of them "busy" at once rather than let them deadlock, without calling the busy handler.
/// That connection retries (for as long as the busy timeout) once the other has switched.
fn switch_to_wal(conn: &Connection) -> Result<(), StoreError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return Ok(other?),
        }
    }
}

/// What `PRAGMA quick_check` found in a SQLite file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuickCheck {
    /// The check finished and found nothing wrong.
    Ok,
    /// The check found damage; the first problems it reported.
    Corrupt(Vec<String>),
    /// The check did not finish within its time budget.
    Unfinished,
}

/// Runs `PRAGMA quick_check` (at most 10 problems reported) on the existing file at `path` on a
/// connection of its own, interrupted after `budget`. `quick_check` reads every page of the
/// file but skips the index-to-table cross checks of `integrity_check`, so it is linear in
/// the file size. A file too damaged to open counts as corrupt.
pub async fn quick_check(
    path: &Path,
    budget: std::time::Duration,
) -> Result<QuickCheck, StoreError> {
    let path = path.to_path_buf();
    blocking(move || {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = match Connection::open_with_flags(&path, flags) {
            Ok(conn) => conn,
            Err(e) if is_corruption(&e) => return Ok(QuickCheck::Corrupt(vec![e.to_string()])),
            Err(e) => return Err(e.into()),
        };
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        // A watchdog interrupts the check when the budget runs out; finishing first drops
        // the sender, which ends the watchdog at once.
        let interrupt = conn.get_interrupt_handle();
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(budget) {
                interrupt.interrupt();
            }
        });
        let rows = conn
            .prepare("PRAGMA quick_check(10)")
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| row.get::<_, String>(0))?
                    .collect::<Result<Vec<String>, _>>()
            });
        drop(done);
        let _ = watchdog.join();
        match rows {
            Ok(rows) if rows == ["ok"] => Ok(QuickCheck::Ok),
            Ok(rows) => Ok(QuickCheck::Corrupt(rows)),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::OperationInterrupted =>
            {
                Ok(QuickCheck::Unfinished)
            }
            Err(e) if is_corruption(&e) => Ok(QuickCheck::Corrupt(vec![e.to_string()])),
            Err(e) => Err(e.into()),
        }
    })
    .await
}

fn is_corruption(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(failure, _)
            if matches!(
                failure.code,
                rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase
            )
    )
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock left no half-written transaction behind (rusqlite rolls
    // back on drop), so the connection is still usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn blocking<T, F>(f: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
}
