//! `wharf config default|check|show`: the configuration without starting anything.
//!
//! `check` loads a file (or `--config`/`WHARF_CONFIG`) with the environment, validates every
//! key and every MQTT session (durable identities included), and says what it found; it opens
//! no store and dials no broker. `show` prints the effective configuration (defaults, file,
//! environment, flags) as TOML with every secret replaced by `***`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use wharf::Config;

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the default configuration as TOML.
    Default,
    /// Validate a configuration file and the environment without starting anything.
    Check {
        /// The file (default: --config, WHARF_CONFIG, or none).
        file: Option<PathBuf>,
    },
    /// Print the effective configuration, secrets redacted.
    Show,
}

/// What `check` reports for a valid configuration.
pub fn check(config: &Config, source: Option<&PathBuf>) -> anyhow::Result<ExitCode> {
    let sessions = config.mqtt.resolve()?;
    let from = source.map_or_else(
        || "defaults and environment".to_owned(),
        |p| p.display().to_string(),
    );
    println!("configuration OK ({from})");
    println!(
        "  store: {}",
        wharf::store::postgres::redact(&config.store.url)
    );
    println!("  http.listen: {}", config.http.listen);
    if sessions.is_empty() {
        println!("  mqtt: no sessions");
    }
    for session in &sessions {
        println!(
            "  mqtt session {}: {} ({}), {} subscription(s)",
            session.name,
            session.identity.id(),
            session.identity.describe(),
            session.subscriptions.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The effective configuration as TOML, with the store URL's password and every MQTT password
/// replaced by `***`.
pub fn show(config: &Config) -> anyhow::Result<ExitCode> {
    let mut shown = config.clone();
    shown.store.url = wharf::store::postgres::redact(&shown.store.url);
    for session in shown.mqtt.sessions.values_mut() {
        if session.password.is_some() {
            session.password = Some("***".to_owned());
        }
        session.brokers = session
            .brokers
            .iter()
            .map(|b| wharf::domain::session::redact_url(b))
            .collect();
    }
    let text = toml::to_string_pretty(&shown).context("encoding the configuration as TOML")?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}
