//! `serve`: the REST listing API (with `/metrics`), plus the catch-up projection loop and the
//! pruner schedule.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tracing::{error, info, warn};
use wharf::metrics::StoreOperation;
use wharf::projections::{PruneOptions, ReadModel};
use wharf::sessions::SessionStatus;
use wharf::store::sqlite::{quick_check, QuickCheck};
use wharf::store::StoreLocation;
use wharf::{Config, Metrics, Wharf};

use super::signals::shutdown_signal;

/// How often the catch-up projectors poll the log when idle.
const CATCH_UP_EVERY: Duration = Duration::from_millis(500);

/// The longest the start-up integrity check of a SQLite file may take; a larger file is
/// served unchecked (with a warning) rather than delaying start without bound.
const QUICK_CHECK_BUDGET: Duration = Duration::from_secs(30);

pub async fn run(config: Config) -> anyhow::Result<ExitCode> {
    // Install the signal handlers before anything is announced, so a SIGTERM sent as soon as
    // "wharf serving" appears is a graceful stop, not the default kill.
    let shutdown = shutdown_signal()?;
    check_sqlite_integrity(&config).await?;
    let wharf = Wharf::open(&config)
        .await
        .context("opening the store (serve fails closed when it is unreachable)")?;
    let read = wharf.read_model().clone();
    let listener = tokio::net::TcpListener::bind(config.http.listen)
        .await
        .with_context(|| format!("binding http.listen {}", config.http.listen))?;
    info!(
        listen = %listener.local_addr()?,
        backend = wharf.store().backend(),
        declarer = %wharf.declarer(),
        "wharf serving"
    );
    let (stop_tx, stop) = watch::channel(false);
    let catch_up = tokio::spawn(catch_up_loop(
        read.clone(),
        wharf.metrics().clone(),
        stop.clone(),
    ));
    let pruner = tokio::spawn(prune_loop(wharf.clone(), config.clone(), stop.clone()));
    let sessions = wharf
        .start_sessions(&config)
        .context("starting the MQTT sessions")?;
    let mut state = wharf_api::ApiState::new(read)
        .with_queue(wharf.queue().clone())
        .with_metrics(wharf.metrics().clone())
        .scrape_timeout(config.http.metrics_timeout);
    if !sessions.is_empty() {
        let watches: Vec<_> = sessions.iter().map(|s| s.watch()).collect();
        state = state.with_sessions(move || {
            watches
                .iter()
                .map(|w| live_session(&w.borrow()))
                .collect::<Vec<_>>()
        });
    }
    wharf_api::serve_with(listener, state, config.http.limits(), shutdown).await?;
    let _ = stop_tx.send(true);
    for session in sessions {
        session.shutdown().await;
    }
    let _ = tokio::join!(catch_up, pruner);
    info!("wharf stopped");
    Ok(ExitCode::SUCCESS)
}

/// A session runtime's status as the API reports it.
fn live_session(status: &SessionStatus) -> wharf_api::LiveSession {
    wharf_api::LiveSession {
        name: status.name.clone(),
        session_id: status.session_id.clone(),
        identity: status.identity.clone(),
        level: status.level.as_str().to_owned(),
        ready: status.level.is_ready(),
        reason: status.reason.clone(),
        generation: status.generation,
        pending_stale: status.pending_stale.clone(),
        last_reconcile: status
            .last_reconcile
            .as_ref()
            .map(|r| wharf_api::ReconcileReport {
                converged: r.converged,
                detail: r.detail.clone(),
            }),
        ingested: status.ingested,
        held: status.held,
        dropped_unmatched: status.dropped_unmatched,
        lease: status.lease.as_ref().map(|l| wharf_api::LiveLease {
            held: l.held,
            holder: l.holder.clone(),
            token: l.token,
            expires_at: l.expires_at,
            transitions: l.transitions,
        }),
    }
}

/// Refuses to serve an existing SQLite file that `PRAGMA quick_check` finds damaged: a corrupt
/// page would otherwise fail the listing and the catch-up loop forever while the process
/// looks up.
async fn check_sqlite_integrity(config: &Config) -> anyhow::Result<()> {
    let Ok(StoreLocation::Sqlite(path)) = StoreLocation::parse(&config.store.url) else {
        return Ok(());
    };
    if !path.is_file() {
        return Ok(());
    }
    let started = std::time::Instant::now();
    match quick_check(&path, QUICK_CHECK_BUDGET).await? {
        QuickCheck::Ok => {
            info!(path = %path.display(), elapsed_ms = started.elapsed().as_millis() as u64, "SQLite integrity check passed");
            Ok(())
        }
        QuickCheck::Unfinished => {
            warn!(
                path = %path.display(),
                budget = %humantime::format_duration(QUICK_CHECK_BUDGET),
                "SQLite integrity check did not finish within its budget; serving unchecked"
            );
            Ok(())
        }
        QuickCheck::Corrupt(problems) => anyhow::bail!(
            "the SQLite file {} failed its integrity check (PRAGMA quick_check): {}; \
             serve refuses to start on a damaged store: stop every process using it and \
             restore it from a backup or recover it (docs/runbooks/sqlite-corruption.md)",
            path.display(),
            problems.join("; ")
        ),
    }
}

async fn catch_up_loop(read: ReadModel, metrics: Metrics, mut stop: watch::Receiver<bool>) {
    let errors = metrics.store_errors().counter(StoreOperation::CatchUp);
    loop {
        if let Err(e) = read.catch_up().await {
            errors.inc();
            error!(error = %e, "catch-up projection failed; retrying");
        }
        tokio::select! {
            _ = tokio::time::sleep(CATCH_UP_EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Every `prune.interval`: trims superseded declaration attempts, then runs log retention.
async fn prune_loop(wharf: Wharf, config: Config, mut stop: watch::Receiver<bool>) {
    if config.prune.interval.is_zero() {
        return;
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(config.prune.interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let options = PruneOptions {
            retention: config.prune.retention,
            dry_run: false,
            batch: config.prune.batch,
        };
        match wharf.prune_declarations(options).await {
            Ok(report) => {
                info!(deleted = report.deleted, cutoff = %report.cutoff, "pruned declaration attempts")
            }
            Err(e) => error!(error = %e, "prune failed; next run at the next interval"),
        }
        match wharf.retain_messages().await {
            Ok(report) => info!(
                messages = report.messages,
                orphaned = report.orphaned_deliveries,
                set_aside_dropped = report.set_aside_dropped,
                "message log retention"
            ),
            Err(e) => {
                error!(error = %e, "message log retention failed; next run at the next interval")
            }
        }
    }
}
