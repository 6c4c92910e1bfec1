//! A store connection a claim loop keeps between its fetches while it is busy.
//!
//! Every connection handed back to the sqlx pool is pinged on its way back (sqlx 0.8 does so
//! unconditionally): one round trip, and a wake-up of the server process, per claim. Measured
//! on this project's machines, a plain claim-and-delete loop runs about a third faster on a
//! connection it keeps than through the pool (ADR 0051), and so does the runtime's claim loop.
//!
//! A [`HeldConnection`] is that kept connection: a claim statement takes it (or one from the
//! pool when none is held) and gives it back to the holder only when the statement succeeded
//! and nothing else of the fetch needs the pool. A claim future dropped half-way leaves the
//! statement and its connection to a task that runs it to its end (ADR 0068); the connection
//! then goes back to the pool, not to the holder. The holder releases it before anything
//! waits for long (see the runtime), so a held connection never stands between a small pool
//! and the rest of the process.
//!
//! On SQLite there is nothing to hold: the writer is one connection already.

use sqlx::pool::PoolConnection;
use sqlx::Postgres;

/// A connection kept between one claim loop's fetches (empty until the first claim on Postgres).
#[derive(Debug, Default)]
pub struct HeldConnection {
    postgres: Option<PoolConnection<Postgres>>,
}

impl HeldConnection {
    /// Whether a connection is held.
    pub fn is_held(&self) -> bool {
        self.postgres.is_some()
    }

    /// Hands the connection back to the pool (if one is held).
    pub fn release(&mut self) {
        self.postgres = None;
    }

    /// Takes the held connection, leaving none.
    pub(crate) fn take_postgres(&mut self) -> Option<PoolConnection<Postgres>> {
        self.postgres.take()
    }

    /// Keeps `connection` for the next claim.
    pub(crate) fn keep_postgres(&mut self, connection: PoolConnection<Postgres>) {
        self.postgres = Some(connection);
    }
}
