//! The lease's vocabulary: who holds it, the fencing token, and why a claim is stale.

use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use crate::error::ValidationError;

const MAX_HOLDER_BYTES: usize = 255;

/// Who holds (or claims) a lease: one process incarnation (say `host-4711-3f2a`), never reused
/// by a restarted process, so a restart is a change of owner.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LeaseHolder(String);

impl LeaseHolder {
    /// Validates `value` (1 to 255 bytes of ASCII letters, digits, `.`, `_`, `-`, `:`),
    /// naming `field` in the error.
    pub fn parse(field: &str, value: &str) -> Result<Self, ValidationError> {
        if value.is_empty() || value.len() > MAX_HOLDER_BYTES {
            return Err(ValidationError::new(
                field,
                value,
                "must be 1 to 255 bytes long",
            ));
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':');
        if !value.chars().all(allowed) {
            return Err(ValidationError::new(
                field,
                value,
                "may hold only ASCII letters, digits, '.', '_', '-' and ':'",
            ));
        }
        Ok(Self(value.to_owned()))
    }

    /// The holder's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for LeaseHolder {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse("holder", &value)
    }
}

impl From<LeaseHolder> for String {
    fn from(value: LeaseHolder) -> Self {
        value.0
    }
}

impl fmt::Display for LeaseHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The fencing token: 1 for a lease's first owner, one more for every later owner. Never
/// reused, never decreasing; a renew keeps it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token's number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why a (holder, token) claim on a lease does not hold at a given store time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Staleness {
    /// No one holds the lease (never acquired, released, or its expiry was observed).
    NotHeld,
    /// Another holder owns it.
    HeldByOther {
        /// The current holder.
        current: LeaseHolder,
        /// Its token.
        token: FencingToken,
    },
    /// The holder matches but the token is not the current one (an older ownership).
    TokenMismatch {
        /// The current token.
        current: FencingToken,
    },
    /// The claim was the current one, but its expiry has passed by the store's clock.
    Expired {
        /// When it expired.
        expired_at: DateTime<Utc>,
    },
}

impl fmt::Display for Staleness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotHeld => f.write_str("no one holds the lease"),
            Self::HeldByOther { current, token } => {
                write!(f, "the lease is held by {current} with token {token}")
            }
            Self::TokenMismatch { current } => {
                write!(f, "the lease's current token is {current}")
            }
            Self::Expired { expired_at } => write!(
                f,
                "the lease expired at {}",
                expired_at.to_rfc3339_opts(SecondsFormat::Millis, true)
            ),
        }
    }
}

/// A write on behalf of (holder, token) that must not land: the claim is stale.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lease claim of {holder} with token {token} is stale: {reason}")]
pub struct FenceError {
    /// The claimed holder.
    pub holder: LeaseHolder,
    /// The claimed token.
    pub token: FencingToken,
    /// Why the claim does not hold.
    pub reason: Staleness,
}
