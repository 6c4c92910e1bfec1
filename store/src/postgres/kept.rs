//! One connection the attempts of a store handle keep between them for a few milliseconds.
//!
//! sqlx 0.8 pings every connection on its way back into the pool (ADR 0051): one round trip and
//! a wake-up of a server process per pooled call. A register is one call, not a loop that could
//! keep its own connection as the claim loop does, so the store handle keeps the connection of
//! its last successful attempt in one slot: the next attempt takes it instead of one from the
//! pool, and one timer per handle hands it back to the pool once it has lain unused for
//! [`KeptConnection::LINGER`] (while attempts keep coming, the timer re-arms itself: no task
//! per attempt). Only a connection whose attempt succeeded is kept (no transaction open,
//! nothing half read); a dropped or failed attempt drops its connection, and the pool's check
//! on release decides whether it serves again. A connection is not kept when the pool has no
//! other one to hand out and cannot open one, so nothing else in the process ever waits behind
//! the slot.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::time::Instant;

use crate::error::StoreError;

/// The kept connection with when it was kept, and whether a timer is watching it.
#[derive(Debug, Default)]
struct Slot {
    connection: Option<(PoolConnection<Postgres>, Instant)>,
    timer: bool,
}

/// The slot, shared with its timer.
#[derive(Debug, Default)]
pub(super) struct KeptConnection(Arc<Mutex<Slot>>);

impl KeptConnection {
    /// How long an unused kept connection stays out of the pool.
    pub(super) const LINGER: Duration = Duration::from_millis(5);

    /// The kept connection, else one from `pool`.
    pub(super) async fn take(&self, pool: &PgPool) -> Result<PoolConnection<Postgres>, StoreError> {
        let kept = lock(&self.0).connection.take();
        match kept {
            Some((connection, _)) => Ok(connection),
            None => Ok(pool.acquire().await?),
        }
    }

    /// Keeps `connection` (whose attempt succeeded) for the next attempt, unless the pool could
    /// not serve anyone else without it; a connection already kept goes back to the pool.
    pub(super) fn keep(&self, pool: &PgPool, connection: PoolConnection<Postgres>) {
        let spare = pool.num_idle() > 0 || pool.size() < pool.options().get_max_connections();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !spare {
            return;
        }
        let replaced = {
            let mut slot = lock(&self.0);
            let replaced = slot.connection.replace((connection, Instant::now()));
            if !slot.timer {
                slot.timer = true;
                runtime.spawn(release_when_unused(Arc::clone(&self.0)));
            }
            replaced
        };
        drop(replaced);
    }
}

/// The slot's timer: sleeps until the kept connection has lain unused for the linger, then
/// hands it back; a connection kept again meanwhile moves the deadline. Ends (and says so
/// under the lock, so `keep` starts another) when the slot is empty or handed back.
async fn release_when_unused(slot: Arc<Mutex<Slot>>) {
    loop {
        let deadline = {
            let mut guard = lock(&slot);
            match &guard.connection {
                Some((_, kept_at)) => *kept_at + KeptConnection::LINGER,
                None => {
                    guard.timer = false;
                    return;
                }
            }
        };
        tokio::time::sleep_until(deadline).await;
        let released = {
            let mut guard = lock(&slot);
            let unused = matches!(&guard.connection,
                Some((_, kept_at)) if *kept_at + KeptConnection::LINGER <= Instant::now());
            if !unused {
                continue;
            }
            guard.timer = false;
            guard.connection.take()
        };
        // Back to the pool (its drop spawns the pool's return), outside the lock.
        drop(released);
        return;
    }
}

fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    slot.lock().unwrap_or_else(|p| p.into_inner())
}
