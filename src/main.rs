//! The `agentry` binary: parse the command line, set up tracing, run.

use clap::Parser;
use tracing_subscriber::EnvFilter;

use agentry::cli::{
    run_agents, run_audit, run_bench, run_cluster, run_eval, run_health, run_import, run_keys,
    run_snapshot, run_verify, Cli, Command,
};

/// jemalloc for the Rust side (RocksDB's C++ keeps glibc's). Under write
/// load glibc's allocator was the largest single cost after signing: a
/// sixth to a fifth of a leader's CPU, most of it coalescing and unlinking
/// free chunks. With jemalloc, three batches of alternating rounds measured
/// 8-25 % more registrations per second at 128 clients (1 and 16 clients:
/// within the spread); a node of 1M agents loaded 1.5x and restarted 1.9x
/// as fast in 5 % less memory (docs/benchmarks.md, "jemalloc as the
/// allocator").
#[cfg(unix)]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let filter = match EnvFilter::try_new(&cli.log) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "error: --log / AGENTRY_LOG '{}' is not a log filter: {e}",
                cli.log
            );
            return std::process::ExitCode::from(2);
        }
    };
    // Colours only for a terminal: a log file or collector gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if cli.log_format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
    let result = match cli.command {
        Command::Serve(args) => match args.config() {
            Ok(config) if args.check_config => check_config(config).await,
            Ok(config) => agentry::server::run(config)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
        Command::Agents(args) => run_agents(args).await.map_err(|e| e.to_string()),
        Command::Cluster(args) => run_cluster(args).await.map_err(|e| e.to_string()),
        Command::Bench(args) => run_bench(args).await.map_err(|e| e.to_string()),
        Command::Eval(args) => run_eval(args).await.map_err(|e| e.to_string()),
        Command::Keys(args) => run_keys(args).await.map_err(|e| e.to_string()),
        Command::Verify(args) => run_verify(args).map_err(|e| e.to_string()),
        Command::Import(args) => run_import(args).await.map_err(|e| e.to_string()),
        Command::Audit(args) => run_audit(args).await.map_err(|e| e.to_string()),
        Command::Snapshot(args) => run_snapshot(args).await.map_err(|e| e.to_string()),
        Command::Health(args) => run_health(args).await.map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `agentry serve --check-config`: everything a start reads from its
/// configuration, read and checked, and what it would run, printed; the
/// data directory and the ports are left alone.
async fn check_config(config: agentry::config::Config) -> Result<(), String> {
    let prepared = agentry::server::Prepared::new(config).map_err(|e| e.to_string())?;
    println!("configuration ok");
    for line in prepared.describe().await {
        println!("  {line}");
    }
    Ok(())
}
