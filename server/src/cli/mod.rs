//! Command-line parsing and dispatch. Each command lives in its own module.

mod audit;
mod config_cmd;
mod dead_letters;
mod logging;
mod maintenance;
mod publish;
mod serve;
mod session_audit;
mod session_plan;
mod sessions;
mod signals;
mod tail;

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::Config;
use clap::{Args, Parser, Subcommand};

/// Wharf: declared consumer-group bindings over an event-sourced ledger.
#[derive(Debug, Parser)]
#[command(name = "wharf", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// A TOML configuration file (see `wharf config default`).
    #[arg(short, long, global = true, env = "WHARF_CONFIG")]
    pub config: Option<PathBuf>,
    /// The store URL, overriding the configuration: sqlite://PATH or postgres://...
    #[arg(long, global = true)]
    pub store_url: Option<String>,
    /// More log output: -v for debug, -vv for trace (replacing log.filter; RUST_LOG, when set,
    /// replaces both).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the REST listing API (and run catch-up projections and the pruner schedule).
    Serve,
    /// Apply pending schema migrations and exit.
    Migrate,
    /// Projection maintenance.
    Projections {
        #[command(subcommand)]
        command: ProjectionsCommand,
    },
    /// Trim superseded waiting attempts from the ledger, then run message log retention.
    Prune(maintenance::PruneArgs),
    /// Audit queries on the ledger.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// List consumer groups with their effective sets, waiters and instances.
    Groups(audit::GroupsArgs),
    /// Inspect and replay a group's dead letters.
    DeadLetters {
        #[command(subcommand)]
        command: dead_letters::DeadLettersCommand,
    },
    /// Publish one message to a topic and print its position.
    Publish(publish::PublishArgs),
    /// Consume a group in the terminal: declare its set, wait visibly behind a live different
    /// set, then print each message and ack it (--no-ack: peek).
    Tail(tail::TailArgs),
    /// Managed MQTT sessions: seed the baseline, list, show, plan a reconcile.
    Sessions {
        #[command(subcommand)]
        command: sessions::SessionsCommand,
    },
    /// Configuration helpers: the defaults, a check that starts nothing, the effective values.
    Config {
        #[command(subcommand)]
        command: config_cmd::ConfigCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProjectionsCommand {
    /// Replay the whole log into the projections; with --verify, compare and change nothing.
    Rebuild(maintenance::RebuildArgs),
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// A group's declaration history: who declared what, when.
    Declarations(audit::DeclarationsArgs),
    /// What each swap did to a group's unacked messages: kept, set aside, restored, rescanned.
    Swaps(audit::SwapsArgs),
    /// A managed MQTT session's ledger: baselines, filters remembered, SUBACK outcomes,
    /// filters forgotten, migration requirements.
    Sessions(session_audit::SessionAuditArgs),
}

/// Loads the defaults, the file, the environment, then the flags (`--store-url` is the layer
/// above the environment), each value validated like every other.
fn load_config(global: &GlobalArgs) -> anyhow::Result<Config> {
    Ok(Config::load_layers(
        global.config.as_deref(),
        std::env::vars(),
        &flag_layer(global.store_url.clone()),
    )?)
}

/// The configuration keys the global flags set.
fn flag_layer(store_url: Option<String>) -> Vec<(&'static str, String)> {
    store_url
        .map(|url| ("store.url", url))
        .into_iter()
        .collect()
}

/// How `serve` loads the configuration again on a reload: the same file, flags and
/// environment as at start.
fn reload_loader(global: &GlobalArgs) -> (Option<PathBuf>, crate::supervisor::ConfigLoader) {
    let path = global.config.clone();
    let store_url = global.store_url.clone();
    let file = path.clone();
    let loader: crate::supervisor::ConfigLoader = std::sync::Arc::new(move || {
        Config::load_layers(
            file.as_deref(),
            std::env::vars(),
            &flag_layer(store_url.clone()),
        )
    });
    (path, loader)
}

/// `config default|check|show`: no logging set up, nothing opened (but the store, read only,
/// for `check --store`).
async fn config_command(
    global: &GlobalArgs,
    command: &config_cmd::ConfigCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        config_cmd::ConfigCommand::Default => {
            print!("{}", Config::default_toml());
            Ok(ExitCode::SUCCESS)
        }
        config_cmd::ConfigCommand::Check { file, store } => {
            let source = file.clone().or_else(|| global.config.clone());
            let global = GlobalArgs {
                config: source.clone(),
                store_url: global.store_url.clone(),
                verbose: global.verbose,
            };
            let config = load_config(&global)?;
            let code = config_cmd::check(&config, source.as_ref())?;
            if *store {
                return config_cmd::check_store(&config).await;
            }
            Ok(code)
        }
        config_cmd::ConfigCommand::Show => config_cmd::show(&load_config(global)?),
    }
}

impl Command {
    /// The terminal tools run on one thread: light, and a `tail --no-ack` holding several
    /// messages prints them in claim order (tasks start in the order they are spawned).
    pub fn runs_on_one_thread(&self) -> bool {
        matches!(self, Self::Publish(_) | Self::Tail(_))
    }
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::Config { command } = &cli.command {
        return config_command(&cli.global, command).await;
    }
    let config = load_config(&cli.global)?;
    let own_consumer_lines = matches!(cli.command, Command::Tail(_));
    logging::init(cli.global.verbose, &config.log, own_consumer_lines)?;
    match cli.command {
        Command::Serve => serve::run(config, reload_loader(&cli.global)).await,
        Command::Migrate => maintenance::migrate(&config).await,
        Command::Projections {
            command: ProjectionsCommand::Rebuild(args),
        } => maintenance::rebuild(&config, args).await,
        Command::Prune(args) => maintenance::prune(&config, args).await,
        Command::Audit {
            command: AuditCommand::Declarations(args),
        } => audit::declarations(&config, args).await,
        Command::Audit {
            command: AuditCommand::Swaps(args),
        } => audit::swaps(&config, args).await,
        Command::Audit {
            command: AuditCommand::Sessions(args),
        } => session_audit::run(&config, args).await,
        Command::Groups(args) => audit::groups(&config, args).await,
        Command::DeadLetters { command } => dead_letters::run(&config, command).await,
        Command::Publish(args) => publish::run(&config, args).await,
        Command::Tail(args) => tail::run(config, args).await,
        Command::Sessions { command } => sessions::run(&config, command).await,
        Command::Config { command } => config_command(&cli.global, &command).await,
    }
}
