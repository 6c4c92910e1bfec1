//! `migrate`, `projections rebuild [--verify]` and `prune [--dry-run]`.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use wharf::projections::{PruneOptions, ReadModel};
use wharf::store::{Progress, RebuildMode};
use wharf::{Config, Wharf};

#[derive(Debug, Args)]
pub struct RebuildArgs {
    /// Rebuild aside, compare with the live projections, change nothing; exit 1 on any difference.
    #[arg(long)]
    pub verify: bool,
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Keep superseded attempts younger than this (overrides prune.retention): a duration
    /// such as 90s, 15m, 24h or 7d, at most 100 years.
    #[arg(long, value_parser = wharf::config::parse_retention)]
    pub retention: Option<Duration>,
}

pub async fn migrate(config: &Config) -> anyhow::Result<ExitCode> {
    let store = wharf::open_store(&config.store).await?;
    let applied = store.migrate().await.context("migration failed")?;
    if applied.is_empty() {
        println!("schema is up to date");
    } else {
        for name in applied {
            println!("applied {name}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn read_model(config: &Config) -> anyhow::Result<ReadModel> {
    let store = wharf::open_existing_store(&config.store).await?;
    store.ensure_migrated().await?;
    Ok(ReadModel::new(store, config.declarations.instance_ttl))
}

pub async fn rebuild(config: &Config, args: RebuildArgs) -> anyhow::Result<ExitCode> {
    let read = read_model(config).await?;
    let mode = if args.verify {
        RebuildMode::Verify
    } else {
        RebuildMode::Apply
    };
    let bar = progress_bar();
    let progress: Progress = {
        let bar = bar.clone();
        Arc::new(move |done, total| {
            if let Some(bar) = &bar {
                bar.set_length(total);
                bar.set_position(done);
            }
        })
    };
    let report = read.rebuild(mode, progress).await?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    println!(
        "replayed {} events (last position {})",
        report.events, report.last_position
    );
    if !args.verify {
        println!("projections rebuilt and swapped in");
        return Ok(ExitCode::SUCCESS);
    }
    if report.is_clean() {
        println!("verify: live projections match the replay");
        return Ok(ExitCode::SUCCESS);
    }
    println!("verify: DIFFERENCES FOUND");
    println!("{:<28} {:>10} {:>13}", "table", "only live", "only rebuilt");
    for diff in &report.differences {
        println!(
            "{:<28} {:>10} {:>13}",
            diff.table, diff.only_live, diff.only_rebuilt
        );
    }
    Ok(ExitCode::FAILURE)
}

fn progress_bar() -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(0);
    let style = ProgressStyle::with_template("{bar:40} {pos}/{len} events ({eta} left)")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    Some(bar)
}

pub async fn prune(config: &Config, args: PruneArgs) -> anyhow::Result<ExitCode> {
    let read = read_model(config).await?;
    let report = read
        .prune(PruneOptions {
            retention: args.retention.unwrap_or(config.prune.retention),
            dry_run: args.dry_run,
            batch: config.prune.batch,
        })
        .await?;
    if report.dry_run {
        println!(
            "dry run: {} superseded waiting attempts recorded before {} would be deleted",
            report.eligible,
            report.cutoff.to_rfc3339()
        );
        println!("dry run: message log retention skipped");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "deleted {} superseded waiting attempts recorded before {}",
        report.deleted,
        report.cutoff.to_rfc3339()
    );
    let wharf = Wharf::with_store(read.store().clone(), config);
    let retained = wharf.retain_messages().await?;
    println!(
        "message log: deleted {} messages, {} orphaned deliveries, {} set-aside deliveries",
        retained.messages, retained.orphaned_deliveries, retained.set_aside_dropped
    );
    Ok(ExitCode::SUCCESS)
}
