//! The `log` section: how the `wharf` binary writes its log (ADR 0020).
//!
//! The library itself installs no subscriber: an embedding application decides where its
//! `tracing` events go. This section is what the binary builds its subscriber from.

use serde::{Deserialize, Serialize};

use crate::error::ServerError;

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (coloured when stderr is a terminal).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (the message and the
    /// event's fields), `span` (the current span and its fields) and `spans` (every enclosing
    /// span, outermost first, with its fields).
    Json,
}

/// How the binary logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` (the default) or `json` (one JSON object per line, span fields included).
    pub format: LogFormat,
    /// Which events are written: `RUST_LOG`-style directives such as `info` or
    /// `warn,wharf=debug,sqlx=warn`. `-v` replaces it with `debug` (`-vv`: `trace`), and a
    /// set `RUST_LOG` replaces both.
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            filter: "info".into(),
        }
    }
}

/// What a filter accepts, for error messages.
pub const FILTER_FORMAT: &str = "comma-separated directives LEVEL or TARGET=LEVEL (levels: off, \
     error, warn, info, debug, trace), e.g. \"info\" or \"warn,wharf=debug\"";

/// Parses `RUST_LOG`-style directives; the error names `key`, the value and the format.
pub fn parse_filter(key: &str, value: &str) -> Result<tracing_subscriber::EnvFilter, ServerError> {
    let refuse = |why: String| {
        ServerError::Config(format!(
            "{key} {value:?} is not a valid log filter ({why}): expected {FILTER_FORMAT}"
        ))
    };
    if value.trim().is_empty() {
        return Err(refuse("it is empty".into()));
    }
    // Targets, levels and span names are ASCII; the directive parser of tracing-subscriber
    // 0.3 also slices its input by byte and panics inside a multi-byte character (found by
    // tests/tests/boundary_fuzz.rs with "\n𒐀["), so nothing else reaches it.
    if let Some(c) = value
        .chars()
        .find(|c| !c.is_ascii() || (c.is_control() && *c != '\t'))
    {
        return Err(refuse(format!(
            "it holds the character {:?}; directives are printable ASCII",
            c
        )));
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(value)
        .map_err(|e| refuse(e.to_string()))
}

impl LogConfig {
    pub(crate) fn validate(&self) -> Result<(), ServerError> {
        parse_filter("log.filter", &self.filter).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_ascii_and_control_characters_are_refused_not_a_panic() {
        for bad in ["\n𒐀[", "wharf=dé", "info\u{7}"] {
            let e = parse_filter("log.filter", bad)
                .expect_err("refused")
                .to_string();
            assert!(
                e.contains("log.filter") && e.contains("printable ASCII"),
                "{e}"
            );
        }
    }

    #[test]
    fn filters_are_checked_and_named() {
        for good in [
            "info",
            "warn,wharf=debug",
            "off",
            "wharf::consumer=trace,sqlx=warn",
        ] {
            parse_filter("log.filter", good).unwrap();
        }
        for bad in ["", " ", "wharf=loud", "info,wharf=verbose"] {
            let err = parse_filter("log.filter", bad).unwrap_err().to_string();
            assert!(
                err.contains("log.filter") && err.contains(&format!("{bad:?}")),
                "{err}"
            );
            assert!(err.contains("warn,wharf=debug"), "{err}");
        }
    }

    #[test]
    fn the_format_is_lowercase_in_toml() {
        let text = toml::to_string(&LogConfig::default()).unwrap();
        assert!(text.contains("format = \"text\""), "{text}");
        let json: LogConfig = toml::from_str("format = \"json\"").unwrap();
        assert_eq!(json.format, LogFormat::Json);
        assert!(toml::from_str::<LogConfig>("format = \"xml\"").is_err());
    }

    #[test]
    fn the_environment_sets_the_log_section_and_bad_values_name_their_key() {
        let env = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
        let config = crate::Config::load(None, env("WHARF_LOG__FORMAT", "json")).unwrap();
        assert_eq!(config.log.format, LogFormat::Json);
        let config = crate::Config::load(None, env("WHARF_LOG__FILTER", "warn,wharf=debug"));
        assert_eq!(config.unwrap().log.filter, "warn,wharf=debug");
        let err = crate::Config::load(None, env("WHARF_LOG__FILTER", "wharf=loud")).unwrap_err();
        assert!(err.to_string().contains("log.filter"), "{err}");
        let err = crate::Config::load(None, env("WHARF_LOG__FORMAT", "xml")).unwrap_err();
        assert!(err.to_string().contains("log.format"), "{err}");
    }
}
