//! A consumer group's full binding set: the normalized set of topic filters it declares.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::ValidationError;
use crate::filter::TopicFilter;

/// The most filters one declaration may hold; far above any real consumer, low enough that a
/// runaway caller cannot store megabytes per attempt.
pub const MAX_BINDINGS: usize = 10_000;

/// A normalized binding set: sorted, without duplicates. The empty set means the whole topic.
///
/// Two declarations are "the same set" exactly when their normalized sets are equal; order and
/// repetition in the caller's list never matter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "Vec<TopicFilter>", into = "Vec<TopicFilter>")]
pub struct BindingSet(Vec<TopicFilter>);

impl BindingSet {
    /// The whole-topic set: no bindings.
    pub fn whole_topic() -> Self {
        Self(Vec::new())
    }

    /// Validates every pattern (naming `bindings[i]` in an error) and normalizes the set.
    pub fn parse<S: AsRef<str>>(patterns: &[S]) -> Result<Self, ValidationError> {
        if patterns.len() > MAX_BINDINGS {
            return Err(ValidationError::new(
                "bindings",
                &format!("{} patterns", patterns.len()),
                "a declaration may hold at most 10000 patterns",
            ));
        }
        let filters = patterns
            .iter()
            .enumerate()
            .map(|(i, p)| TopicFilter::parse(&format!("bindings[{i}]"), p.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::from_filters(filters))
    }

    /// Normalizes already-validated filters.
    pub fn from_filters(mut filters: Vec<TopicFilter>) -> Self {
        filters.sort();
        filters.dedup();
        Self(filters)
    }

    /// True for the whole-topic set.
    pub fn is_whole_topic(&self) -> bool {
        self.0.is_empty()
    }

    /// The filters, in normalized order.
    pub fn filters(&self) -> &[TopicFilter] {
        &self.0
    }

    /// The filters as plain strings, in normalized order.
    pub fn patterns(&self) -> Vec<String> {
        self.0.iter().map(|f| f.as_str().to_owned()).collect()
    }
}

impl TryFrom<Vec<TopicFilter>> for BindingSet {
    type Error = ValidationError;
    fn try_from(filters: Vec<TopicFilter>) -> Result<Self, Self::Error> {
        if filters.len() > MAX_BINDINGS {
            return Err(ValidationError::new(
                "bindings",
                &format!("{} patterns", filters.len()),
                "a declaration may hold at most 10000 patterns",
            ));
        }
        Ok(Self::from_filters(filters))
    }
}

impl From<BindingSet> for Vec<TopicFilter> {
    fn from(set: BindingSet) -> Self {
        set.0
    }
}

impl fmt::Display for BindingSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_whole_topic() {
            return f.write_str("{whole topic}");
        }
        f.write_str("{")?;
        for (i, filter) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(filter.as_str())?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_duplicates_do_not_matter() {
        let a = BindingSet::parse(&["b/#", "a/+", "b/#"]).unwrap();
        let b = BindingSet::parse(&["a/+", "b/#"]).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.patterns(), vec!["a/+", "b/#"]);
    }

    #[test]
    fn empty_is_whole_topic() {
        let set = BindingSet::parse::<&str>(&[]).unwrap();
        assert!(set.is_whole_topic());
        assert_eq!(set.to_string(), "{whole topic}");
    }

    #[test]
    fn the_invalid_pattern_is_named_by_index() {
        let err = BindingSet::parse(&["ok/#", "bad#"]).unwrap_err();
        assert_eq!(err.field, "bindings[1]");
        assert_eq!(err.value, "bad#");
    }

    #[test]
    fn too_many_patterns_is_refused() {
        let many: Vec<String> = (0..=MAX_BINDINGS).map(|i| format!("t/{i}")).collect();
        assert_eq!(BindingSet::parse(&many).unwrap_err().field, "bindings");
    }
}
