//! A consumer group's folded state as saved text: the format a group snapshot holds (ADR 0034).
//!
//! A snapshot is derived data: the [`ConsumerGroup`] the group's events fold to, up to a
//! sequence, so a cold load folds only the events after it. This module is the one place that
//! knows how that state is written as text and which formats can be read back. A snapshot of a
//! format this build does not know (older or newer) is never decoded: it is refused with
//! [`StateRefused::Format`], and the caller folds from the events instead.
//!
//! Formats: 1 held each declarer's waiting attempt beside the effective declaration (a map
//! that grew with every declarer that ever waited); 2 holds the effective declaration and the
//! install count only (ADR 0049). A format-1 text reads as format 2 with its map dropped, so
//! an upgrade starts from its saved states; [`is_current_format`] says when to write it anew.

use cqrs_es::Aggregate;

use crate::declaration::{ConsumerGroup, DeclarationEvent};

/// The format this build writes: the JSON form of [`ConsumerGroup`].
pub const GROUP_STATE_FORMAT: i32 = 2;

/// The oldest format this build reads (its extra fields are ignored).
pub const OLDEST_READABLE_FORMAT: i32 = 1;

/// Whether a state saved in `format` is in the format this build writes (else the next save
/// should replace it).
pub fn is_current_format(format: i32) -> bool {
    format == GROUP_STATE_FORMAT
}

/// Why saved text was not turned into a state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateRefused {
    /// Written in a format this build does not read.
    #[error("group state format {found} is not readable by this build (it reads formats {OLDEST_READABLE_FORMAT} to {GROUP_STATE_FORMAT})")]
    Format {
        /// The format the snapshot names.
        found: i32,
    },
    /// Named a readable format but did not decode as it.
    #[error("group state in format {format} does not decode: {reason}")]
    Undecodable {
        /// The format it named.
        format: i32,
        /// The decoder's complaint.
        reason: String,
    },
}

/// Writes `state` in [`GROUP_STATE_FORMAT`].
pub fn encode_group_state(state: &ConsumerGroup) -> String {
    // A ConsumerGroup is plain data (strings, maps, times): serializing it cannot fail.
    serde_json::to_string(state).unwrap_or_default()
}

/// Reads a state saved in `format`; a format outside [`OLDEST_READABLE_FORMAT`] to
/// [`GROUP_STATE_FORMAT`] is refused without looking at the text. A format-1 text's map of
/// waiting attempts is skipped, not kept.
pub fn decode_group_state(format: i32, text: &str) -> Result<ConsumerGroup, StateRefused> {
    if !(OLDEST_READABLE_FORMAT..=GROUP_STATE_FORMAT).contains(&format) {
        return Err(StateRefused::Format { found: format });
    }
    serde_json::from_str(text).map_err(|e| StateRefused::Undecodable {
        format,
        reason: e.to_string(),
    })
}

/// Folds `events`, in sequence order, into `state`.
pub fn fold_group<I>(state: &mut ConsumerGroup, events: I)
where
    I: IntoIterator<Item = DeclarationEvent>,
{
    for event in events {
        state.apply(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_round_trips_and_other_formats_are_refused_unread() {
        let state = ConsumerGroup {
            installs: 3,
            ..ConsumerGroup::default()
        };
        let text = encode_group_state(&state);
        assert_eq!(decode_group_state(GROUP_STATE_FORMAT, &text), Ok(state));
        assert_eq!(
            decode_group_state(0, &text),
            Err(StateRefused::Format { found: 0 })
        );
        assert_eq!(
            decode_group_state(GROUP_STATE_FORMAT + 1, &text),
            Err(StateRefused::Format {
                found: GROUP_STATE_FORMAT + 1
            })
        );
        assert!(matches!(
            decode_group_state(GROUP_STATE_FORMAT, "{\"installs\": \"three\"}"),
            Err(StateRefused::Undecodable { .. })
        ));
    }

    #[test]
    fn a_format_1_state_reads_without_its_waiting_map() {
        let text = r#"{"effective":null,"installs":2,"waiting":{"host:1:ab":{"attempt":{},"incumbent":[]}}}"#;
        assert_eq!(
            decode_group_state(1, text),
            Ok(ConsumerGroup {
                effective: None,
                installs: 2
            })
        );
        assert!(!is_current_format(1));
        assert!(is_current_format(GROUP_STATE_FORMAT));
    }
}
