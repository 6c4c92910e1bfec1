//! `serve`: the REST listing API (with `/metrics` and deep health), the session supervisor
//! (SIGHUP and a changed configuration file reload the `mqtt` section, ADR 0029), plus the
//! catch-up projection loop and the pruner schedule.

use std::process::ExitCode;
use std::time::Duration;

use crate::config::Config;
use crate::supervisor::{ConfigLoader, ConfigWatch, Supervisor};
use anyhow::Context;
use tokio::sync::watch;
use tracing::{error, info, warn};
use wharf::metrics::StoreOperation;
use wharf::projections::{PruneOptions, ReadModel};
use wharf::store::sqlite::{quick_check, QuickCheck};
use wharf::store::StoreLocation;
use wharf::{Metrics, Wharf};
use wharf_sessions::SessionStatus;

use super::signals::{on_hangup, shutdown_signal};

/// How often the catch-up projectors poll the log when idle.
const CATCH_UP_EVERY: Duration = Duration::from_millis(500);

/// The longest the start-up integrity check of a SQLite file may take; a larger file is
/// served unchecked (with a warning) rather than delaying start without bound.
const QUICK_CHECK_BUDGET: Duration = Duration::from_secs(30);

pub async fn run(
    config: Config,
    (path, loader): (Option<std::path::PathBuf>, ConfigLoader),
) -> anyhow::Result<ExitCode> {
    // Install the signal handlers before anything is announced, so a SIGTERM sent as soon as
    // "wharf serving" appears is a graceful stop, not the default kill.
    let shutdown = shutdown_signal()?;
    // SIGHUP too, before anything is announced: its default action would end the process. One
    // that arrives before the supervisor runs is a reload request waiting for it.
    let (hangup_tx, mut hangups) = tokio::sync::mpsc::unbounded_channel();
    on_hangup(move || {
        let _ = hangup_tx.send(());
    })?;
    check_sqlite_integrity(&config).await?;
    let wharf = Wharf::open(&config.settings())
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
    let supervisor = std::sync::Arc::new(
        Supervisor::start(&wharf, config.clone(), loader).context("starting the MQTT sessions")?,
    );
    let reloader = supervisor.reloader();
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            reloader.request_reload("SIGHUP");
        }
    });
    if let Some(path) = path {
        supervisor.watch_file(path, config.mqtt.reload_poll_interval);
    }
    let sessions_of = supervisor.clone();
    let deep_of = supervisor.clone();
    let state = wharf_api::ApiState::new(read)
        .with_queue(wharf.queue().clone())
        .with_metrics(wharf.metrics().clone())
        .scrape_timeout(config.http.metrics_timeout)
        .with_sessions(move || {
            sessions_of
                .sessions()
                .iter()
                .map(live_session)
                .collect::<Vec<_>>()
        })
        .with_deep_health(move || wharf_api::DeepReport {
            sessions: deep_of.sessions().iter().map(deep_session).collect(),
            config_watch: Some(config_watch(&deep_of.config_watch())),
            // `serve` runs no consumers of its own.
            consumers: Vec::new(),
        });
    wharf_api::serve_with(listener, state, config.http.limits(), shutdown).await?;
    let _ = stop_tx.send(true);
    supervisor.shutdown().await;
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
        // An exclusive session standing by while another process holds its lease is this
        // process doing its part: not ready would stall every rolling deploy of a pair.
        ready: status.level.is_ready() || status.stands_by(),
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

/// A session's status as deep health reports it.
fn deep_session(status: &SessionStatus) -> wharf_api::DeepSession {
    wharf_api::DeepSession {
        name: status.name.clone(),
        session_id: status.session_id.clone(),
        level: status.level.as_str().to_owned(),
        reason: status.reason.clone(),
        generation: status.generation,
        lease: status.lease.as_ref().map(|l| wharf_api::LeaseReport {
            held: l.held,
            holder: l.holder.clone(),
            token: l.token,
            expires_at: l.expires_at,
        }),
    }
}

/// The supervisor's config watch as deep health reports it.
fn config_watch(watch: &ConfigWatch) -> wharf_api::ConfigWatchReport {
    wharf_api::ConfigWatchReport {
        applied_generation: watch.applied_generation,
        converged_generation: watch.converged_generation,
        degraded: watch.degraded,
        reason: watch.reason.clone(),
        strategy: watch.strategy.to_owned(),
        last_reload: watch
            .last_reload
            .as_ref()
            .map(|r| wharf_api::ReloadSummary {
                outcome: r.outcome.as_str().to_owned(),
                generation: r.generation,
                trigger: r.trigger.clone(),
                reason: r.reason.clone(),
                at: r.at,
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
