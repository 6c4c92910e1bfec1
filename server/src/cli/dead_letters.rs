//! `dead-letters list` and `dead-letters replay`: inspect and return a group's failed messages.

use std::process::ExitCode;

use crate::config::Config;
use anyhow::Context;
use clap::{Args, Subcommand};
use wharf::domain::GroupName;
use wharf::Wharf;

#[derive(Debug, Subcommand)]
pub enum DeadLettersCommand {
    /// List a group's dead letters, oldest position first.
    List(ListArgs),
    /// Put one dead letter back in the group's queue with fresh attempts.
    Replay(ReplayArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// The consumer group.
    #[arg(long)]
    pub group: String,
    /// Only entries after this topic position.
    #[arg(long, default_value_t = 0)]
    pub after: i64,
    /// Entries per page (1 to 1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=1000))]
    pub limit: i64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The consumer group.
    #[arg(long)]
    pub group: String,
    /// The dead letter's topic position.
    #[arg(long)]
    pub position: i64,
}

async fn open(config: &Config) -> anyhow::Result<Wharf> {
    let store = wharf::open_existing_store(&config.store).await?;
    store.ensure_migrated().await?;
    Ok(Wharf::with_store(store, &config.settings()))
}

pub async fn run(config: &Config, command: DeadLettersCommand) -> anyhow::Result<ExitCode> {
    match command {
        DeadLettersCommand::List(args) => list(config, args).await,
        DeadLettersCommand::Replay(args) => replay(config, args).await,
    }
}

async fn list(config: &Config, args: ListArgs) -> anyhow::Result<ExitCode> {
    let group = GroupName::parse("--group", &args.group)?;
    let wharf = open(config).await?;
    let letters = wharf
        .queue()
        .dead_letters(&group, args.after, args.limit)
        .await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&letters).context("encoding JSON")?
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>10}  {:>8}  {:<24}  {:<32}  last error",
        "position", "attempts", "dead_at", "subject"
    );
    for letter in &letters {
        println!(
            "{:>10}  {:>8}  {:<24}  {:<32}  {}",
            letter.position,
            letter.attempts,
            letter.dead_at.format("%Y-%m-%dT%H:%M:%S%.3fZ"),
            letter.subject,
            letter.last_error.as_deref().unwrap_or("-")
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn replay(config: &Config, args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let group = GroupName::parse("--group", &args.group)?;
    let wharf = open(config).await?;
    if wharf
        .queue()
        .replay_dead_letter(&group, args.position)
        .await?
    {
        println!("replayed position {} to group {}", args.position, group);
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "error: group {} has no dead letter at position {}",
            group, args.position
        );
        Ok(ExitCode::FAILURE)
    }
}
