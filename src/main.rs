//! The `specdec` command.

use clap::{Parser, Subcommand};

/// specdec: speculative decoding, kernel first.
#[derive(Debug, Parser)]
#[command(name = "specdec", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the versions of the workspace crates.
    Version,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("specdec {}", env!("CARGO_PKG_VERSION"));
        }
    }
    Ok(())
}
