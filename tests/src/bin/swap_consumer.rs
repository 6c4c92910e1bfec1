//! A consumer process for the real-process swap tests (`tests/tests/swap_processes.rs`).
//!
//! `swap_consumer STORE_URL SCHEMA GROUP TOPIC HANDLE_MS OUT PATTERN...` consumes GROUP on TOPIC
//! with the given binding set, one message at a time (`WHARF_QUEUE__*` variables change the
//! queue section, e.g. `WHARF_QUEUE__CONCURRENCY`); each handler sleeps HANDLE_MS, then
//! appends `position subject routed_by` to OUT (flushed and synced) and succeeds, so the message
//! is acked after the line is durable. It prints its lifecycle states to stdout (`waiting`,
//! `consuming <install>`, ...). SIGTERM shuts it down gracefully (drain, then leave); SIGKILL is
//! the crash. SCHEMA is `-` on SQLite. Timings come from the usual `WHARF_DECLARATIONS__*` and
//! `WHARF_QUEUE__*` variables.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};
use wharf::handler::{handler_fn, HandlerError};
use wharf::queue::Claimed;
use wharf::{ConsumerState, Registration, Wharf};
use wharf_server::Config;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, schema, group, topic, handle_ms, out, patterns @ ..] = args.as_slice() else {
        anyhow::bail!("usage: swap_consumer STORE_URL SCHEMA GROUP TOPIC HANDLE_MS OUT PATTERN...");
    };
    let env = std::env::vars().filter(|(name, _)| {
        name.starts_with("WHARF_DECLARATIONS__") || name.starts_with("WHARF_QUEUE__")
    });
    let mut config = Config::load(None, env)?;
    config.store.url = url.clone();
    if schema != "-" {
        config.store.schema = schema.clone();
    }
    config.store.auto_migrate = false;
    // One message at a time and a short poll, unless the caller says otherwise.
    if std::env::var_os("WHARF_QUEUE__CONCURRENCY").is_none() {
        config.queue.concurrency = 1;
    }
    if std::env::var_os("WHARF_QUEUE__POLL_INTERVAL").is_none() {
        config.queue.poll_interval = Duration::from_millis(50);
    }
    let handle = Duration::from_millis(handle_ms.parse().context("HANDLE_MS")?);
    let wharf = Wharf::open(&config.settings()).await?;
    let registration = Registration::new(group, topic, "1", patterns)?;
    let out = out.clone();
    let consumer = wharf.consume_with(
        registration,
        handler_fn(move |message: Claimed| {
            let out = out.clone();
            async move {
                tokio::time::sleep(handle).await;
                record(&out, &message).map_err(HandlerError::from_error)
            }
        }),
    );
    let mut states = consumer.watch();
    let mut term = signal(SignalKind::terminate())?;
    loop {
        let line = match &*states.borrow_and_update() {
            ConsumerState::Declaring => "declaring".to_owned(),
            ConsumerState::Waiting { .. } => "waiting".to_owned(),
            ConsumerState::Consuming { install, .. } => format!("consuming {install}"),
            ConsumerState::Stalled { .. } => "stalled".to_owned(),
            ConsumerState::Failed { reason } => format!("failed {reason}"),
            ConsumerState::Stopped => "stopped".to_owned(),
        };
        println!("{line}");
        std::io::stdout().flush()?;
        tokio::select! {
            changed = states.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            _ = term.recv() => break,
        }
    }
    consumer.shutdown().await;
    println!("shut down");
    Ok(())
}

/// Appends the handled message to `out`, durably, before the handler returns (and so before the
/// ack).
fn record(out: &str, message: &Claimed) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)?;
    // One write of the whole line: handlers running at once append to the same file, and the
    // pieces of a `writeln!` are separate writes that could interleave.
    let line = format!(
        "{} {} {}\n",
        message.position, message.subject, message.routed_by
    );
    file.write_all(line.as_bytes())?;
    file.sync_all()
}
