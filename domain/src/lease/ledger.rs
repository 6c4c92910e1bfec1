//! The lease ledger: one aggregate per durable session identity (`session_lease`), judged by
//! the store's clock.
//!
//! Rules (issue 10, point 1):
//! - **Acquire** only when the lease is free or expired at the store's `now`; an expired owner
//!   is recorded as `Expired` first. Every acquire is a change of owner and takes the next
//!   fencing token (the largest token ever issued, plus one), so a token is never reused and
//!   never decreases, even across releases and expiries.
//! - **Renew** only by the current holder with the current token strictly before the expiry:
//!   the expiry becomes `now + ttl`. A renew that cannot change anything (no owner, another
//!   holder, another token, already expired) is a definitive `Lost`, appended for audit; an
//!   expired claim is recorded as `Expired` first.
//! - **Release** only by the current holder with the current token before the expiry; any
//!   other release is refused with the reason ([`LeaseError::StaleRelease`]) and appends nothing.
//! - **ObserveExpiry** appends `Expired` when the owner's expiry has passed, nothing otherwise.
//! - [`fence`] says whether a write on behalf of (holder, token) may land at `now`: exactly the
//!   condition the store's guard checks in the write's own statement.
//!
//! Stored events: `DomainEvent::event_type` names the variant and the payload is its fields as
//! a JSON object. `Released` and `Expired` have the same fields, so decode a stored event with
//! [`LeaseEvent::decode`], which reads the type.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use cqrs_es::event_sink::EventSink;
use cqrs_es::{Aggregate, DomainEvent};
use serde::{Deserialize, Serialize};

use super::types::{FenceError, FencingToken, LeaseHolder, Staleness};

/// The aggregate type name under which lease events are stored.
pub const LEASE_AGGREGATE: &str = "session_lease";

/// The longest TTL a lease may be acquired for: one day.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// One event of a lease's ledger. Times are the store's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
pub enum LeaseEvent {
    /// `holder` became the owner with a new `token`, until `expires_at`.
    Acquired {
        /// The new owner.
        holder: LeaseHolder,
        /// Its fencing token (one more than any token before).
        token: FencingToken,
        /// The TTL every renew of this ownership extends by, in milliseconds.
        ttl_ms: u64,
        /// When the ownership lapses unless renewed.
        expires_at: DateTime<Utc>,
    },
    /// The owner renewed: its ownership now lapses at `expires_at`.
    Renewed {
        /// The owner.
        holder: LeaseHolder,
        /// Its token (unchanged).
        token: FencingToken,
        /// The new expiry.
        expires_at: DateTime<Utc>,
    },
    /// The owner gave the lease up.
    Released {
        /// The former owner.
        holder: LeaseHolder,
        /// Its token.
        token: FencingToken,
    },
    /// A renew on behalf of (holder, token) found the claim stale: a definitive loss.
    Lost {
        /// The claimed holder.
        holder: LeaseHolder,
        /// The claimed token.
        token: FencingToken,
        /// Why the claim did not hold.
        reason: Staleness,
    },
    /// The owner's expiry was observed to have passed: the lease is free.
    Expired {
        /// The former owner.
        holder: LeaseHolder,
        /// Its token.
        token: FencingToken,
    },
}

/// Event type names, as stored.
pub mod event_types {
    /// [`super::LeaseEvent::Acquired`].
    pub const ACQUIRED: &str = "LeaseAcquired";
    /// [`super::LeaseEvent::Renewed`].
    pub const RENEWED: &str = "LeaseRenewed";
    /// [`super::LeaseEvent::Released`].
    pub const RELEASED: &str = "LeaseReleased";
    /// [`super::LeaseEvent::Lost`].
    pub const LOST: &str = "LeaseLost";
    /// [`super::LeaseEvent::Expired`].
    pub const EXPIRED: &str = "LeaseExpired";
}

