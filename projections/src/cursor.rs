//! Opaque page cursors of the group listing (ADR 0024).
//!
//! A cursor is the sort key of the last item a page returned, tagged with what it pages and
//! encoded as unpadded URL-safe base64, so clients pass it back verbatim and never build one.
//! It holds no server state: a cursor survives a restart, and any process of a cluster
//! answers it. Paging is keyset paging (`key > cursor ORDER BY key`), so an item is never
//! listed twice across pages, and every item that existed for the whole walk is listed once.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use wharf_domain::{DeclarerId, GroupName};

use crate::error::ProjectionError;

/// Where a page of groups starts: after this group name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupCursor(pub GroupName);

/// Where a page of a group's waiters starts: after this (first statement, declarer) key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaiterCursor {
    /// The last listed waiter's `declared_at`, in microseconds since the epoch.
    pub declared_at_micros: i64,
    /// The last listed waiter's declarer.
    pub declarer: String,
}

/// Where a page of a group's instances starts: after this declarer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceCursor(pub String);

const GROUP_TAG: &str = "g1";
const WAITER_TAG: &str = "w1";
const INSTANCE_TAG: &str = "i1";
const SEPARATOR: char = '\n';

fn encode(parts: &[&str]) -> String {
    URL_SAFE_NO_PAD.encode(parts.join(&SEPARATOR.to_string()))
}

const NOT_A_CURSOR: &str = "is not a cursor this API returned; pass a page's next cursor verbatim";

fn refuse(field: &'static str, raw: &str) -> ProjectionError {
    ProjectionError::InvalidParameter {
        field,
        value: raw.to_owned(),
        reason: NOT_A_CURSOR,
    }
}

/// The cursor's parts after its tag, or a refusal naming `field`.
fn decode<'a>(
    field: &'static str,
    raw: &str,
    tag: &str,
    text: &'a mut String,
) -> Result<Vec<&'a str>, ProjectionError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(raw)
        .map_err(|_| refuse(field, raw))?;
    *text = String::from_utf8(bytes).map_err(|_| refuse(field, raw))?;
    let mut parts = text.split(SEPARATOR);
    if parts.next() != Some(tag) {
        return Err(refuse(field, raw));
    }
    Ok(parts.collect())
}

impl GroupCursor {
    /// The cursor's opaque text.
    pub fn encode(&self) -> String {
        encode(&[GROUP_TAG, self.0.as_str()])
    }

    /// Parses the opaque text given as `field`.
    pub fn decode(field: &'static str, raw: &str) -> Result<Self, ProjectionError> {
        let mut text = String::new();
        match decode(field, raw, GROUP_TAG, &mut text)?.as_slice() {
            [name] => GroupName::parse(field, name)
                .map(Self)
                .map_err(|_| refuse(field, raw)),
            _ => Err(refuse(field, raw)),
        }
    }
}

impl WaiterCursor {
    /// The cursor after a waiter that first stated its set at `declared_at`.
    pub fn after(declared_at: DateTime<Utc>, declarer: &str) -> Self {
        Self {
            declared_at_micros: declared_at.timestamp_micros(),
            declarer: declarer.to_owned(),
        }
    }

    /// The cursor's opaque text.
    pub fn encode(&self) -> String {
        encode(&[
            WAITER_TAG,
            &self.declared_at_micros.to_string(),
            &self.declarer,
        ])
    }

    /// Parses the opaque text given as `field`.
    pub fn decode(field: &'static str, raw: &str) -> Result<Self, ProjectionError> {
        let mut text = String::new();
        match decode(field, raw, WAITER_TAG, &mut text)?.as_slice() {
            [micros, declarer] => {
                let declared_at_micros = micros.parse().map_err(|_| refuse(field, raw))?;
                DeclarerId::parse(field, declarer).map_err(|_| refuse(field, raw))?;
                Ok(Self {
                    declared_at_micros,
                    declarer: (*declarer).to_owned(),
                })
            }
            _ => Err(refuse(field, raw)),
        }
    }

    /// The key as a time (clamped to the representable range).
    pub fn declared_at(&self) -> DateTime<Utc> {
        DateTime::from_timestamp_micros(self.declared_at_micros).unwrap_or(
            if self.declared_at_micros < 0 {
                DateTime::<Utc>::MIN_UTC
            } else {
                DateTime::<Utc>::MAX_UTC
            },
        )
    }
}

impl InstanceCursor {
    /// The cursor's opaque text.
    pub fn encode(&self) -> String {
        encode(&[INSTANCE_TAG, &self.0])
    }

    /// Parses the opaque text given as `field`.
    pub fn decode(field: &'static str, raw: &str) -> Result<Self, ProjectionError> {
        let mut text = String::new();
        match decode(field, raw, INSTANCE_TAG, &mut text)?.as_slice() {
            [declarer] => {
                DeclarerId::parse(field, declarer).map_err(|_| refuse(field, raw))?;
                Ok(Self((*declarer).to_owned()))
            }
            _ => Err(refuse(field, raw)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cursor_round_trips() {
        let group = GroupCursor(GroupName::parse("g", "billing.eu-1").unwrap());
        assert_eq!(
            GroupCursor::decode("after", &group.encode()).unwrap(),
            group
        );
        let waiter = WaiterCursor {
            declared_at_micros: 1_700_000_000_123_456,
            declarer: "host:12:ab/3".to_owned(),
        };
        assert_eq!(
            WaiterCursor::decode("waiters_after", &waiter.encode()).unwrap(),
            waiter
        );
        let instance = InstanceCursor("host:12:ab/3".to_owned());
        assert_eq!(
            InstanceCursor::decode("instances_after", &instance.encode()).unwrap(),
            instance
        );
    }

    #[test]
    fn junk_and_cursors_of_another_kind_are_refused_naming_the_field() {
        let waiter = WaiterCursor {
            declared_at_micros: 5,
            declarer: "d".to_owned(),
        }
        .encode();
        for raw in ["", "!!", "bm90IGEgY3Vyc29y", waiter.as_str()] {
            match GroupCursor::decode("after", raw) {
                Err(ProjectionError::InvalidParameter { field, value, .. }) => {
                    assert_eq!((field, value.as_str()), ("after", raw));
                }
                other => panic!("{raw:?} gave {other:?}"),
            }
        }
        let bad_group = URL_SAFE_NO_PAD.encode("g1\nnot a name");
        assert!(GroupCursor::decode("after", &bad_group).is_err());
        let bad_time = URL_SAFE_NO_PAD.encode("w1\nsoon\nd");
        assert!(WaiterCursor::decode("waiters_after", &bad_time).is_err());
    }
}
