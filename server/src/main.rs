//! The `wharf` command: serve the listing API, migrate, rebuild projections, prune, audit,
//! publish and tail.

use std::process::ExitCode;

use clap::Parser;

/// The service's allocator (ADR 0071): a page of the listing API spent a fifth of its own CPU
/// in glibc's malloc and free; mimalloc's thread-local free lists take about half of that off.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = wharf_server::cli::Cli::parse();
    let mut builder = if args.command.runs_on_one_thread() {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(wharf_server::cli::run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