impl LeaseEvent {
    /// Decodes a stored event from its type name and payload (the variant's fields, as JSON
    /// text).
    pub fn decode(event_type: &str, payload: &str) -> Result<Self, serde_json::Error> {
        use serde::de::Error as _;
        let known = [
            event_types::ACQUIRED,
            event_types::RENEWED,
            event_types::RELEASED,
            event_types::LOST,
            event_types::EXPIRED,
        ];
        if !known.contains(&event_type) {
            return Err(serde_json::Error::custom(format!(
                "unknown lease event type \"{event_type}\""
            )));
        }
        let event = match serde_json::from_str::<Self>(payload)? {
            Self::Released { holder, token } if event_type == event_types::EXPIRED => {
                Self::Expired { holder, token }
            }
            other => other,
        };
        if event.event_type() != event_type {
            return Err(serde_json::Error::custom(format!(
                "payload of a \"{event_type}\" event has the fields of \"{}\"",
                event.event_type()
            )));
        }
        Ok(event)
    }

    /// The holder the event is about.
    pub fn holder(&self) -> &LeaseHolder {
        match self {
            Self::Acquired { holder, .. }
            | Self::Renewed { holder, .. }
            | Self::Released { holder, .. }
            | Self::Lost { holder, .. }
            | Self::Expired { holder, .. } => holder,
        }
    }

    /// The token the event is about.
    pub fn token(&self) -> FencingToken {
        match self {
            Self::Acquired { token, .. }
            | Self::Renewed { token, .. }
            | Self::Released { token, .. }
            | Self::Lost { token, .. }
            | Self::Expired { token, .. } => *token,
        }
    }
}

impl DomainEvent for LeaseEvent {
    fn event_type(&self) -> String {
        match self {
            Self::Acquired { .. } => event_types::ACQUIRED,
            Self::Renewed { .. } => event_types::RENEWED,
            Self::Released { .. } => event_types::RELEASED,
            Self::Lost { .. } => event_types::LOST,
            Self::Expired { .. } => event_types::EXPIRED,
        }
        .into()
    }

    fn event_version(&self) -> String {
        "1.0".into()
    }
}

/// The current ownership of a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ownership {
    /// The owner.
    pub holder: LeaseHolder,
    /// Its fencing token.
    pub token: FencingToken,
    /// The TTL each renew extends by, in milliseconds.
    pub ttl_ms: u64,
    /// When the ownership lapses unless renewed (store time).
    pub expires_at: DateTime<Utc>,
}

/// The lease of one durable session identity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The owner, if any (an expired owner stays here until its expiry is observed).
    pub owner: Option<Ownership>,
    /// The largest token ever issued (0 before the first acquire).
    pub last_token: FencingToken,
}

/// A command to a lease. `now` is the store's time for the transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseCommand {
    /// Become the owner for `ttl` (whole milliseconds; 1 ms to one day).
    Acquire {
        /// Who acquires.
        holder: LeaseHolder,
        /// How long the ownership lasts without a renew.
        ttl: Duration,
        /// The store's time.
        now: DateTime<Utc>,
    },
    /// Extend the ownership (holder, token) to `now + ttl`.
    Renew {
        /// The claimed holder.
        holder: LeaseHolder,
        /// The claimed token.
        token: FencingToken,
        /// The store's time.
        now: DateTime<Utc>,
    },
    /// Give the ownership (holder, token) up.
    Release {
        /// The claimed holder.
        holder: LeaseHolder,
        /// The claimed token.
        token: FencingToken,
        /// The store's time.
        now: DateTime<Utc>,
    },
    /// Record the owner's expiry if it has passed.
    ObserveExpiry {
        /// The store's time.
        now: DateTime<Utc>,
    },
}

