//! Schema migrations, embedded in the binary from the workspace's `migrations/` folder.
//!
//! Each backend has its own numbered scripts; `wharf_schema_migrations` records which ran.
//! Each Postgres function has one source file, `migrations/postgres/functions/<name>.sql`,
//! which the newest migration that changed the function includes with a line
//! `-- include: functions/<name>.sql fnv1a64=<hash of the file>`; the build expands those
//! lines (`store/build.rs`), so a script here is whole SQL with no file read at run time. To
//! change a function, edit its file and include it from a new migration, leaving
//! `-- Superseded by functions/<name>.sql (ADR 0073).` where it was included (ADR 0073):
//! the build fails when a file no longer has the hash an older migration pinned.
//! Migrations are additive so that a rolled-back build keeps working on a newer schema
//! (ADR 0017), or, where they replace a table, leave a view that takes the older builds' reads
//! and writes of it (ADR 0064): a build reads and consumes on a schema newer than it knows,
//! unless the newer build recorded in `wharf_schema_compat.readers_from` that older builds must
//! not; it never migrates, prunes or rebuilds on one.

/// One embedded migration script.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Its number; scripts run in ascending order.
    pub version: i64,
    /// Its file name.
    pub name: &'static str,
    /// Its SQL.
    pub sql: &'static str,
}

macro_rules! migration {
    ($version:literal, $dir:literal, $file:literal) => {
        Migration {
            version: $version,
            name: $file,
            sql: include_str!(concat!(env!("OUT_DIR"), "/migrations/", $dir, "/", $file)),
        }
    };
}

/// The SQLite scripts.
pub const SQLITE: &[Migration] = &[
    migration!(1, "sqlite", "0001_event_store.sql"),
    migration!(2, "sqlite", "0002_declaration_projections.sql"),
    migration!(3, "sqlite", "0003_message_log.sql"),
    migration!(4, "sqlite", "0004_swap_applies.sql"),
    migration!(5, "sqlite", "0005_managed_sessions.sql"),
    migration!(6, "sqlite", "0006_listing_indexes.sql"),
    migration!(7, "sqlite", "0007_session_lease.sql"),
    migration!(8, "sqlite", "0008_group_snapshot.sql"),
    migration!(9, "sqlite", "0009_open_wait.sql"),
    migration!(10, "sqlite", "0010_group_snapshot_position.sql"),
    migration!(11, "sqlite", "0011_waiting_group.sql"),
    migration!(12, "sqlite", "0012_binding_rows_as_view.sql"),
];

/// The Postgres scripts.
pub const POSTGRES: &[Migration] = &[
    migration!(1, "postgres", "0001_event_store.sql"),
    migration!(2, "postgres", "0002_declaration_projections.sql"),
    migration!(3, "postgres", "0003_message_log.sql"),
    migration!(4, "postgres", "0004_group_version.sql"),
    migration!(5, "postgres", "0005_claim_floor.sql"),
    migration!(6, "postgres", "0006_swap_applies.sql"),
    migration!(7, "postgres", "0007_managed_sessions.sql"),
    migration!(8, "postgres", "0008_listing_indexes.sql"),
    migration!(9, "postgres", "0009_session_lease.sql"),
    migration!(10, "postgres", "0010_managed_filter_fillfactor.sql"),
    migration!(11, "postgres", "0011_expect_version.sql"),
    migration!(12, "postgres", "0012_group_snapshot.sql"),
    migration!(13, "postgres", "0013_claim_function.sql"),
    migration!(14, "postgres", "0014_event_payload_lz4.sql"),
    migration!(15, "postgres", "0015_listing_calls.sql"),
    migration!(16, "postgres", "0016_keyed_settle_calls.sql"),
    migration!(17, "postgres", "0017_open_wait.sql"),
    migration!(18, "postgres", "0018_group_snapshot_position.sql"),
    migration!(19, "postgres", "0019_claim_by_key.sql"),
    migration!(20, "postgres", "0020_expect_assumed.sql"),
    migration!(21, "postgres", "0021_claim_set_based.sql"),
    migration!(22, "postgres", "0022_listing_plans_once.sql"),
    migration!(23, "postgres", "0023_waiting_group.sql"),
    migration!(24, "postgres", "0024_waiting_page_one_walk.sql"),
    migration!(25, "postgres", "0025_key_columns_byte_order.sql"),
    migration!(26, "postgres", "0026_binding_rows_as_view.sql"),
    migration!(27, "postgres", "0027_group_view_as_rows.sql"),
    migration!(28, "postgres", "0028_lookups_end_at_their_key.sql"),
    migration!(29, "postgres", "0029_group_read_with_figures.sql"),
    migration!(30, "postgres", "0030_group_page_with_figures.sql"),
];

