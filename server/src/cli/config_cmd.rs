//! `wharf config default|check|show`: the configuration without starting anything.
//!
//! `check` loads a file (or `--config`/`WHARF_CONFIG`) with the environment, validates every
//! key and every MQTT session (durable identities included), and says what it found; it opens
//! no store and dials no broker. With `--store` it also runs the identity guard against the
//! store (read only, applying nothing): each persistent session's identity known (seeded) or
//! not, the identities the store records that no configured session resolves to, and a
//! refusal when a configured session is unknown while such an identity still holds filters
//! (the signature of a changed identity, ADR 0029). `show` prints the effective configuration (defaults, file,
//! environment, flags) as TOML with every secret replaced by `***`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::Config;
use anyhow::Context;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the default configuration as TOML.
    Default,
    /// Validate a configuration file and the environment without starting anything.
    Check {
        /// The file (default: --config, WHARF_CONFIG, or none).
        file: Option<PathBuf>,
        /// Also run the identity guard against the store (an existing one, read only): which
        /// persistent sessions it knows, and whether an identity seems to have changed.
        #[arg(long)]
        store: bool,
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

/// `check --store`: the identity guard against the store's session ledger. Exit 1 when a
/// configured persistent session is unknown to the store while the store records another
/// identity, configured nowhere in this file, that still holds filters.
pub async fn check_store(config: &Config) -> anyhow::Result<ExitCode> {
    let sessions = config.mqtt.resolve()?;
    let store = wharf::open_existing_store(&config.store)
        .await
        .context("opening the store for the identity check (--store)")?;
    let read = wharf::projections::ReadModel::new(store, config.declarations.instance_ttl);
    let recorded = read
        .managed_sessions(None)
        .await
        .context("reading the session ledger")?;
    println!("identity check against the store:");
    let mut unknown = Vec::new();
    for session in sessions.iter().filter(|s| s.is_durable()) {
        let id = session.identity.id();
        match recorded.iter().find(|r| r.session_id == id) {
            Some(view) => println!(
                "  mqtt session {}: {id} is seeded ({} filter(s) in its history{})",
                session.name,
                view.filters.len(),
                if view.migration_required.is_some() {
                    ", migration required"
                } else {
                    ""
                }
            ),
            None => {
                println!(
                    "  mqtt session {}: {id} is NOT known to the store: it stays down until \
                     seeded (`wharf sessions seed {}`)",
                    session.name, session.name
                );
                unknown.push(session.name.clone());
            }
        }
    }
    let configured: Vec<&str> = sessions.iter().map(|s| s.identity.id()).collect();
    let orphans: Vec<_> = recorded
        .iter()
        .filter(|r| !configured.contains(&r.session_id.as_str()))
        .collect();
    for view in &orphans {
        println!(
            "  recorded but not configured here: {} ({} filter(s) in its history)",
            view.session_id,
            view.filters.len()
        );
    }
    let holding: Vec<String> = orphans
        .iter()
        .filter(|v| !v.filters.is_empty())
        .map(|v| v.session_id.clone())
        .collect();
    if !unknown.is_empty() && !holding.is_empty() {
        eprintln!(
            "identity guard: mqtt.sessions.{} resolve(s) to an identity the store does not \
             know, while the store records {} holding filters that no configured session \
             resolves to: if a session's brokers, client_id, mode, clean_start or \
             session_expiry changed, its old identity's filters remain subscribed at the \
             broker. Revert the change, or follow the maintenance cutover \
             (docs/runbooks/config-rollback.md)",
            unknown.join(", mqtt.sessions."),
            holding.join(", ")
        );
        return Ok(ExitCode::FAILURE);
    }
    println!("identity check OK");
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