/// A refused lease command (nothing is appended).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// The TTL is out of range.
    #[error("invalid lease ttl: {ttl_ms}ms: must be 1ms to 86400000ms (one day)")]
    InvalidTtl {
        /// The TTL given, in whole milliseconds.
        ttl_ms: u128,
    },
    /// Someone owns the lease and its expiry has not passed.
    #[error("the lease is held by {holder} with token {token} until {}", .expires_at.to_rfc3339())]
    Held {
        /// The owner.
        holder: LeaseHolder,
        /// Its token.
        token: FencingToken,
        /// Its expiry.
        expires_at: DateTime<Utc>,
    },
    /// A release on behalf of a stale claim.
    #[error("release refused: {0}")]
    StaleRelease(FenceError),
    /// Every token was issued (never in practice: 2^64 - 1 owners).
    #[error("the lease has issued its last fencing token")]
    TokensExhausted,
    /// `now + ttl` is beyond the range of store times.
    #[error("the lease expiry is out of range: now {} plus {ttl_ms}ms", .now.to_rfc3339())]
    TimeOutOfRange {
        /// The store's time.
        now: DateTime<Utc>,
        /// The TTL.
        ttl_ms: u64,
    },
}

/// Whether a write on behalf of (holder, token) may land at the store time `now`: the lease's
/// owner is `holder`, with `token`, and `now` is strictly before its expiry. The store's guard
/// checks the same condition in the statement of the write itself.
pub fn fence(
    state: &Lease,
    holder: &LeaseHolder,
    token: FencingToken,
    now: DateTime<Utc>,
) -> Result<(), FenceError> {
    state
        .check(holder, token, now)
        .map(|_| ())
        .map_err(|reason| FenceError {
            holder: holder.clone(),
            token,
            reason,
        })
}

impl Lease {
    /// The state the ledger's `events` fold into.
    pub fn fold<'a>(events: impl IntoIterator<Item = &'a LeaseEvent>) -> Self {
        let mut state = Self::default();
        for event in events {
            state.apply(event.clone());
        }
        state
    }

    /// The owner whose expiry has not passed at `now`.
    pub fn live_owner(&self, now: DateTime<Utc>) -> Option<&Ownership> {
        self.owner.as_ref().filter(|o| now < o.expires_at)
    }

    /// The ownership (holder, token) if it holds at `now`, else why not.
    pub fn check(
        &self,
        holder: &LeaseHolder,
        token: FencingToken,
        now: DateTime<Utc>,
    ) -> Result<&Ownership, Staleness> {
        let owner = self.owner.as_ref().ok_or(Staleness::NotHeld)?;
        if &owner.holder != holder {
            return Err(Staleness::HeldByOther {
                current: owner.holder.clone(),
                token: owner.token,
            });
        }
        if owner.token != token {
            return Err(Staleness::TokenMismatch {
                current: owner.token,
            });
        }
        if now >= owner.expires_at {
            return Err(Staleness::Expired {
                expired_at: owner.expires_at,
            });
        }
        Ok(owner)
    }

    /// Decides `command` against this state: the events to append. Pure.
    pub fn decide(&self, command: &LeaseCommand) -> Result<Vec<LeaseEvent>, LeaseError> {
        match command {
            LeaseCommand::Acquire { holder, ttl, now } => self.acquire(holder, *ttl, *now),
            LeaseCommand::Renew { holder, token, now } => self.renew(holder, *token, *now),
            LeaseCommand::Release { holder, token, now } => {
                self.release(holder, *token, *now).map(|e| vec![e])
            }
            LeaseCommand::ObserveExpiry { now } => Ok(self.expiry(*now).into_iter().collect()),
        }
    }

    fn acquire(
        &self,
        holder: &LeaseHolder,
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> Result<Vec<LeaseEvent>, LeaseError> {
        let ttl_ms = checked_ttl(ttl)?;
        if let Some(owner) = self.live_owner(now) {
            return Err(LeaseError::Held {
                holder: owner.holder.clone(),
                token: owner.token,
                expires_at: owner.expires_at,
            });
        }
        let token = self
            .last_token
            .0
            .checked_add(1)
            .map(FencingToken)
            .ok_or(LeaseError::TokensExhausted)?;
        let mut events: Vec<LeaseEvent> = self.expiry(now).into_iter().collect();
        events.push(LeaseEvent::Acquired {
            holder: holder.clone(),
            token,
            ttl_ms,
            expires_at: expiry_after(now, ttl_ms)?,
        });
        Ok(events)
    }

    fn renew(
        &self,
        holder: &LeaseHolder,
        token: FencingToken,
        now: DateTime<Utc>,
    ) -> Result<Vec<LeaseEvent>, LeaseError> {
        let lost = |reason| LeaseEvent::Lost {
            holder: holder.clone(),
            token,
            reason,
        };
        match self.check(holder, token, now) {
            Ok(owner) => Ok(vec![LeaseEvent::Renewed {
                holder: holder.clone(),
                token,
                expires_at: expiry_after(now, owner.ttl_ms)?,
            }]),
            Err(reason @ Staleness::Expired { .. }) => Ok(vec![
                LeaseEvent::Expired {
                    holder: holder.clone(),
                    token,
                },
                lost(reason),
            ]),
            Err(reason) => Ok(vec![lost(reason)]),
        }
    }

    fn release(
        &self,
        holder: &LeaseHolder,
        token: FencingToken,
        now: DateTime<Utc>,
    ) -> Result<LeaseEvent, LeaseError> {
        fence(self, holder, token, now).map_err(LeaseError::StaleRelease)?;
        Ok(LeaseEvent::Released {
            holder: holder.clone(),
            token,
        })
    }

    fn expiry(&self, now: DateTime<Utc>) -> Option<LeaseEvent> {
        let owner = self.owner.as_ref().filter(|o| now >= o.expires_at)?;
        Some(LeaseEvent::Expired {
            holder: owner.holder.clone(),
            token: owner.token,
        })
    }

    /// True when `event` is about the current ownership.
    fn is_current(&self, holder: &LeaseHolder, token: FencingToken) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|o| &o.holder == holder && o.token == token)
    }
}

