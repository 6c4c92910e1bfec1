//! Subscription filters kept byte for byte, and MQTT QoS levels.
//!
//! An [`ExactFilter`] is what a managed MQTT session SUBSCRIBEs and UNSUBSCRIBEs: a plain MQTT v5
//! filter (`sensors/#`) or the shared form `$share/{ShareName}/{filter}`. The broker knows a
//! subscription by its exact string, so the ledger keeps and compares the exact string: two
//! filters that match the same topics are still two subscriptions (`$share/a/x` is not
//! `$share/b/x`, and neither is `x`).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::ValidationError;
use crate::filter::{check_common, check_plain};
use crate::matcher::filter_text_matches;

const SHARE_PREFIX: &str = "$share/";
const FIELD: &str = "filter";

/// A validated subscription filter, plain or shared, kept exactly as given.
///
/// Equality, order and hash are those of the exact string.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ExactFilter(String);

impl ExactFilter {
    /// Validates `value` as a subscription filter; the error names the field `filter`.
    pub fn parse(value: &str) -> Result<Self, ValidationError> {
        Self::parse_field(FIELD, value)
    }

    /// Validates `value`, naming `field` (e.g. `sessions.plant.subscriptions[2].filter`) in the
    /// error when it is not a filter.
    pub fn parse_field(field: &str, value: &str) -> Result<Self, ValidationError> {
        Self::check(field, value)?;
        Ok(Self(value.to_owned()))
    }

    /// Validates `value` as [`ExactFilter::parse_field`] does, without copying it.
    fn check(field: &str, value: &str) -> Result<(), ValidationError> {
        check_common(field, value)?;
        if value == "$share" {
            return Err(shared_form_error(field, value));
        }
        if let Some(rest) = value.strip_prefix(SHARE_PREFIX) {
            let (share, inner) = rest
                .split_once('/')
                .ok_or_else(|| shared_form_error(field, value))?;
            check_share_name(field, value, share)?;
            check_inner(field, value, inner)?;
        } else {
            check_plain(field, value)?;
        }
        Ok(())
    }

    /// The filter exactly as given, shared prefix included.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The ShareName of a shared filter (`group` for `$share/group/a/#`).
    pub fn share_name(&self) -> Option<&str> {
        self.split_shared().map(|(share, _)| share)
    }

    /// True for the `$share/{ShareName}/{filter}` form.
    pub fn is_shared(&self) -> bool {
        self.0.starts_with(SHARE_PREFIX)
    }

    /// The filter topics are matched against: the part after `$share/{ShareName}/` for a
    /// shared filter, the whole filter otherwise.
    pub fn topic_filter(&self) -> &str {
        self.split_shared().map_or(&self.0, |(_, inner)| inner)
    }

    /// Does a message published on `topic` match this subscription? MQTT v5 section 4.7 on the
    /// topic filter, including the rule that a leading wildcard does not match a `$` topic.
    pub fn matches(&self, topic: &str) -> bool {
        // The inner filter was validated as a plain filter at construction.
        filter_text_matches(self.topic_filter(), topic)
    }

    fn split_shared(&self) -> Option<(&str, &str)> {
        self.0.strip_prefix(SHARE_PREFIX)?.split_once('/')
    }
}

fn shared_form_error(field: &str, value: &str) -> ValidationError {
    ValidationError::new(
        field,
        value,
        "a shared subscription is $share/{ShareName}/{filter} with a non-empty ShareName and filter",
    )
}

fn check_share_name(field: &str, value: &str, share: &str) -> Result<(), ValidationError> {
    if share.is_empty() {
        return Err(ValidationError::new(
            field,
            value,
            "the ShareName of a shared subscription must not be empty",
        ));
    }
    if share.contains(['+', '#']) {
        return Err(ValidationError::new(
            field,
            value,
            "the ShareName of a shared subscription must not contain '+' or '#'",
        ));
    }
    Ok(())
}

fn check_inner(field: &str, value: &str, inner: &str) -> Result<(), ValidationError> {
    if inner.is_empty() {
        return Err(ValidationError::new(
            field,
            value,
            "a shared subscription needs a filter after $share/{ShareName}/",
        ));
    }
    if inner.starts_with(SHARE_PREFIX) || inner == "$share" {
        return Err(ValidationError::new(
            field,
            value,
            "the filter of a shared subscription may not itself be shared",
        ));
    }
    check_common(field, inner)
        .and_then(|()| check_plain(field, inner))
        .map_err(|inner_error| ValidationError::new(field, value, &inner_error.reason))
}

impl TryFrom<String> for ExactFilter {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        // Kept as given, not copied: a decode of a stored event hands over its own string.
        Self::check(FIELD, &value)?;
        Ok(Self(value))
    }
}

impl From<ExactFilter> for String {
    fn from(filter: ExactFilter) -> Self {
        filter.0
    }
}

