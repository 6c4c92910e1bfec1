//! One connection the attempts of a store handle keep between them for a few milliseconds.
//!
//! sqlx 0.8 pings every connection on its way back into the pool (ADR 0051): one round trip and
//! a wake-up of a server process per pooled call. A register is one call, not a loop that could
//! keep its own connection as the claim loop does, so the store handle keeps the connection of
//! its last successful attempt in one slot: the next attempt takes it instead of one from the
//! pool, and one timer per handle hands it back to the pool once it has lain unused for
//! [`KeptConnection::LINGER`]. While attempts keep coming the timer stays, re-arming one sleep,
//! and outlives an attempt in flight on the connection it watches: no task, spawn or timer
//! registration per attempt (each was a cross-thread wake-up: `register_install` counted 0.35
//! event-fd writes and 0.8 extra futex calls per register when the timer ended whenever it
//! found the slot empty). Only a connection whose attempt succeeded is kept (no transaction open,
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

/// The kept connection with when it was kept, when it was last taken, and whether a timer is
/// watching it.
#[derive(Debug, Default)]
struct Slot {
    connection: Option<(PoolConnection<Postgres>, Instant)>,
    /// When an attempt last took the kept connection: until it keeps it again (or drops it),
    /// the attempt is in flight.
    taken_at: Option<Instant>,
    timer: bool,
}

/// What the timer does next, given the slot at `now`.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Look again at this time.
    WaitUntil(Instant),
    /// The kept connection lay unused for the linger: hand it back and end.
    Release,
    /// Nothing kept and nothing taken lately: end (the next keep starts another timer).
    End,
}

impl Slot {
    fn next(&self, now: Instant) -> Next {
        let linger = KeptConnection::LINGER;
        match (&self.connection, self.taken_at) {
            (Some((_, kept_at)), _) if *kept_at + linger <= now => Next::Release,
            (Some((_, kept_at)), _) => Next::WaitUntil(*kept_at + linger),
            (None, Some(taken_at)) if now < taken_at + linger => Next::WaitUntil(taken_at + linger),
            (None, _) => Next::End,
        }
    }
}

/// The slot, shared with its timer.
#[derive(Debug, Default)]
pub(super) struct KeptConnection(Arc<Mutex<Slot>>);

impl KeptConnection {
    /// How long an unused kept connection stays out of the pool.
    pub(super) const LINGER: Duration = Duration::from_millis(5);

    /// The kept connection, else one from `pool`.
    pub(super) async fn take(&self, pool: &PgPool) -> Result<PoolConnection<Postgres>, StoreError> {
        let kept = {
            let mut slot = lock(&self.0);
            let kept = slot.connection.take();
            if kept.is_some() {
                slot.taken_at = Some(Instant::now());
            }
            kept
        };
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
        let (replaced, start_timer) = {
            let mut slot = lock(&self.0);
            let replaced = slot.connection.replace((connection, Instant::now()));
            let start_timer = !std::mem::replace(&mut slot.timer, true);
            (replaced, start_timer)
        };
        // Spawned outside the lock: the new task may start at once on another thread, and
        // its first step is to take the lock.
        if start_timer {
            runtime.spawn(release_when_unused(Arc::clone(&self.0)));
        }
        drop(replaced);
    }
}

/// The slot's timer: hands the kept connection back once it has lain unused for the linger,
/// waits out an attempt in flight on it, and ends (saying so under the lock, so `keep` starts
/// another) once nothing was kept or taken for the linger. One sleep, reset each round.
async fn release_when_unused(slot: Arc<Mutex<Slot>>) {
    let sleep = tokio::time::sleep(KeptConnection::LINGER);
    tokio::pin!(sleep);
    loop {
        let (wait_until, released) = {
            let mut guard = lock(&slot);
            match guard.next(Instant::now()) {
                Next::WaitUntil(deadline) => (Some(deadline), None),
                Next::Release => {
                    guard.timer = false;
                    (None, guard.connection.take())
                }
                Next::End => {
                    guard.timer = false;
                    (None, None)
                }
            }
        };
        let Some(deadline) = wait_until else {
            // Back to the pool (its drop spawns the pool's return), outside the lock.
            drop(released);
            return;
        };
        sleep.as_mut().reset(deadline);
        sleep.as_mut().await;
    }
}

fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn an_attempt_in_flight_keeps_the_timer_until_the_linger_after_its_take() {
        let base = Instant::now();
        let slot = Slot {
            connection: None,
            taken_at: Some(base),
            timer: true,
        };
        assert_eq!(slot.next(at(base, 1)), Next::WaitUntil(at(base, 5)));
        assert_eq!(slot.next(at(base, 5)), Next::End);
    }

    #[test]
    fn an_empty_slot_never_taken_ends_the_timer() {
        let slot = Slot::default();
        assert_eq!(slot.next(Instant::now()), Next::End);
    }
}
