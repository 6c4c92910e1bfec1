//! The store layer's one error type.

/// Anything the event store or its projectors can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused or failed an operation. (The cause is shown in the message and not
    /// repeated as a `source`, so printing the chain names it once.)
    #[error("sqlite: {0}")]
    Sqlite(rusqlite::Error),
    /// Postgres refused or failed an operation.
    #[error("postgres: {0}")]
    Postgres(sqlx::Error),
    /// Another writer appended to the same aggregate first (optimistic concurrency).
    #[error("concurrent append to {aggregate_type}/{aggregate_id}: sequence {sequence} is taken")]
    Conflict {
        /// The aggregate's type.
        aggregate_type: String,
        /// The aggregate's id.
        aggregate_id: String,
        /// The sequence that was already taken.
        sequence: i64,
    },
    /// A projector failed; in an append transaction this rolled the events back.
    #[error("projector {projector} failed: {source}")]
    Projection {
        /// The projector's name.
        projector: &'static str,
        /// What went wrong.
        source: Box<StoreError>,
    },
    /// A stored row could not be turned back into a value.
    #[error("stored data at position {position} could not be decoded: {message}")]
    Decode {
        /// The event position (0 when not an event).
        position: i64,
        /// What was wrong.
        message: String,
    },
    /// The store URL or path is unusable.
    #[error("invalid store url {url:?}: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// Why it is refused.
        reason: String,
    },
    /// A connection setting is unusable.
    #[error("invalid {field} {value}: {reason}")]
    Setting {
        /// The setting.
        field: &'static str,
        /// Its value.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// The Postgres schema name is unusable.
    #[error("invalid store.schema {schema:?}: {reason}")]
    Schema {
        /// The schema name as given.
        schema: String,
        /// Why it is refused.
        reason: String,
    },
    /// A command that never creates a store found none where the configuration points.
    #[error(
        "no store at {location}: this command does not create one; \
         run `wharf migrate` (or `wharf serve`) to create and migrate it"
    )]
    Missing {
        /// The SQLite file or the Postgres schema looked for.
        location: String,
    },
    /// The schema was migrated by a newer build and this operation is not safe on it.
    #[error(
        "the database schema is at version {found}, newer than this build knows ({known}); \
         {operation} refuses to run on it: use a build that knows version {found}"
    )]
    NewerSchema {
        /// The version found.
        found: i64,
        /// The newest version this build knows.
        known: i64,
        /// What refused (`migrate`, `prune`, ...).
        operation: &'static str,
    },
    /// A newer build recorded that builds knowing only older versions must not even read.
    #[error(
        "the database schema is at version {found} and readable only by builds that know \
         version {readers_from} or newer; this build knows {known}"
    )]
    IncompatibleSchema {
        /// The version found.
        found: i64,
        /// The oldest version whose builds may read it (`wharf_schema_compat.readers_from`).
        readers_from: i64,
        /// The newest version this build knows.
        known: i64,
    },
    /// The schema is not migrated to what this build needs.
    #[error(
        "the database schema is at version {found}; this build needs {needed}: run `wharf migrate`"
    )]
    NotMigrated {
        /// The version found.
        found: i64,
        /// The version needed.
        needed: i64,
    },
    /// The locked executor's guard (say, a fencing token) did not hold: nothing was written.
    #[error("write to {aggregate_type} {aggregate_id} refused: {reason}")]
    GuardRefused {
        /// The aggregate's type.
        aggregate_type: &'static str,
        /// The aggregate's id.
        aggregate_id: String,
        /// Why the guard refused.
        reason: String,
    },
    /// A blocking store task panicked or was cancelled.
    #[error("store task failed: {0}")]
    Task(String),
    /// A value could not be serialized for storage.
    #[error("serialization failed: {0}")]
    Serialize(serde_json::Error),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sqlite(e)
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        Self::Postgres(e)
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        Self::Serialize(e)
    }
}

impl StoreError {
    /// Wraps a projector's failure with its name.
    pub fn in_projector(projector: &'static str, source: StoreError) -> Self {
        Self::Projection {
            projector,
            source: Box::new(source),
        }
    }

    /// A decode error for the event (or row) at `position`.
    pub fn decode(position: i64, message: impl std::fmt::Display) -> Self {
        Self::Decode {
            position,
            message: message.to_string(),
        }
    }

    /// True when the error says the store could not be reached at all (as opposed to refusing
    /// one statement): readiness uses this.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Postgres(e) => matches!(
                e,
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed
            ),
            Self::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => matches!(
                e.code,
                rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::DatabaseBusy
            ),
            Self::Projection { source, .. } => source.is_unavailable(),
            _ => false,
        }
    }
}
