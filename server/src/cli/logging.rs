//! The binary's log subscriber, built from the `log` section (ADR 0020).
//!
//! Which events are written, first match wins: `RUST_LOG` when set (and not empty), then
//! `-v` (`debug`) / `-vv` (`trace`), then `log.filter` (default `info`). A `RUST_LOG` that does
//! not parse is refused, naming it, like a bad `log.filter`.
//!
//! `tail` writes its own status lines (waiting, consuming, stalled) in place of the consumer
//! lifecycle's events, which would repeat the WAITING warning at every retry: with text logs
//! and the filter from `log.filter`, it adds `wharf::consumer=error` unless the filter names
//! `wharf::consumer` itself. `-v`, `RUST_LOG` and JSON logs keep every event.

use std::io::IsTerminal;

use crate::config::{parse_filter, LogConfig, LogFormat};
use tracing_subscriber::EnvFilter;

/// The target whose events `tail` replaces with its own lines.
const CONSUMER_TARGET: &str = "wharf::consumer";

/// The filter the precedence above picks.
fn filter(verbose: u8, log: &LogConfig, own_consumer_lines: bool) -> anyhow::Result<EnvFilter> {
    if let Some(directives) = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        return Ok(parse_filter("RUST_LOG", &directives)?);
    }
    let directives = match verbose {
        0 => log.filter.as_str(),
        1 => "debug",
        _ => "trace",
    };
    let filter = parse_filter("log.filter", directives)?;
    let quiet = own_consumer_lines
        && verbose == 0
        && log.format == LogFormat::Text
        && !log.filter.contains(CONSUMER_TARGET);
    if !quiet {
        return Ok(filter);
    }
    Ok(filter.add_directive(format!("{CONSUMER_TARGET}=error").parse()?))
}

/// Installs the subscriber: text (coloured only on a terminal) or JSON lines, on stderr.
/// `own_consumer_lines`: the command prints its own consumer status lines (`tail`).
pub fn init(verbose: u8, log: &LogConfig, own_consumer_lines: bool) -> anyhow::Result<()> {
    let filter = filter(verbose, log, own_consumer_lines)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match log.format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .with_ansi(false)
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
}
