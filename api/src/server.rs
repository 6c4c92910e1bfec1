//! Serving the router with bounds, so a slow or idle client cannot pin the listener (ADR 0018).
//!
//! - **Header-read timeout** (hyper's HTTP/1 `header_read_timeout`): a request's head must
//!   arrive within it, also while a kept-alive connection waits for its next request;
//!   otherwise hyper closes the connection. A header trickled one line at a time is closed.
//! - **Idle timeout**: a per-connection watchdog closes (gracefully) a connection with no
//!   request in flight for this long.
//! - **Request timeout** and **concurrency limit**: a middleware waits for one of
//!   `max_concurrent_requests` permits and runs the handler, both within `request_timeout`;
//!   past it the answer is the JSON error `timeout` (503).
//! - **Store-read limit** (ADRs 0059, 0067): reads beyond what the database can run at once
//!   only lengthen each other's tail; queued, each runs at full speed once it starts. On
//!   Postgres the API reads through a pool of its own of `max_concurrent_reads` connections,
//!   each statement ended by the server after `request_timeout`; on SQLite a request that
//!   reads the store (every path but the probes and the OpenAPI document) waits for one of
//!   `max_concurrent_reads` permits, first come first served. Both within `request_timeout`.
//! - **Body limit**: a declared `Content-Length` above `max_body_bytes` is refused with 413
//!   before any of the body is read; every endpoint is a GET and reads no body.
//! - **Connection limit**: at most `max_connections` connections are served; the accept loop
//!   waits for one to close before accepting more (the rest wait in the listen backlog).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt;
use tracing::Instrument;

use wharf_store::Store;

use crate::error::ApiError;
use crate::state::ApiState;

/// The bounds of the HTTP server. The defaults are those of the `http` configuration section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// How long a client may take to send a request's head.
    pub header_read_timeout: Duration,
    /// How long one request may take, waiting for a concurrency permit included.
    pub request_timeout: Duration,
    /// How long a connection may stay open with no request in flight.
    pub idle_timeout: Duration,
    /// The largest declared request body, in bytes.
    pub max_body_bytes: u64,
    /// The most connections served at once.
    pub max_connections: usize,
    /// The most requests handled at once.
    pub max_concurrent_requests: usize,
    /// The most store reads at once: on Postgres the API's own pool (ADR 0067), on SQLite
    /// permits for every request but the probes and the OpenAPI document.
    pub max_concurrent_reads: usize,
}

/// The default bound on concurrent store reads: this host's cores plus one (two when they
/// cannot be read), at most 64. The listing's reads are CPU work on cached pages: for the
/// embedded SQLite store, and a Postgres on the same host, one per core keeps the database
/// busy and one more covers a read in transit (ADR 0059 has the runs this was chosen on).
pub fn default_max_concurrent_reads() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |cores| cores.get() + 1)
        .min(64)
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_body_bytes: 64 * 1024,
            max_connections: 1024,
            max_concurrent_requests: 256,
            max_concurrent_reads: default_max_concurrent_reads(),
        }
    }
}

struct Bounds {
    permits: Semaphore,
    /// The store-read permits, on SQLite; `None` on Postgres, where the API's own pool is the
    /// bound.
    reads: Option<Semaphore>,
    request_timeout: Duration,
    max_body_bytes: u64,
}

/// The API's router with the request-level bounds (body limit, concurrency limit, request
/// timeout, store reads at once) applied; [`serve_with`] adds the connection-level ones.
///
/// On Postgres the state's reads move to a pool of the API's own, `max_concurrent_reads`
/// connections whose statements end with `request_timeout` (ADR 0067): the bound holds where
/// the reads run, and a request's own work (decoding, JSON) does not hold a database slot.
/// On SQLite a request that reads the store holds one of `max_concurrent_reads` permits.
pub fn bounded_router(state: ApiState, limits: &HttpLimits) -> Router {
    let max_reads = limits.max_concurrent_reads.max(1);
    let (state, reads) = match state.read_model().store() {
        Store::Postgres(pg) => {
            let own = pg.with_own_pool(
                u32::try_from(max_reads).unwrap_or(u32::MAX),
                limits.request_timeout,
            );
            (state.reading_through(Store::Postgres(own)), None)
        }
        Store::Sqlite(_) => (state, Some(Semaphore::new(max_reads))),
    };
    let bounds = Arc::new(Bounds {
        permits: Semaphore::new(limits.max_concurrent_requests.max(1)),
        reads,
        request_timeout: limits.request_timeout,
        max_body_bytes: limits.max_body_bytes,
    });
    let max_body = usize::try_from(limits.max_body_bytes).unwrap_or(usize::MAX);
    crate::router(state)
        .layer(axum::middleware::from_fn_with_state(bounds, bound_request))
        .layer(DefaultBodyLimit::max(max_body))
}

