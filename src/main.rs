//! `zonedd`: run an ordinary filesystem on zoned storage.
//!
//! The binary is only the command line: each subcommand lives in `cmd/` and calls into the
//! crates (`zbd` backends, `dmz` engine, `workpool`, `frontend`).

mod cli;
mod cmd;
mod logging;

use clap::Parser;
use cli::{Cli, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(match &cli.command {
        Command::Create(a) => logging::Role::Daemon {
            foreground: a.foreground,
        },
        Command::Recover(a) => logging::Role::Daemon {
            foreground: a.foreground,
        },
        Command::Expose(a) => logging::Role::Daemon {
            foreground: a.foreground,
        },
        _ => logging::Role::Command,
    });
    if !matches!(
        cli.command,
        Command::Create(_) | Command::Recover(_) | Command::Expose(_)
    ) {
        restore_default_sigpipe();
    }
    let result = match cli.command {
        Command::Emulate(a) => cmd::emulate::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Conformance(a) => cmd::conformance::run(a),
        Command::Format(a) => cmd::format::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::EngineIo(a) => cmd::engine_io::run(a),
        Command::Create(a) => cmd::create::run(a),
        Command::Expose(a) => cmd::expose::run(a),
        Command::List(a) => cmd::list::run(a),
        Command::Status(a) => cmd::status::run(a),
        Command::Reclaim(a) => cmd::reclaim::run(a),
        Command::Delete(a) => cmd::delete::run(a),
        Command::Recover(a) => cmd::recover::run(a),
        Command::InstallUnit(a) => cmd::install_unit::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zonedd: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Rust ignores SIGPIPE, so `zonedd check --json | head` would panic in `println!` once the
/// reader is gone. Short-lived commands take the default (quiet exit) like other tools; the
/// daemon (create, recover) keeps ignoring it so a client hanging up on its control socket
/// cannot kill it.
fn restore_default_sigpipe() {
    // SAFETY: called once at start-up before any other thread exists; SIG_DFL is a valid
    // disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
