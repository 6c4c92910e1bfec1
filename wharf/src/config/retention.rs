//! The bound on a retention (the `queue` section's, and the server's `prune.retention` and
//! `--retention` flags): at most 100 years, checked and parsed with an error that names it.

use std::time::Duration;

use crate::error::WharfError;

/// The longest retention accepted (100 years of 365.25 days): a cutoff further back than this
/// is not a retention but a mistake, and could leave the store's time range.
pub const MAX_RETENTION: Duration = Duration::from_secs(100 * 31_557_600);

/// What a retention accepts, for error messages.
pub const RETENTION_FORMAT: &str =
    "a duration such as 90s, 15m, 24h or 7d (units s, m, h, d, w, months, years), at most 100 years";

/// Refuses a retention above [`MAX_RETENTION`], naming `key`.
pub fn check_retention(key: &str, value: Duration) -> Result<(), WharfError> {
    if value > MAX_RETENTION {
        return Err(WharfError::Config(format!(
            "{key} must be at most 100 years, got {}",
            humantime::format_duration(value)
        )));
    }
    Ok(())
}

/// Parses a retention flag (`--retention 7d`): humantime, at most [`MAX_RETENTION`]; the error
/// names the accepted formats and bounds.
pub fn parse_retention(text: &str) -> Result<Duration, String> {
    let value =
        humantime::parse_duration(text).map_err(|e| format!("{e}: expected {RETENTION_FORMAT}"))?;
    if value > MAX_RETENTION {
        return Err(format!("expected {RETENTION_FORMAT}"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_flags_name_the_format_and_the_bound() {
        assert!(parse_retention("99999999999years").is_err());
        assert!(parse_retention("forever").unwrap_err().contains("7d"));
        assert_eq!(parse_retention("7d"), Ok(Duration::from_secs(7 * 86_400)));
        let err = check_retention("queue.retention", MAX_RETENTION * 2).unwrap_err();
        assert!(err.to_string().contains("queue.retention"), "{err}");
    }
}