impl fmt::Display for ExactFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An MQTT quality of service level; serialized as the number 0, 1 or 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u8", into = "u8")]
pub enum Qos {
    /// QoS 0: at most once.
    AtMostOnce = 0,
    /// QoS 1: at least once.
    AtLeastOnce = 1,
    /// QoS 2: exactly once.
    ExactlyOnce = 2,
}

impl Qos {
    /// The level's number (0, 1 or 2).
    pub fn level(self) -> u8 {
        self as u8
    }

    /// The level numbered `level`, or an error naming `field`.
    pub fn parse_field(field: &str, level: u8) -> Result<Self, ValidationError> {
        match level {
            0 => Ok(Self::AtMostOnce),
            1 => Ok(Self::AtLeastOnce),
            2 => Ok(Self::ExactlyOnce),
            other => Err(ValidationError::new(
                field,
                &other.to_string(),
                "a QoS is 0, 1 or 2",
            )),
        }
    }
}

impl TryFrom<u8> for Qos {
    type Error = ValidationError;
    fn try_from(level: u8) -> Result<Self, Self::Error> {
        Self::parse_field("qos", level)
    }
}

impl From<Qos> for u8 {
    fn from(qos: Qos) -> Self {
        qos.level()
    }
}

impl fmt::Display for Qos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.level())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(text: &str) -> ExactFilter {
        ExactFilter::parse(text).expect("valid filter")
    }

    #[test]
    fn keeps_plain_and_shared_forms_byte_for_byte() {
        for ok in [
            "sensors/#",
            "+/x",
            "#",
            "$SYS/#",
            "a//b",
            "$share/g/sensors/#",
            "$share/g/#",
        ] {
            assert_eq!(filter(ok).as_str(), ok);
        }
        let shared = filter("$share/group/sensors/+/temp");
        assert!(shared.is_shared());
        assert_eq!(shared.share_name(), Some("group"));
        assert_eq!(shared.topic_filter(), "sensors/+/temp");
        let plain = filter("sensors/#");
        assert!(!plain.is_shared());
        assert_eq!(plain.share_name(), None);
        assert_eq!(plain.topic_filter(), "sensors/#");
    }

    #[test]
    fn filters_that_merely_start_like_share_are_plain() {
        let f = filter("$shared/x");
        assert!(!f.is_shared());
        assert!(f.matches("$shared/x"));
    }

    #[test]
    fn refuses_malformed_shared_forms_naming_the_value() {
        for bad in [
            "$share",
            "$share/",
            "$share/g",
            "$share//a",
            "$share/g/",
            "$share/g+/a",
            "$share/g#/a",
            "$share/g/a/#/b",
            "$share/g/a+",
            "$share/g/$share/h/a",
        ] {
            let err = ExactFilter::parse(bad).expect_err(bad);
            assert_eq!(err.field, "filter");
            assert_eq!(err.value, bad);
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn refuses_what_topic_filter_refuses() {
        for bad in ["", "a/#/b", "a+", "a\0b"] {
            assert!(ExactFilter::parse(bad).is_err(), "{bad:?}");
        }
        let err = ExactFilter::parse_field("subscriptions[3].filter", "x/#/y").unwrap_err();
        assert_eq!(err.field, "subscriptions[3].filter");
    }

    #[test]
    fn matches_through_the_inner_filter_with_the_dollar_rule() {
        assert!(filter("$share/g/sensors/#").matches("sensors/a/b"));
        assert!(filter("$share/g/sensors/#").matches("sensors"));
        assert!(!filter("$share/g/sensors/#").matches("other"));
        assert!(!filter("$share/g/#").matches("$SYS/x"));
        assert!(!filter("+/x").matches("$SYS/x"));
        assert!(filter("$SYS/#").matches("$SYS/x"));
        assert!(filter("a/+").matches("a/"));
        assert!(!filter("a/+").matches("a"));
    }

    #[test]
    fn equality_is_by_the_exact_string() {
        assert_ne!(filter("$share/a/x"), filter("$share/b/x"));
        assert_ne!(filter("$share/a/x"), filter("x"));
        assert!(filter("$share/a/x") < filter("x"));
    }

    #[test]
    fn serde_is_a_plain_string_validated_on_the_way_in() {
        let f = filter("$share/g/a/#");
        assert_eq!(serde_json::to_string(&f).unwrap(), "\"$share/g/a/#\"");
        let back: ExactFilter = serde_json::from_str("\"$share/g/a/#\"").unwrap();
        assert_eq!(back, f);
        assert!(serde_json::from_str::<ExactFilter>("\"$share//a\"").is_err());
    }

    #[test]
    fn qos_is_a_number_on_the_wire() {
        assert_eq!(serde_json::to_string(&Qos::AtLeastOnce).unwrap(), "1");
        assert_eq!(serde_json::from_str::<Qos>("2").unwrap(), Qos::ExactlyOnce);
        assert!(serde_json::from_str::<Qos>("3").is_err());
        assert!(Qos::AtMostOnce < Qos::ExactlyOnce);
        assert_eq!(Qos::try_from(0).unwrap(), Qos::AtMostOnce);
    }
}
