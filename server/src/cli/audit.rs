//! `audit declarations`, `audit swaps` and `groups`: the ledger, what each swap did to the
//! group's messages, and the listing, as a table or JSON.

use std::process::ExitCode;

use crate::config::Config;
use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Args;
use wharf::domain::{GroupName, TopicName};
use wharf::projections::{GroupCursor, GroupQuery, HistoryQuery, MemberCount, ReadModel};

#[derive(Debug, Args)]
pub struct DeclarationsArgs {
    /// The consumer group.
    #[arg(long)]
    pub group: String,
    /// Only entries recorded at or after this RFC 3339 time (e.g. 2024-05-01T12:00:00Z).
    #[arg(long, value_parser = parse_time)]
    pub since: Option<DateTime<Utc>>,
    /// Only entries recorded before this RFC 3339 time (e.g. 2024-05-01T12:00:00Z).
    #[arg(long, value_parser = parse_time)]
    pub until: Option<DateTime<Utc>>,
    /// Only this declarer's entries (hostname:pid:random).
    #[arg(long)]
    pub declarer: Option<String>,
    /// Only entries after this ledger position (a previous page's next_after).
    #[arg(long, default_value_t = 0)]
    pub after: i64,
    /// Entries per page (1 to 1000).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SwapsArgs {
    /// The consumer group.
    #[arg(long)]
    pub group: String,
    /// How many installs to list, newest first (1 to 1000).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(1..=1000))]
    pub limit: i64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GroupsArgs {
    /// Groups per page (1 to 1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
    /// Start after this cursor: the `next` a previous page printed (opaque).
    #[arg(long)]
    pub after: Option<String>,
    /// Only groups consuming this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only groups with at least one open waiter.
    #[arg(long)]
    pub waiting: bool,
    /// Print JSON instead of a table: `{"groups": [...], "next_after": CURSOR or null}`.
    #[arg(long)]
    pub json: bool,
}

/// Parses an RFC 3339 time; the error names the accepted format.
fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text)
        .map(|at| at.with_timezone(&Utc))
        .map_err(|e| {
            format!(
                "{e}: expected an RFC 3339 time such as 2024-05-01T12:00:00Z or \
                 2024-05-01T14:00:00+02:00"
            )
        })
}

async fn read_model(config: &Config) -> anyhow::Result<ReadModel> {
    let store = wharf::open_existing_store(&config.store).await?;
    store.ensure_migrated().await?;
    Ok(ReadModel::new(store, config.declarations.instance_ttl))
}

pub async fn declarations(config: &Config, args: DeclarationsArgs) -> anyhow::Result<ExitCode> {
    let group = GroupName::parse("--group", &args.group)?;
    let query = HistoryQuery {
        group,
        since: args.since,
        until: args.until,
        declarer: args.declarer,
        after: args.after,
        limit: args.limit,
    };
    query.validate()?;
    let page = read_model(config).await?.history(&query).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&page).context("encoding JSON")?
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>8}  {:<9}  {:<24}  {:<32}  {:<12}  {:<24}  patterns",
        "position", "status", "recorded_at", "declarer", "version", "declared_at"
    );
    for entry in &page.entries {
        println!(
            "{:>8}  {:<9}  {:<24}  {:<32}  {:<12}  {:<24}  {}",
            entry.position,
            entry.status,
            entry.recorded_at.format("%Y-%m-%dT%H:%M:%S%.3fZ"),
            entry.declarer,
            entry.version,
            entry.declared_at.format("%Y-%m-%dT%H:%M:%S%.3fZ"),
            show_set(&entry.patterns),
        );
    }
    if let Some(next) = page.next_after {
        println!("(more: --after {next})");
    }
    Ok(ExitCode::SUCCESS)
}

/// What each install did to the group's unacked messages when the router applied it
/// (ADR 0014): kept, set aside, restored, and the log range rescanned.
pub async fn swaps(config: &Config, args: SwapsArgs) -> anyhow::Result<ExitCode> {
    let group = GroupName::parse("--group", &args.group)?;
    let read = read_model(config).await?;
    if !read.is_declared(&group).await? {
        anyhow::bail!("group {:?} was never declared", group.as_str());
    }
    let queue = wharf::queue::Queue::new(read.store().clone(), config.queue.settings());
    let swaps = queue.swaps(&group, args.limit).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&swaps).context("encoding JSON")?
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>8}  {:<24}  {:>6}  {:>9}  {:>8}  {:<17}  patterns",
        "install", "applied_at", "kept", "set_aside", "restored", "rescanned"
    );
    for swap in &swaps {
        println!(
            "{:>8}  {:<24}  {:>6}  {:>9}  {:>8}  {:<17}  {}",
            swap.install,
            swap.applied_at.format("%Y-%m-%dT%H:%M:%S%.3fZ"),
            swap.kept,
            swap.set_aside,
            swap.restored,
            format!("{}..={}", swap.rescan_from, swap.rescan_until),
            show_set(&swap.patterns),
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One page of the listing; the cursor of the next page, when there is one, is printed last
/// (`--after CURSOR`).
pub async fn groups(config: &Config, args: GroupsArgs) -> anyhow::Result<ExitCode> {
    let query = GroupQuery {
        after: args
            .after
            .as_deref()
            .map(|raw| GroupCursor::decode("--after", raw))
            .transpose()?,
        limit: args.limit,
        topic: args
            .topic
            .as_deref()
            .map(|raw| TopicName::parse("--topic", raw))
            .transpose()?,
        waiting: args.waiting,
    };
    let page = read_model(config).await?.groups_page(&query).await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&page).context("encoding JSON")?
        );
        return Ok(ExitCode::SUCCESS);
    }
    for group in &page.groups {
        let count = |c: &MemberCount| format!("{}{}", c.count, if c.more { "+" } else { "" });
        println!(
            "{} (topic {}): {} — installed by {} at {}; {} live instance(s), {} waiter(s)",
            group.group,
            group.topic,
            show_set(&group.effective.patterns),
            group.effective.declarer,
            group.effective.installed_at.to_rfc3339(),
            group.live_instances,
            count(&group.waiters),
        );
        if let Some(waiter) = &group.oldest_waiter {
            println!(
                "    WAITING {} wants {} for {:.0}s (last attempt {:.0}s ago){}",
                waiter.declarer,
                show_set(&waiter.patterns),
                waiter.waiting_seconds,
                waiter.silent_seconds,
                if group.waiters.count > 1 || group.waiters.more {
                    format!(", the oldest of {}", count(&group.waiters))
                } else {
                    String::new()
                }
            );
        }
    }
    if let Some(next) = &page.next_after {
        println!("(more: --after {next})");
    }
    Ok(ExitCode::SUCCESS)
}

fn show_set(patterns: &[String]) -> String {
    if patterns.is_empty() {
        "{whole topic}".to_owned()
    } else {
        format!("{{{}}}", patterns.join(", "))
    }
}
