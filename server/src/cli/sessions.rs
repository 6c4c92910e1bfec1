//! `wharf sessions seed|list|show|plan`: the managed-filter ledger from the terminal.
//!
//! `seed` is the upgrade baseline's CLI root (a container init step runs the same command with
//! `--source init`): `SESSION` seeds an explicit empty baseline, `SESSION=F1,F2` the exact
//! filters that exist at the broker. Both are idempotent. `list` and `show` read the ledger's
//! projection beside the configuration; `plan` prints what a reconcile would do, touching no
//! broker.

use std::process::ExitCode;

use crate::config::Config;
use crate::config::ResolvedSession;
use clap::{Args, Subcommand};
use wharf::domain::session::{ExactFilter, ManagedFilterEvent};
use wharf::projections::{managed_sessions, session_leases, LeaseRow, ManagedSessionView};
use wharf_sessions::{find_session, parse_seed_spec, SessionLedger};

#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// Seed a session's managed-filter baseline: SESSION (explicitly empty) or
    /// 'SESSION=FILTER,FILTER' (the exact filters that exist at the broker). Idempotent: an
    /// established baseline is kept and listed filters are added.
    Seed(SeedArgs),
    /// Each configured or recorded session: identity, history size, pending removals.
    List(ListArgs),
    /// One session's exact history, beside its desired filters.
    Show(ShowArgs),
    /// What a reconcile would subscribe, unsubscribe and forget, without touching the broker.
    Plan(ShowArgs),
    /// Let a migration-required session run again, once the old configuration is restored
    /// and what it pinned is drained (docs/runbooks/managed-filter-migration.md).
    ResolveMigration(ResolveArgs),
}

#[derive(Debug, Args)]
pub struct ResolveArgs {
    /// A configured session's name or an ms-... identity.
    pub session: String,
    /// Who resolves it, recorded in the ledger.
    #[arg(long, default_value = "cli")]
    pub source: String,
}

