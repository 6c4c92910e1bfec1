//! SIGINT and SIGTERM: the graceful stop of the long-running commands (`serve`, `tail`); SIGHUP:
//! `serve`'s configuration reload.

use anyhow::Context;
use tracing::info;

/// Registers SIGINT and SIGTERM now; the returned future completes when either arrives.
pub fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
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

/// Registers SIGHUP now; `on_hangup` runs on each one (`serve`'s reload). Elsewhere than on
/// Unix there is no SIGHUP and nothing is registered.
pub fn on_hangup(on_hangup: impl Fn() + Send + 'static) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangup = signal(SignalKind::hangup()).context("installing SIGHUP")?;
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                info!("SIGHUP: reloading the configuration");
                on_hangup();
            }
        });
    }
    #[cfg(not(unix))]
    drop(on_hangup);
    Ok(())
}
