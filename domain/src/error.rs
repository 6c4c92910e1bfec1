//! The domain's error types: validation of input at the edge, and refusals of a decision.

use std::fmt;

/// Input that does not have the shape Wharf needs. Names the field and the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationError {
    /// The field (or argument, or array element) that was wrong, e.g. `bindings[1]`.
    pub field: String,
    /// The value as given (truncated for display when very long).
    pub value: String,
    /// Why it is refused.
    pub reason: String,
}

impl ValidationError {
    /// Builds an error for `field` holding `value`.
    pub fn new(field: &str, value: &str, reason: &str) -> Self {
        Self {
            field: field.to_owned(),
            value: value.to_owned(),
            reason: reason.to_owned(),
        }
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 120;
        let shown: String = self.value.chars().take(SHOWN).collect();
        let ellipsis = if self.value.chars().count() > SHOWN {
            "..."
        } else {
            ""
        };
        write!(
            f,
            "invalid {}: {:?}{}: {}",
            self.field, shown, ellipsis, self.reason
        )
    }
}
