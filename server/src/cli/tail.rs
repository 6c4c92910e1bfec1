//! `tail`: a real consumer of a group, in the terminal (ADR 0020).
//!
//! It declares the group's set (its `--pattern`s; none = the whole topic) like any library
//! consumer (`Wharf::consume_with`), so behind a live instance that declares a different set
//! it waits, and says so on stderr (again whenever the incumbent set or its live declarers
//! change). Once its declaration is in effect it prints each message it claims to stdout and
//! acks it after printing, one at a time (concurrency 1), so the output is in claim order.
//!
//! `--no-ack` peeks, as a RabbitMQ consumer that never acks or a Kafka consumer that never
//! commits would: each message it prints stays claimed by it while it runs (the claim is
//! extended, up to `queue.max_claim_hold`), so it prints each message once and no other
//! instance gets it meanwhile; on exit it gives every held message back with a nack whose
//! reason says so. The message is claimable again after `queue.backoff_base`, with the peek
//! counted as an attempt (like a requeue under a RabbitMQ quorum queue's delivery limit).
//! It holds at most `--max-unacked` messages at once and claims nothing more until it exits.
//! It runs on one thread, so even with several messages held the printing order is the
//! claim order.
//!
//! SIGINT or SIGTERM stops it gracefully (`Consumer::shutdown`: stop claiming, finish what is
//! being printed, leave the group's live instances), so a waiting set can swap in at once.

mod format;

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::config::Config;
use crate::config::LogFormat;
use clap::Args;
use tokio::sync::watch;
use wharf::domain::{AppVersion, BindingSet, GroupName, TopicName, ValidationError};
use wharf::queue::Claimed;
use wharf::{handler_fn, ConsumerState, HandlerError, Registration, Wharf};

use super::signals::shutdown_signal;

/// The reason a `--no-ack` tail records when it gives a message back.
pub const NO_ACK_REASON: &str = "not acknowledged: printed by `wharf tail --no-ack` (a peek)";

#[derive(Debug, Args)]
pub struct TailArgs {
    /// The consumer group this tail joins as one more instance.
    #[arg(long)]
    pub group: String,
    /// The topic the group consumes.
    #[arg(long)]
    pub topic: String,
    /// A binding pattern (an MQTT topic filter: `+` one level, `#` the rest); repeat the flag
    /// for more. The patterns are the group's whole declared set; none = the whole topic.
    #[arg(long = "pattern", value_name = "PATTERN")]
    pub patterns: Vec<String>,
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Peek: hold each printed message unacknowledged while running, give them all back on
    /// exit (claimable again after queue.backoff_base, one attempt used).
    #[arg(long)]
    pub no_ack: bool,
    /// With --no-ack: the most messages held at once (1 to 10000).
    #[arg(long, default_value_t = 100, requires = "no_ack",
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_unacked: u32,
}

/// The declaration the arguments describe; errors name the flag and the value.
fn registration(args: &TailArgs) -> anyhow::Result<Registration> {
    let bindings = BindingSet::parse(&args.patterns).map_err(|e| ValidationError {
        field: "--pattern".into(),
        ..e
    })?;
    Ok(Registration {
        group: GroupName::parse("--group", &args.group)?,
        topic: TopicName::parse("--topic", &args.topic)?,
        version: AppVersion::parse("version", env!("CARGO_PKG_VERSION"))?,
        bindings,
    })
}

/// Prints messages to stdout; a failed write (a closed pipe) is reported on `closed`.
struct Output {
    json: bool,
    printed: AtomicU64,
    closed: watch::Sender<bool>,
}