/// The schema version this build needs.
pub fn needed(scripts: &[Migration]) -> i64 {
    scripts.last().map_or(0, |m| m.version)
}

/// The table a newer build creates if one of its migrations is not additive: its one row's
/// `readers_from` is the oldest schema version whose builds may still read and consume.
pub const COMPAT_TABLE: &str = "wharf_schema_compat";

/// Whether a build that knows up to `known` may read a store at `found` whose compatibility
/// floor (`wharf_schema_compat.readers_from`, when the table exists) is `readers_from`.
pub fn check_readable(
    found: i64,
    known: i64,
    readers_from: Option<i64>,
) -> Result<(), crate::StoreError> {
    if found < known {
        return Err(crate::StoreError::NotMigrated {
            found,
            needed: known,
        });
    }
    match readers_from {
        Some(readers_from) if found > known && readers_from > known => {
            Err(crate::StoreError::IncompatibleSchema {
                found,
                readers_from,
                known,
            })
        }
        _ => Ok(()),
    }
}

/// A backend's statements for a migration run, inside its one transaction.
pub(crate) trait MigrationTx {
    /// Creates `wharf_schema_migrations` if it is missing.
    async fn ensure_ledger(&mut self) -> Result<(), crate::StoreError>;

    /// The newest version recorded (0 when none).
    async fn current(&mut self) -> Result<i64, crate::StoreError>;

    /// Runs `script` and records it.
    async fn run(&mut self, script: &'static Migration) -> Result<(), crate::StoreError>;
}

/// Applies every script of `scripts` newer than the store's version, in order, in the
/// caller's transaction; the names applied. Refuses a store a newer build migrated.
pub(crate) async fn apply<T: MigrationTx>(
    tx: &mut T,
    scripts: &'static [Migration],
) -> Result<Vec<&'static str>, crate::StoreError> {
    tx.ensure_ledger().await?;
    let current = tx.current().await?;
    let known = needed(scripts);
    if current > known {
        return Err(crate::StoreError::NewerSchema {
            found: current,
            known,
            operation: "migrate",
        });
    }
    // Chosen before the first await: an iterator held across one would make the future of a
    // backend whose statements wait lose `Send` for some borrows.
    let pending: Vec<&'static Migration> = scripts.iter().filter(|m| m.version > current).collect();
    let mut applied = Vec::with_capacity(pending.len());
    for script in pending {
        tx.run(script).await?;
        applied.push(script.name);
    }
    Ok(applied)
}

/// A backend's reads of what its schema is.
pub(crate) trait SchemaReads {
    /// The schema version recorded (0 when never migrated).
    async fn version(&self) -> Result<i64, crate::StoreError>;

    /// The compatibility floor a newer build recorded, if any ([`COMPAT_TABLE`]).
    async fn readers_from(&self) -> Result<Option<i64>, crate::StoreError>;
}

/// Fails with `NotMigrated` unless the schema is at least what this build needs of `scripts`;
/// a newer schema passes unless its build recorded a floor above this build ([`check_readable`]).
pub(crate) async fn ensure_readable<R: SchemaReads>(
    reads: &R,
    scripts: &'static [Migration],
) -> Result<(), crate::StoreError> {
    let found = reads.version().await?;
    let known = needed(scripts);
    let readers_from = if found > known {
        reads.readers_from().await?
    } else {
        None
    };
    check_readable(found, known, readers_from)
}
