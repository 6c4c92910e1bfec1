//! Watching the configuration file: its bytes are read every poll interval and compared with
//! the previous poll's (polling, not inotify: it sees a file replaced by a rename, a mounted
//! ConfigMap's symlink swap and an edit in place alike, and costs one small read per interval).

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
    let mut last = read(&path).await;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = &mut stopped => return,
        }
        let now = read(&path).await;
        if now == last {
            continue;
        }
        if now.is_none() {
            tracing::warn!(path = %path.display(), "the configuration file cannot be read; polling on");
        } else {
            tracing::info!(path = %path.display(), "the configuration file changed; reloading");
            reloader.request_reload("file changed");
        }
        last = now;
    }
}

async fn read(path: &Path) -> Option<Vec<u8>> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::read(path).ok())
        .await
        .ok()
        .flatten()
}