impl Output {
    fn print(&self, message: &Claimed) -> Result<(), HandlerError> {
        let line = if self.json {
            format::json(message)
        } else {
            format::text(message)
        };
        let mut stdout = std::io::stdout().lock();
        let written = writeln!(stdout, "{line}").and_then(|()| stdout.flush());
        if let Err(e) = written {
            self.closed.send_replace(true);
            return Err(HandlerError::new(format!("stdout is closed: {e}")));
        }
        self.printed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Status lines on stderr: plain text, or log events when the log is JSON (so stderr stays
/// one JSON object per line).
struct Notices {
    json: bool,
}

impl Notices {
    fn say(&self, warn: bool, text: &str) {
        match (self.json, warn) {
            (false, _) => eprintln!("wharf tail: {text}"),
            (true, true) => tracing::warn!(notice = text, "wharf tail"),
            (true, false) => tracing::info!(notice = text, "wharf tail"),
        }
    }
}

/// What was last said about the consumer's state, so each change is said once.
#[derive(PartialEq)]
enum Said {
    Nothing,
    Waiting(String, Vec<String>),
    Consuming(i64),
    Stalled(String),
}

/// Runs the tail until a signal, a closed stdout, or a refused declaration.
pub async fn run(mut config: Config, args: TailArgs) -> anyhow::Result<ExitCode> {
    let registration = registration(&args)?;
    let shutdown = shutdown_signal()?;
    let store = wharf::open_existing_store(&config.store).await?;
    store.ensure_migrated().await?;
    config.queue.concurrency = if args.no_ack { args.max_unacked } else { 1 };
    config.queue.claim_batch = config.queue.claim_batch.min(config.queue.concurrency);
    let wharf = Wharf::with_store(store, &config.settings());

    let (closed_tx, mut closed) = watch::channel(false);
    let output = Arc::new(Output {
        json: args.json,
        printed: AtomicU64::new(0),
        closed: closed_tx,
    });
    let (release_tx, release) = watch::channel(false);
    let printer = output.clone();
    let no_ack = args.no_ack;
    let handler = handler_fn(move |message: Claimed| {
        let printer = printer.clone();
        let mut release = release.clone();
        async move {
            printer.print(&message)?;
            if !no_ack {
                return Ok(());
            }
            let _ = release.wait_for(|released| *released).await;
            Err(HandlerError::new(NO_ACK_REASON))
        }
    });

    let notices = Notices {
        json: config.log.format == LogFormat::Json,
    };
    let requested = registration.bindings.clone();
    let group = registration.group.clone();
    let consumer = wharf.consume_with(registration, handler);
    notices.say(
        false,
        &format!(
            "declaring {requested} for group {group} as instance {}",
            consumer.declarer()
        ),
    );
    let mut states = consumer.watch();
    let mut said = Said::Nothing;
    tokio::pin!(shutdown);
    let failed = loop {
        let state = states.borrow_and_update().clone();
        match state {
            ConsumerState::Waiting {
                incumbent,
                live_declarers,
                ..
            } => {
                let declarers: Vec<String> = live_declarers.iter().map(|d| d.to_string()).collect();
                let now = Said::Waiting(incumbent.to_string(), declarers.clone());
                if now != said {
                    notices.say(
                        true,
                        &format!(
                            "WAITING: group {group} has set {incumbent}, declared by live \
                             instance(s) {}; this tail declares {requested} and waits until \
                             they are gone (no timeout)",
                            declarers.join(", ")
                        ),
                    );
                    said = now;
                }
            }
            ConsumerState::Consuming { install, .. } if said != Said::Consuming(install) => {
                notices.say(
                    false,
                    &format!("consuming group {group} with {requested} (install {install})"),
                );
                said = Said::Consuming(install);
            }
            ConsumerState::Stalled { reason } if said != Said::Stalled(reason.clone()) => {
                notices.say(true, &format!("stalled: {reason}"));
                said = Said::Stalled(reason);
            }
            ConsumerState::Failed { reason } => {
                notices.say(true, &format!("declaration refused: {reason}"));
                break true;
            }
            ConsumerState::Stopped => break true,
            _ => {}
        }
        tokio::select! {
            () = &mut shutdown => break false,
            _ = closed.wait_for(|closed| *closed) => break false,
            changed = states.changed() => {
                if changed.is_err() {
                    break true;
                }
            }
        }
    };
    // Stop claiming first, then let held --no-ack messages go (they are nacked as their
    // handlers return, while the consumer drains).
    let (stats, ()) = tokio::join!(consumer.shutdown(), async {
        release_tx.send_replace(true);
    });
    let printed = output.printed.load(Ordering::Relaxed);
    let settled = if no_ack {
        format!("gave back {}", stats.handled_err)
    } else {
        format!("acked {}", stats.handled_ok)
    };
    notices.say(false, &format!("stopped: printed {printed}, {settled}"));
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
