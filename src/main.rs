//! The `vidflow` binary: parse the command line, set up logging, run, map errors to exit codes.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = vidflow::cli::Cli::parse();
    vidflow::cli::init_logging();
    vidflow::frame::keep_freed_images();
    ExitCode::from(vidflow::cli::main(cli))
}
