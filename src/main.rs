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
    /// Prove the verifiers exact: enumerate every verifier x tree kind (and the negative
    /// controls) on seeded toy models and print the total-variation table.
    Prove,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("specdec {}", env!("CARGO_PKG_VERSION"));
        }
        Command::Prove => prove()?,
    }
    Ok(())
}

/// `specdec prove`: prints the proof table; fails if any row fails.
fn prove() -> anyhow::Result<()> {
    let rows = specdec::algorithms::proof::prove(&mut std::io::stdout().lock())?;
    let failed = rows.iter().filter(|r| !r.passed()).count();
    anyhow::ensure!(failed == 0, "{failed} proof rows failed");
    Ok(())
}