async fn bound_request(
    State(bounds): State<Arc<Bounds>>,
    request: Request,
    next: Next,
) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(length) = declared.filter(|length| *length > bounds.max_body_bytes) {
        return ApiError::PayloadTooLarge {
            length,
            limit: bounds.max_body_bytes,
        }
        .into_response();
    }
    let reads_store = reads_store(request.uri().path());
    let work = async {
        let _permit = bounds.permits.acquire().await;
        let _read = match &bounds.reads {
            Some(reads) if reads_store => Some(reads.acquire().await),
            _ => None,
        };
        if !reads_store {
            return Ok(next.run(request).await);
        }
        // A store read runs to its end in a task of its own, even when the request times out
        // (its permits go back then, as before) or its client goes: a read dropped
        // mid-statement can keep its pool connection for good (sqlx 0.8 gives it back only
        // after a round trip that can hang; ADR 0067), where one that ends gives it back. On
        // Postgres the API's statements end by `statement_timeout` at the latest.
        tokio::spawn(next.run(request).instrument(tracing::Span::current())).await
    };
    match tokio::time::timeout(bounds.request_timeout, work).await {
        Ok(Ok(response)) => response,
        Ok(Err(failed)) => {
            tracing::error!(error = %failed, "a request's handler failed");
            ApiError::Internal(Box::new(failed)).into_response()
        }
        Err(_) => ApiError::TimedOut {
            after: bounds.request_timeout,
        }
        .into_response(),
    }
}

/// Whether a request for `path` reads the store: all but the probes (which must answer while
/// reads queue) and the OpenAPI document. An unknown path counts as a read; it is answered
/// at once anyway.
fn reads_store(path: &str) -> bool {
    use crate::handlers::{DEEPHEALTH_PATH, HEALTHZ_PATH, OPENAPI_PATH, READYZ_PATH};
    ![HEALTHZ_PATH, READYZ_PATH, DEEPHEALTH_PATH, OPENAPI_PATH].contains(&path)
}

/// Serves the API on `listener` with `limits` until `shutdown` completes, then closes idle
/// connections and lets in-flight requests finish.
pub async fn serve_with(
    listener: TcpListener,
    state: ApiState,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(address) = listener.local_addr() {
        tracing::info!(%address, "listing API listening");
    }
    let app = bounded_router(state, &limits);
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed; retrying shortly");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let app = app.clone();
        let limits = limits.clone();
        let stop = stop_rx.clone();
        tasks.spawn(async move {
            serve_connection(stream, app, &limits, stop).await;
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// When a connection last started or finished a request, and how many are in flight.
struct Activity {
    in_flight: AtomicUsize,
    last: Mutex<Instant>,
}

impl Activity {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn last(&self) -> Instant {
        *self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Ends a request's activity when dropped (also when the request future is dropped).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        activity.touch();
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn serve_connection(
    stream: TcpStream,
    app: Router,
    limits: &HttpLimits,
    mut stop: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity {
        in_flight: AtomicUsize::new(0),
        last: Mutex::new(Instant::now()),
    });
    let service = {
        let activity = activity.clone();
        tower::service_fn(move |request: Request<hyper::body::Incoming>| {
            let app = app.clone();
            let in_flight = InFlight::begin(&activity);
            async move {
                let response = app.oneshot(request).await;
                drop(in_flight);
                response
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        let idle_at = activity.last() + limits.idle_timeout;
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = tokio::time::sleep_until(idle_at), if !closing => {
                let idle = activity.in_flight.load(Ordering::SeqCst) == 0
                    && activity.last().elapsed() >= limits.idle_timeout;
                if idle {
                    tracing::debug!("closing an idle connection");
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
            _ = stop.wait_for(|stop| *stop), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handlers::{
        DEEPHEALTH_PATH, GROUPS_PATH, HEALTHZ_PATH, METRICS_PATH, OPENAPI_PATH, READYZ_PATH,
    };

    #[test]
    fn probes_and_the_document_take_no_read_permit_and_everything_else_does() {
        for path in [HEALTHZ_PATH, READYZ_PATH, DEEPHEALTH_PATH, OPENAPI_PATH] {
            assert!(!reads_store(path), "{path}");
        }
        for path in [
            GROUPS_PATH,
            "/api/v1/groups/billing",
            "/api/v1/topics",
            METRICS_PATH,
            "/no/such/path",
        ] {
            assert!(reads_store(path), "{path}");
        }
    }

    #[test]
    fn the_default_read_bound_is_the_cores_plus_one_within_two_and_64() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let bound = default_max_concurrent_reads();
        assert_eq!(bound, (cores + 1).min(64));
        assert_eq!(HttpLimits::default().max_concurrent_reads, bound);
    }
}
