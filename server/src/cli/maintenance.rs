//! `migrate`, `projections rebuild [--verify]` and `prune [--dry-run]`.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use wharf::projections::{PruneOptions, ReadModel};
use wharf::store::{Progress, RebuildMode};
use wharf::Wharf;

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
    #[arg(long, value_parser = crate::config::parse_retention)]
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
    let started = Instant::now();
    let report = read.rebuild(mode, progress()).await?;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "replayed {} events (last position {}) in {seconds:.1} s ({:.0} events/s)",
        report.events,
        report.last_position,
        report.events as f64 / seconds.max(1e-6)
    );
    if !args.verify {
        println!("projections rebuilt and swapped in");
        let written = read
            .rederive_snapshots(config.declarations.snapshot_every)
            .await?;
        println!("group snapshots re-derived: {written}");
        return Ok(ExitCode::SUCCESS);
    }
    let snapshots = read.verify_snapshots().await?;
    for ignored in &snapshots.ignored {
        println!(
            "verify: group snapshot of \"{}\" at sequence {} ignored: {}",
            ignored.group, ignored.sequence, ignored.problem
        );
    }
    if report.is_clean() && snapshots.is_clean() {
        println!(
            "verify: live projections match the replay; {} group snapshots match their events",
            snapshots.checked
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("verify: DIFFERENCES FOUND");
    if !report.is_clean() {
        println!("{:<28} {:>10} {:>13}", "table", "only live", "only rebuilt");
        for diff in &report.differences {
            println!(
                "{:<28} {:>10} {:>13}",
                diff.table, diff.only_live, diff.only_rebuilt
            );
        }
    }
    for wrong in &snapshots.wrong {
        println!(
            "verify: group snapshot of \"{}\" at sequence {} is wrong: {}",
            wrong.group, wrong.sequence, wrong.problem
        );
    }
    Ok(ExitCode::FAILURE)
}

/// On a terminal, a progress bar on stderr (events/s, ETA), cleared when done; otherwise a
/// plain line on stderr at each tenth of the log, so a log or a supervisor sees it advance.
fn progress() -> Progress {
    if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(0);
        let style =
            ProgressStyle::with_template("{bar:40} {pos}/{len} events, {per_sec}, {eta} left")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        return Arc::new(move |done, total| {
            bar.set_length(total);
            bar.set_position(done);
            if done >= total {
                bar.finish_and_clear();
            }
        });
    }
    let tenths = AtomicU64::new(0);
    Arc::new(move |done, total| {
        let tenth = (done * 10).checked_div(total).unwrap_or(10);
        if tenth > tenths.load(Ordering::Relaxed) {
            tenths.store(tenth, Ordering::Relaxed);
            eprintln!("rebuild: {done}/{total} events replayed");
        }
    })
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
    let wharf = Wharf::with_store(read.store().clone(), &config.settings());
    let retained = wharf.retain_messages().await?;
    println!(
        "message log: deleted {} messages, {} orphaned deliveries, {} set-aside deliveries",
        retained.messages, retained.orphaned_deliveries, retained.set_aside_dropped
    );
    Ok(ExitCode::SUCCESS)
}
