//! `wharf audit sessions --session S`: a managed session's ledger, oldest first: who seeded
//! which baseline, every filter remembered before its SUBSCRIBE, each SUBACK outcome, every
//! filter forgotten (with its UNSUBACK reason), and a migration requirement; with `--lease`,
//! an exclusive session's HA lease stream: each acquire (holder, token, expiry), renew,
//! release, loss (and why) and observed expiry. Writes of an exclusive owner name its claim in
//! their metadata (`--json`).

use std::process::ExitCode;

use crate::config::Config;
use anyhow::Context;
use clap::Args;
use wharf::projections::{session_stream_history, SessionStream};
use wharf_sessions::find_session;

#[derive(Debug, Args)]
pub struct SessionAuditArgs {
    /// A configured session's name or an ms-... durable identity.
    #[arg(long)]
    pub session: String,
    /// Only entries after this ledger position (a previous page's last position).
    #[arg(long, default_value_t = 0)]
    pub after: i64,
    /// Entries per page (1 to 1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
    /// Show the session's HA lease stream (acquire, renew, release, loss, expiry) instead of
    /// its managed-filter ledger.
    #[arg(long)]
    pub lease: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(config: &Config, args: SessionAuditArgs) -> anyhow::Result<ExitCode> {
    let (session_id, _) = find_session(&config.mqtt, &args.session)?;
    let store = wharf::open_existing_store(&config.store).await?;
    store.ensure_migrated().await?;
    let stream = if args.lease {
        SessionStream::Lease
    } else {
        SessionStream::Filters
    };
    let entries =
        session_stream_history(&store, stream, &session_id, args.after, args.limit).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&entries).context("encoding JSON")?
        );
        return Ok(ExitCode::SUCCESS);
    }
    if entries.is_empty() && args.after == 0 && args.lease {
        println!("session {session_id} has no lease events (never acquired: not exclusive?)");
        return Ok(ExitCode::SUCCESS);
    }
    if entries.is_empty() && args.after == 0 {
        println!("session {session_id} has no ledger: its history is unknown (never seeded)");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>8}  {:<24}  {:<22}  detail",
        "position", "recorded_at", "event"
    );
    for entry in &entries {
        println!(
            "{:>8}  {:<24}  {:<22}  {}",
            entry.position,
            entry.recorded_at.format("%Y-%m-%dT%H:%M:%S%.3fZ"),
            entry.event,
            entry.detail
        );
    }
    if entries.len() == args.limit as usize {
        if let Some(last) = entries.last() {
            println!("(more: --after {})", last.position);
        }
    }
    Ok(ExitCode::SUCCESS)
}
