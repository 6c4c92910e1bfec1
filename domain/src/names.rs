//! Identifiers: consumer-group names, log topic names, declarer identities and app versions.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::ValidationError;

const MAX_NAME_BYTES: usize = 255;

fn check_identifier(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.is_empty() || value.len() > MAX_NAME_BYTES {
        return Err(ValidationError::new(
            field,
            value,
            "must be 1 to 255 bytes long",
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if !value.chars().all(allowed) {
        return Err(ValidationError::new(
            field,
            value,
            "may hold only ASCII letters, digits, '.', '_' and '-'",
        ));
    }
    Ok(())
}

macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident, $field:literal, $check:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates `value`, naming `field` in the error.
            pub fn parse(field: &str, value: &str) -> Result<Self, ValidationError> {
                $check(field, value)?;
                Ok(Self(value.to_owned()))
            }

            /// The text of the identifier.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = ValidationError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::parse($field, &value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> Self {
                value.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

identifier!(
    /// A consumer group's name: instances sharing it compete for the group's messages.
    GroupName,
    "group",
    check_identifier
);
identifier!(
    /// A log topic's name: the stream messages are appended to.
    TopicName,
    "topic",
    check_identifier
);
identifier!(
    /// Who made a declaration attempt: `hostname:pid:random`, computed once per process.
    /// Display and audit only; it never decides anything by its content.
    DeclarerId,
    "declarer",
    check_free_text
);
identifier!(
    /// The declaring application's version, recorded for audit and never used to decide.
    AppVersion,
    "version",
    check_free_text
);

fn check_free_text(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.trim().is_empty() || value.len() > MAX_NAME_BYTES {
        return Err(ValidationError::new(
            field,
            value,
            "must be 1 to 255 bytes and not blank",
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(ValidationError::new(
            field,
            value,
            "must not contain control characters",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_accept_plain_names_and_refuse_others() {
        assert!(GroupName::parse("group", "billing-v2.workers_1").is_ok());
        let err = GroupName::parse("group", "billing/x").unwrap_err();
        assert_eq!(
            (err.field.as_str(), err.value.as_str()),
            ("group", "billing/x")
        );
        assert!(TopicName::parse("topic", "").is_err());
        assert!(TopicName::parse("topic", &"t".repeat(256)).is_err());
    }

    #[test]
    fn free_text_refuses_blank_and_control_characters() {
        assert!(DeclarerId::parse("declarer", "host-1:1:ab12").is_ok());
        assert!(AppVersion::parse("version", "1.4.2 (abc123)").is_ok());
        assert!(AppVersion::parse("version", "  ").is_err());
        assert!(DeclarerId::parse("declarer", "a\nb").is_err());
    }
}
