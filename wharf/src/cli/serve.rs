//! `serve`: the REST listing API, plus the catch-up projection loop and the pruner schedule.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tracing::{error, info};
use wharf::projections::{PruneOptions, ReadModel};
use wharf::{Config, Wharf};

/// How often the catch-up projectors poll the log when idle.
const CATCH_UP_EVERY: Duration = Duration::from_millis(500);

pub async fn run(config: Config) -> anyhow::Result<ExitCode> {
    // Install the signal handlers before anything is announced, so a SIGTERM sent as soon as
    // "wharf serving" appears is a graceful stop, not the default kill.
    let shutdown = shutdown_signal()?;
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
    let catch_up = tokio::spawn(catch_up_loop(read.clone(), stop.clone()));
    let pruner = tokio::spawn(prune_loop(wharf.clone(), config.clone(), stop.clone()));
    let state = wharf_api::ApiState::new(read).with_queue(wharf.queue().clone());
    wharf_api::serve(listener, state, shutdown).await?;
    let _ = stop_tx.send(true);
    let _ = tokio::join!(catch_up, pruner);
    info!("wharf stopped");
    Ok(ExitCode::SUCCESS)
}

async fn catch_up_loop(read: ReadModel, mut stop: watch::Receiver<bool>) {
    loop {
        if let Err(e) = read.catch_up().await {
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
        match wharf.read_model().prune(options).await {
            Ok(report) => {
                info!(deleted = report.deleted, cutoff = %report.cutoff, "pruned declaration attempts")
            }
            Err(e) => error!(error = %e, "prune failed; next run at the next interval"),
        }
        match wharf.retain_messages().await {
            Ok(report) => info!(
                messages = report.messages,
                orphaned = report.orphaned_deliveries,
                "message log retention"
            ),
            Err(e) => {
                error!(error = %e, "message log retention failed; next run at the next interval")
            }
        }
    }
}

/// Registers SIGINT and SIGTERM now; the returned future completes when either arrives.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM")?;
        let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT")?;
        Ok(async move {
            tokio::select! {
                _ = terminate.recv() => {},
                _ = interrupt.recv() => {},
            }
            info!("shutdown requested");
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
            info!("shutdown requested");
        })
    }
}
