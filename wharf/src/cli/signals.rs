//! SIGINT and SIGTERM: the graceful stop of the long-running commands (`serve`, `tail`).

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
