//! What a session runtime needs beside its session: the `mqtt` timings and batch sizes, the
//! resolved password and TLS files, the lease timing and the process identity a lease holder
//! names. The supervision (`runtime.rs`), a run (`run.rs`) and an exclusive session's lease
//! holding (`exclusive.rs`) all read it.

use std::time::Duration;

use wharf_domain::lease::LeaseTiming;
use wharf_domain::DeclarerId;

/// What a session runtime needs beside its session.
#[derive(Clone)]
pub struct RuntimeSettings {
    /// `mqtt.unmatched_grace`.
    pub unmatched_grace: Duration,
    /// `mqtt.connect_timeout`.
    pub connect_timeout: Duration,
    /// `mqtt.subscribe_timeout`.
    pub subscribe_timeout: Duration,
    /// `mqtt.ingest_batch`.
    pub ingest_batch: usize,
    /// `mqtt.ingest_batch_bytes`.
    pub ingest_batch_bytes: usize,
    /// The password, resolved from the configuration (never logged).
    pub password: Option<String>,
    /// The first retry's wait; doubled per failed run up to `retry_cap`.
    pub retry_base: Duration,
    /// The longest wait between runs.
    pub retry_cap: Duration,
    /// The deadline of every ledger call (a store that does not answer fails the run).
    pub store_deadline: Duration,
    /// TLS for `mqtts://` brokers, its files read when the runtime was set up.
    pub tls: Option<wharf_mqtt::TlsOptions>,
    /// The HA lease timing (exclusive sessions only).
    pub lease: LeaseTiming,
    /// The process an exclusive session's lease holder names (each runtime holds as this
    /// identity plus `:sN`, so two runtimes of one process never share a claim).
    pub process: DeclarerId,
}

impl RuntimeSettings {
    /// Whether an ingest batch of `deliveries` holding `bytes` of payload is full: at
    /// `mqtt.ingest_batch` deliveries, or once its payloads reached `mqtt.ingest_batch_bytes`.
    pub(super) fn ingest_batch_full(&self, deliveries: usize, bytes: usize) -> bool {
        deliveries >= self.ingest_batch.max(1) || bytes >= self.ingest_batch_bytes
    }
}
