//! The `http` section: the REST listing API and its bounds (ADR 0018).

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ServerError;

/// The REST listing API, and the bounds that keep a slow or idle client from pinning it
/// (ADR 0018).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// The address `serve` listens on (loopback by default).
    pub listen: SocketAddr,
    /// How long a client may take to send a request's headers (also while a kept-alive
    /// connection waits for its next request); the connection is closed after it.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// How long one request may take from its headers to its response; after it the answer is
    /// 503 `unavailable`.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// How long a connection may stay open with no request in flight before it is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// The largest request body accepted, in bytes; larger is 413 (every endpoint is a GET, so
    /// a body is never needed).
    pub max_body_bytes: u64,
    /// The most open connections; further ones wait in the listen backlog until one closes.
    pub max_connections: u32,
    /// The most requests handled at once; further ones wait (within `request_timeout`).
    pub max_concurrent_requests: u32,
    /// The most store reads at once; further ones wait within `request_timeout` (ADR 0059).
    /// On Postgres, the size of the API's own connection pool, beside `store.max_connections`,
    /// whose statements end after `request_timeout` (ADR 0067); on SQLite, permits for every
    /// request but the probes and the OpenAPI document. Default: this host's cores plus one,
    /// at most 64.
    pub max_concurrent_reads: u32,
    /// How long a `/metrics` scrape waits for the store's figures; past it `wharf_store_up` is
    /// 0 and the process counters are served without them. Below `request_timeout`.
    #[serde(with = "humantime_serde")]
    pub metrics_timeout: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_body_bytes: 64 * 1024,
            max_connections: 1024,
            max_concurrent_requests: 256,
            max_concurrent_reads: u32::try_from(wharf_api::default_max_concurrent_reads())
                .unwrap_or(64),
            metrics_timeout: Duration::from_secs(5),
        }
    }
}

impl HttpConfig {
    /// The server bounds these settings describe.
    pub fn limits(&self) -> wharf_api::HttpLimits {
        wharf_api::HttpLimits {
            header_read_timeout: self.header_read_timeout,
            request_timeout: self.request_timeout,
            idle_timeout: self.idle_timeout,
            max_body_bytes: self.max_body_bytes,
            max_connections: self.max_connections as usize,
            max_concurrent_requests: self.max_concurrent_requests as usize,
            max_concurrent_reads: self.max_concurrent_reads as usize,
        }
    }

    pub(super) fn validate(&self) -> Result<(), ServerError> {
        let hour = Duration::from_secs(3600);
        for (key, value) in [
            ("header_read_timeout", self.header_read_timeout),
            ("request_timeout", self.request_timeout),
            ("idle_timeout", self.idle_timeout),
            ("metrics_timeout", self.metrics_timeout),
        ] {
            if value < Duration::from_millis(10) || value > hour {
                return Err(ServerError::Config(format!(
                    "http.{key} must be between 10ms and 1h, got {}",
                    humantime::format_duration(value)
                )));
            }
        }
        if self.metrics_timeout >= self.request_timeout {
            return Err(ServerError::Config(format!(
                "http.metrics_timeout ({}) must be below http.request_timeout ({}): a scrape \
                 answers within the request timeout",
                humantime::format_duration(self.metrics_timeout),
                humantime::format_duration(self.request_timeout)
            )));
        }
        if !(1..=16 * 1024 * 1024).contains(&self.max_body_bytes) {
            return Err(ServerError::Config(format!(
                "http.max_body_bytes must be between 1 and 16777216 (16 MiB), got {}",
                self.max_body_bytes
            )));
        }
        for (key, value) in [
            ("max_connections", self.max_connections),
            ("max_concurrent_requests", self.max_concurrent_requests),
            ("max_concurrent_reads", self.max_concurrent_reads),
        ] {
            if !(1..=65_536).contains(&value) {
                return Err(ServerError::Config(format!(
                    "http.{key} must be between 1 and 65536, got {value}"
                )));
            }
        }
        Ok(())
    }
}