#[derive(Debug, Args)]
pub struct SeedArgs {
    /// SESSION or 'SESSION=FILTER,FILTER' (SESSION: a configured name or an ms-... identity).
    pub spec: String,
    /// One more exact filter to seed (for filters that contain a comma); repeatable.
    #[arg(long = "filter")]
    pub filters: Vec<String>,
    /// Who seeds, recorded in the ledger (cli, init, ...).
    #[arg(long, default_value = "cli")]
    pub source: String,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A configured session's name or an ms-... identity.
    pub session: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(config: &Config, command: SessionsCommand) -> anyhow::Result<ExitCode> {
    match command {
        SessionsCommand::Seed(args) => seed(config, args).await,
        SessionsCommand::List(args) => list(config, args).await,
        SessionsCommand::Show(args) => show(config, args, false).await,
        SessionsCommand::Plan(args) => show(config, args, true).await,
        SessionsCommand::ResolveMigration(args) => resolve(config, args).await,
    }
}

async fn resolve(config: &Config, args: ResolveArgs) -> anyhow::Result<ExitCode> {
    let (session_id, _) = find_session(&config.mqtt, &args.session)?;
    let ledger = SessionLedger::new(store(config).await?);
    ledger.resolve_migration(&session_id, &args.source).await?;
    println!(
        "{session_id}: migration resolved; the session runs again at its next attempt with the \
         configuration it is given"
    );
    Ok(ExitCode::SUCCESS)
}

async fn store(config: &Config) -> anyhow::Result<wharf::store::Store> {
    let store = wharf::open_existing_store(&config.store).await?;
    store.ensure_migrated().await?;
    Ok(store)
}

async fn seed(config: &Config, args: SeedArgs) -> anyhow::Result<ExitCode> {
    let mut spec = parse_seed_spec(&args.spec)?;
    for filter in &args.filters {
        spec.filters
            .push(ExactFilter::parse_field("--filter", filter)?);
    }
    let (session_id, configured) = find_session(&config.mqtt, &spec.session)?;
    let ledger = SessionLedger::new(store(config).await?);
    let listed = spec.filters.len();
    let events = ledger.seed(&session_id, spec.filters, &args.source).await?;
    let name = configured.map_or_else(
        || session_id.clone(),
        |s| format!("{} ({session_id})", s.name),
    );
    match events.first() {
        Some(ManagedFilterEvent::BaselineSeeded { filters, .. }) => println!(
            "seeded the baseline of {name}: {} filter(s){}",
            filters.len(),
            if filters.is_empty() {
                " (explicitly empty)"
            } else {
                ""
            }
        ),
        Some(ManagedFilterEvent::BaselineExtended { filters, .. }) => println!(
            "{name} already had a baseline; added {} of the {listed} listed filter(s)",
            filters.len()
        ),
        _ => println!("{name} already has a baseline holding every listed filter: nothing to do"),
    }
    Ok(ExitCode::SUCCESS)
}

/// A session as `list` shows it: configured here, recorded in the store, or both.
#[derive(Debug, serde::Serialize)]
struct SessionLine {
    name: Option<String>,
    session_id: String,
    identity: Option<String>,
    history: Option<usize>,
    desired: Option<usize>,
    pending_removal: Vec<String>,
    migration_required: Option<String>,
}

async fn list(config: &Config, args: ListArgs) -> anyhow::Result<ExitCode> {
    let configured = config.mqtt.resolve()?;
    let recorded = managed_sessions(&store(config).await?, None).await?;
    let mut lines: Vec<SessionLine> = configured
        .iter()
        .map(|s| {
            line(
                Some(s),
                recorded.iter().find(|r| r.session_id == s.identity.id()),
            )
        })
        .collect();
    for view in &recorded {
        if !configured
            .iter()
            .any(|s| s.identity.id() == view.session_id)
        {
            lines.push(line(None, Some(view)));
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&lines)?);
        return Ok(ExitCode::SUCCESS);
    }
    if lines.is_empty() {
        println!("no MQTT sessions configured or recorded");
    }
    for l in &lines {
        let history = l.history.map_or(
            "UNKNOWN (not seeded: startup fails closed)".to_owned(),
            |n| format!("{n} filter(s)"),
        );
        println!(
            "{}  {}  history {history}{}{}",
            l.name.as_deref().unwrap_or("(not configured here)"),
            l.session_id,
            if l.pending_removal.is_empty() {
                String::new()
            } else {
                format!("  pending removal: {}", l.pending_removal.join(" "))
            },
            l.migration_required
                .as_ref()
                .map_or(String::new(), |r| format!("  MIGRATION REQUIRED: {r}"))
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn line(
    configured: Option<&ResolvedSession>,
    recorded: Option<&ManagedSessionView>,
) -> SessionLine {
    let desired: Option<Vec<&str>> =
        configured.map(|s| s.subscriptions.iter().map(|(f, _, _)| f.as_str()).collect());
    let pending_removal = match (recorded, &desired) {
        (Some(view), Some(desired)) => view
            .filters
            .iter()
            .filter(|f| !desired.contains(&f.filter.as_str()))
            .map(|f| f.filter.clone())
            .collect(),
        _ => Vec::new(),
    };
    SessionLine {
        name: configured.map(|s| s.name.clone()),
        session_id: configured.map_or_else(
            || recorded.map(|r| r.session_id.clone()).unwrap_or_default(),
            |s| s.identity.id().to_owned(),
        ),
        identity: configured.map(|s| s.identity.describe()),
        history: recorded.map(|r| r.filters.len()),
        desired: desired.map(|d| d.len()),
        pending_removal,
        migration_required: recorded.and_then(|r| r.migration_required.clone()),
    }
}

async fn show(config: &Config, args: ShowArgs, plan_only: bool) -> anyhow::Result<ExitCode> {
    let (session_id, configured) = find_session(&config.mqtt, &args.session)?;
    let store = store(config).await?;
    if plan_only {
        let state = SessionLedger::new(store).load(&session_id).await?;
        return super::session_plan::print(&session_id, configured.as_ref(), &state, args.json);
    }
    let recorded = managed_sessions(&store, Some(&session_id))
        .await?
        .into_iter()
        .next();
    let lease = session_leases(&store, Some(&session_id))
        .await?
        .into_iter()
        .next();
    if args.json {
        #[derive(serde::Serialize)]
        struct Shown<'a> {
            session_id: &'a str,
            identity: Option<String>,
            desired: Option<Vec<String>>,
            recorded: Option<&'a ManagedSessionView>,
            lease: Option<&'a LeaseRow>,
        }
        let shown = Shown {
            session_id: &session_id,
            identity: configured.as_ref().map(|s| s.identity.describe()),
            desired: configured.as_ref().map(|s| {
                s.subscriptions
                    .iter()
                    .map(|(f, _, _)| f.as_str().to_owned())
                    .collect()
            }),
            recorded: recorded.as_ref(),
            lease: lease.as_ref(),
        };
        println!("{}", serde_json::to_string_pretty(&shown)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("session {session_id}");
    if let Some(s) = &configured {
        println!("  configured as {}: {}", s.name, s.identity.describe());
    }
    if let Some(lease) = &lease {
        println!("  lease: {}", lease_text(lease));
    }
    let Some(view) = recorded else {
        println!(
            "  history: UNKNOWN (never seeded); startup fails closed until you run \
             `wharf sessions seed {}` (empty) or `wharf sessions seed '{}=FILTER,...'`",
            args.session, args.session
        );
        return Ok(ExitCode::SUCCESS);
    };
    println!("  baseline seeded by {}", view.baseline_source);
    if let Some(reason) = &view.migration_required {
        println!("  MIGRATION REQUIRED: {reason}");
    }
    println!("  history ({} filter(s)):", view.filters.len());
    for f in &view.filters {
        println!(
            "    {:<40} {:<10} {}",
            f.filter,
            f.state,
            outcome_text(f.requested_qos, f.granted_qos, f.reason_code)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The lease row for people: who holds it with which token until when, or that it is free.
fn lease_text(lease: &LeaseRow) -> String {
    match (&lease.holder, lease.expires_at) {
        (Some(holder), Some(expires_at)) => format!(
            "held by {holder} with token {} until {} (store clock)",
            lease.token,
            expires_at.format("%Y-%m-%dT%H:%M:%S%.3fZ")
        ),
        _ => format!("free (last token {})", lease.token),
    }
}

fn outcome_text(requested: Option<i16>, granted: Option<i16>, reason: Option<i16>) -> String {
    match (requested, granted, reason) {
        (Some(r), Some(g), _) => format!("requested QoS {r}, granted {g}"),
        (Some(r), None, Some(code)) => format!("requested QoS {r}, refused 0x{code:02x}"),
        (Some(r), None, None) => format!("requested QoS {r}"),
        _ => String::new(),
    }
}