fn checked_ttl(ttl: Duration) -> Result<u64, LeaseError> {
    let ttl_ms = ttl.as_millis();
    if ttl_ms == 0 || ttl > MAX_TTL {
        return Err(LeaseError::InvalidTtl { ttl_ms });
    }
    u64::try_from(ttl_ms).map_err(|_| LeaseError::InvalidTtl { ttl_ms })
}

fn expiry_after(now: DateTime<Utc>, ttl_ms: u64) -> Result<DateTime<Utc>, LeaseError> {
    i64::try_from(ttl_ms)
        .ok()
        .and_then(TimeDelta::try_milliseconds)
        .and_then(|delta| now.checked_add_signed(delta))
        .ok_or(LeaseError::TimeOutOfRange { now, ttl_ms })
}

impl Aggregate for Lease {
    const TYPE: &'static str = LEASE_AGGREGATE;
    type Command = LeaseCommand;
    type Event = LeaseEvent;
    type Error = LeaseError;
    type Services = ();

    async fn handle(
        &mut self,
        command: Self::Command,
        _services: &Self::Services,
        sink: &EventSink<Self>,
    ) -> Result<(), Self::Error> {
        for event in self.decide(&command)? {
            sink.write(event, self).await;
        }
        Ok(())
    }

    fn apply(&mut self, event: Self::Event) {
        match event {
            LeaseEvent::Acquired {
                holder,
                token,
                ttl_ms,
                expires_at,
            } => {
                self.last_token = self.last_token.max(token);
                self.owner = Some(Ownership {
                    holder,
                    token,
                    ttl_ms,
                    expires_at,
                });
            }
            LeaseEvent::Renewed {
                holder,
                token,
                expires_at,
            } => {
                if let Some(owner) = self.owner.as_mut() {
                    if owner.holder == holder && owner.token == token {
                        owner.expires_at = expires_at;
                    }
                }
            }
            LeaseEvent::Released { holder, token } | LeaseEvent::Expired { holder, token } => {
                if self.is_current(&holder, token) {
                    self.owner = None;
                }
            }
            LeaseEvent::Lost { .. } => {}
        }
    }
}
