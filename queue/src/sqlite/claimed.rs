//! What a claim hands out on SQLite, as its statements read it: a claimed delivery's row
//! (`RoutedClaim`) and its message's columns (`MessageRow`), made into a [`Claimed`]. Both the
//! claim (`fetch.rs`) and the routing it does inline (`route.rs`, ADR 0069) produce them.

use wharf_domain::GroupName;
use wharf_store::event::from_micros;

use super::headers_from;
use crate::message::Claimed;

/// A delivery routed and claimed in one write: `(topic, position, attempts, routed_by)`, the
/// claim statement's row shape.
pub(super) type RoutedClaim = (String, i64, i32, i64);

/// A message's columns as the log holds them.
pub(super) struct MessageRow {
    pub subject: String,
    pub payload: Vec<u8>,
    pub headers: String,
    pub published_at: i64,
}

impl MessageRow {
    /// From a row of `subject, payload, headers, published_at`.
    pub(super) fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            subject: row.get(0)?,
            payload: row.get(1)?,
            headers: row.get(2)?,
            published_at: row.get(3)?,
        })
    }

    /// The claim of this message that `delivery` hands out under `token`.
    pub(super) fn claimed(self, group: &GroupName, token: i64, delivery: RoutedClaim) -> Claimed {
        let (topic, position, attempts, routed_by) = delivery;
        Claimed {
            group: group.to_string(),
            topic,
            position,
            subject: self.subject,
            payload: self.payload,
            headers: headers_from(&self.headers),
            published_at: from_micros(self.published_at),
            attempts,
            routed_by,
            claim_token: token,
        }
    }
}
