//! MQTT v5 topic names and topic filters (spec sections 4.7 and 4.8.2), validated at the edge.
//!
//! A [`TopicFilter`] is what a consumer group binds with (`sensors/+/temp`, `alerts/#`); a
//! [`Subject`] is the concrete topic name a message is published under. Both are checked once,
//! when they enter the system, so every later stage can rely on their shape.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::ValidationError;

/// The longest topic name or filter MQTT can carry: a two-byte length prefix.
pub const MAX_TOPIC_BYTES: usize = 65_535;

/// A validated MQTT v5 topic filter: `+` fills exactly one level, `#` is last and alone in its
/// level and also matches the parent level.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TopicFilter(String);

impl TopicFilter {
    /// Validates `value` as a topic filter, naming `field` in the error when it is not one.
    pub fn parse(field: &str, value: &str) -> Result<Self, ValidationError> {
        check_common(field, value)?;
        check_plain(field, value)?;
        Ok(Self(value.to_owned()))
    }

    /// The filter text, exactly as declared.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The filter's levels, split on `/`.
    pub fn levels(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// True when the filter holds `+` or `#`.
    pub fn has_wildcard(&self) -> bool {
        self.levels().any(|level| level == "+" || level == "#")
    }
}

impl TryFrom<String> for TopicFilter {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse("pattern", &value)
    }
}

impl From<TopicFilter> for String {
    fn from(filter: TopicFilter) -> Self {
        filter.0
    }
}

impl fmt::Display for TopicFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated MQTT v5 topic name: the concrete subject of a message, without wildcards.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Subject(String);

impl Subject {
    /// Validates `value` as a topic name, naming `field` in the error when it is not one.
    pub fn parse(field: &str, value: &str) -> Result<Self, ValidationError> {
        check_common(field, value)?;
        if value.contains(['+', '#']) {
            return Err(ValidationError::new(
                field,
                value,
                "a subject is a topic name and may not contain '+' or '#'",
            ));
        }
        Ok(Self(value.to_owned()))
    }

    /// The subject text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Subject {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse("subject", &value)
    }
}

impl From<Subject> for String {
    fn from(subject: Subject) -> Self {
        subject.0
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A plain (not shared) filter's own rules, after [`check_common`]: what [`TopicFilter::parse`]
/// accepts, checked without building one (a ledger decode checks every filter of a
/// 10,000-filter event).
pub(crate) fn check_plain(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.starts_with("$share/") || value == "$share" {
        return Err(ValidationError::new(
            field,
            value,
            "shared-subscription syntax ($share/...) is not a binding; bind the plain filter",
        ));
    }
    check_levels(field, value)
}

/// The wildcard rules of a filter's levels, without allocating.
fn check_levels(field: &str, value: &str) -> Result<(), ValidationError> {
    let mut levels = value.split('/').peekable();
    while let Some(level) = levels.next() {
        let last = levels.peek().is_none();
        if level.contains('#') && (level != "#" || !last) {
            return Err(ValidationError::new(
                field,
                value,
                "'#' must be the whole of the last level",
            ));
        }
        if level.contains('+') && level != "+" {
            return Err(ValidationError::new(
                field,
                value,
                "'+' must be the whole of its level",
            ));
        }
    }
    Ok(())
}

pub(crate) fn check_common(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::new(
            field,
            value,
            "must be at least one character",
        ));
    }
    if value.len() > MAX_TOPIC_BYTES {
        return Err(ValidationError::new(
            field,
            value,
            "must be at most 65535 bytes",
        ));
    }
    if value.contains('\0') {
        return Err(ValidationError::new(
            field,
            value,
            "must not contain the NUL character",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_spec_examples() {
        for ok in [
            "sport/tennis/player1/#",
            "sport/#",
            "#",
            "+",
            "+/tennis/#",
            "sport/+/player1",
            "/+",
            "+/+",
            "$SYS/#",
            "a//b",
        ] {
            assert!(TopicFilter::parse("pattern", ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_misplaced_wildcards_naming_field_and_value() {
        for bad in [
            "sport/tennis#",
            "sport/tennis/#/ranking",
            "sport+",
            "a/b+/c",
            "#/a",
        ] {
            let err = TopicFilter::parse("bindings[2]", bad).unwrap_err();
            assert_eq!(err.field, "bindings[2]");
            assert_eq!(err.value, bad);
        }
    }

    #[test]
    fn rejects_empty_nul_oversized_and_shared() {
        assert!(TopicFilter::parse("p", "").is_err());
        assert!(TopicFilter::parse("p", "a\0b").is_err());
        assert!(TopicFilter::parse("p", &"a".repeat(MAX_TOPIC_BYTES + 1)).is_err());
        assert!(TopicFilter::parse("p", &"a".repeat(MAX_TOPIC_BYTES)).is_ok());
        assert!(TopicFilter::parse("p", "$share/g/a/#").is_err());
    }

    #[test]
    fn subjects_refuse_wildcards() {
        assert!(Subject::parse("subject", "a/b").is_ok());
        assert!(Subject::parse("subject", "$SYS/x").is_ok());
        let err = Subject::parse("subject", "a/+").unwrap_err();
        assert!(err.to_string().contains("subject"));
        assert!(err.to_string().contains("a/+"));
        assert!(Subject::parse("subject", "").is_err());
    }

    #[test]
    fn serde_validates_on_the_way_in() {
        let bad: Result<TopicFilter, _> = serde_json::from_str("\"a/#/b\"");
        assert!(bad.is_err());
        let good: TopicFilter = serde_json::from_str("\"a/#\"").unwrap();
        assert_eq!(good.as_str(), "a/#");
    }
}
