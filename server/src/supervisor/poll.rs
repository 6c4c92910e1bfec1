//! Watching the configuration file: its bytes are read every poll interval (polling, not
//! inotify: it sees a file replaced by a rename, a mounted ConfigMap's symlink swap and an edit
//! in place alike, and costs one small read per interval).
//!
//! A reload is requested when the contents differ from those last requested (or read at
//! start) **and** two consecutive reads agree, so a file caught half-written by an editor that
//! writes in place is not loaded: a change takes effect one to two intervals after it is made.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Reloader;

pub(super) async fn poll_file(
    path: PathBuf,
    every: Duration,
    reloader: Reloader,
    stopped: impl Future<Output = ()>,
) {
    tokio::pin!(stopped);
    let mut requested = read(&path).await;
    let mut previous = requested.clone();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = &mut stopped => return,
        }
        let now = read(&path).await;
        let settled = now == previous;
        previous = now.clone();
        if !settled || now == requested {
            continue;
        }
        if now.is_none() {
            tracing::warn!(path = %path.display(), "the configuration file cannot be read; polling on");
        } else {
            tracing::info!(path = %path.display(), "the configuration file changed; reloading");
            reloader.request_reload("file changed");
        }
        requested = now;
    }
}

async fn read(path: &Path) -> Option<Vec<u8>> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::read(path).ok())
        .await
        .ok()
        .flatten()
}
