//! Man pages and shell completions, generated at build time from the same clap definitions
//! the binary parses (`src/cli.rs`, included here).
//!
//! Written next to the binary, at a path that depends only on the target directory and the
//! profile (`target/debug/assets/`, `target/release/assets/`, or under `target/TRIPLE/...`
//! when cross-compiling):
//!
//! ```text
//! assets/man/zonedd.8             the command, with its subcommands listed
//! assets/man/zonedd-SUB.8         one per visible subcommand (create, status, reclaim, ...)
//! assets/completions/zonedd.bash  bash
//! assets/completions/_zonedd      zsh
//! assets/completions/zonedd.fish  fish
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};

#[allow(dead_code)]
#[path = "src/cli.rs"]
mod cli;

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;

fn main() {
    println!("cargo:rerun-if-changed=src/cli.rs");
    println!("cargo:rerun-if-changed=build.rs");
    let dir = assets_dir();
    let man = dir.join("man");
    let comp = dir.join("completions");
    for d in [&man, &comp] {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
    }
    let mut cmd = cli::Cli::command().disable_help_subcommand(true);
    cmd.build();
    write_page(&cmd, &man.join("zonedd.8"), true);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = sub.get_display_name().unwrap_or(sub.get_name()).to_string();
        write_page(sub, &man.join(format!("{name}.8")), false);
    }
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd, "zonedd", &comp)
            .unwrap_or_else(|e| panic!("{shell} completions: {e}"));
    }
}

/// `<target dir>/<profile>/assets`, from OUT_DIR (`<that>/build/zonedd-HASH/out`).
fn assets_dir() -> PathBuf {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    out.ancestors()
        .nth(3)
        .map(|p| p.join("assets"))
        .unwrap_or_else(|| out.join("assets"))
}

/// One page in section 8: clap_mangen's sections, then ours (exit status, files,
/// environment, see also).
fn write_page(cmd: &clap::Command, path: &Path, top: bool) {
    let man = Man::new(cmd.clone())
        .section("8")
        .manual("zonedd")
        .source(concat!("zonedd ", env!("CARGO_PKG_VERSION")));
    let mut buf = Vec::new();
    let r = (|| -> std::io::Result<()> {
        man.render_title(&mut buf)?;
        man.render_name_section(&mut buf)?;
        man.render_synopsis_section(&mut buf)?;
        man.render_description_section(&mut buf)?;
        if cmd.get_arguments().any(|a| !a.is_hide_set()) {
            man.render_options_section(&mut buf)?;
        }
        if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
            man.render_subcommands_section(&mut buf)?;
        }
        extra_sections(cmd, top).to_writer(&mut buf)?;
        if cmd.get_version().is_some() {
            man.render_version_section(&mut buf)?;
        }
        Ok(())
    })();
    r.unwrap_or_else(|e| panic!("rendering {}: {e}", path.display()));
    // Each part comes with roff's two-line preamble: keep the first.
    let text = String::from_utf8(buf).expect("roff is UTF-8");
    let preamble = ".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n";
    let body = text.replace(preamble, "");
    let page = format!("{preamble}{body}");
    let mut f =
        std::fs::File::create(path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    f.write_all(page.as_bytes())
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

fn extra_sections(cmd: &clap::Command, top: bool) -> Roff {
    let mut r = Roff::default();
    r.control("SH", ["EXIT STATUS"]);
    r.text([roman(
        "0: success. 2: refused before doing anything: a bad invocation, or a backend or \
         environment to fix (missing path, not zoned, not formatted, in use, ublk_drv not \
         loaded, not root, no daemon for the device). 1: the command started and failed (an \
         I/O error, the daemon failed), or check found errors. Every refusal is one line on \
         standard error.",
    )]);
    if top {
        r.control("SH", ["FILES"]);
        for (file, what) in [
            (
                "/run/zonedd/ID.sock",
                "the control socket of device ID's daemon (root only)",
            ),
            (
                "/run/zonedd/ID.json",
                "the record of device ID: backend, options, daemon pid",
            ),
            ("/run/zonedd/ID.log", "the daemon's log"),
            (
                "/etc/systemd/system/zonedd@.service",
                "the unit written by zonedd install-unit",
            ),
        ] {
            r.control("TP", []);
            r.text([bold(file)]);
            r.text([roman(what)]);
        }
        r.control("SH", ["ENVIRONMENT"]);
        for (var, what) in [
            ("RUST_LOG", "log level and filter (default: warn)"),
            ("ZONEDD_RUN_DIR", "the run directory instead of /run/zonedd"),
        ] {
            r.control("TP", []);
            r.text([bold(var)]);
            r.text([roman(what)]);
        }
    }
    r.control("SH", ["SEE ALSO"]);
    let mut see: Vec<String> = if top {
        let parent = cmd.get_name();
        cmd.get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| format!("{parent}-{}(8)", s.get_name()))
            .collect()
    } else {
        vec!["zonedd(8)".into()]
    };
    see.extend(["dmsetup(8)".into(), "systemd.service(5)".into()]);
    r.text([roman(see.join(", "))]);
    r
}
