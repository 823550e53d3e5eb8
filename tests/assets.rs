//! The man pages and shell completions that build.rs generates from src/cli.rs: they exist
//! next to the binary (`<target>/<profile>/assets/`, the path packaging uses) and mention
//! every visible subcommand and each subcommand's options.

use std::path::PathBuf;

#[allow(dead_code)]
#[path = "../src/cli.rs"]
mod cli;

use clap::CommandFactory;

fn assets() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_zonedd"))
        .parent()
        .unwrap()
        .join("assets")
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// roff escapes '-' as '\-'.
fn unroff(s: &str) -> String {
    s.replace("\\-", "-")
}

fn visible_subcommands() -> Vec<clap::Command> {
    cli::Cli::command()
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect()
}

#[test]
fn man_pages_cover_every_subcommand_and_option() {
    let subs = visible_subcommands();
    assert!(subs.len() >= 10, "{} subcommands", subs.len());
    let top = unroff(&read(assets().join("man/zonedd.8")));
    assert!(
        top.contains("\n.TH zonedd 8 "),
        "{}",
        &top[..80.min(top.len())]
    );
    for s in &subs {
        let name = s.get_name();
        assert!(
            top.contains(&format!("zonedd-{name}(8)")),
            "zonedd.8 does not list {name}"
        );
        let page = unroff(&read(assets().join(format!("man/zonedd-{name}.8"))));
        assert!(page.contains(&format!("\n.TH zonedd-{name} 8 ")), "{name}");
        assert!(page.contains("EXIT STATUS"), "{name}");
        for a in s.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = a.get_long() {
                assert!(
                    page.contains(&format!("--{long}")),
                    "zonedd-{name}.8 lacks --{long}"
                );
            }
        }
    }
    // Hidden test-only commands get no page.
    assert!(!assets().join("man/zonedd-engine-io.8").exists());
}

#[test]
fn completions_cover_every_subcommand() {
    let subs = visible_subcommands();
    for file in [
        "completions/zonedd.bash",
        "completions/_zonedd",
        "completions/zonedd.fish",
    ] {
        let text = read(assets().join(file));
        for s in &subs {
            assert!(
                text.contains(s.get_name()),
                "{file} does not complete {}",
                s.get_name()
            );
        }
    }
    let bash = read(assets().join("completions/zonedd.bash"));
    assert!(bash.contains("complete -F"), "not a bash completion script");
    let fish = read(assets().join("completions/zonedd.fish"));
    assert!(
        fish.contains("complete -c zonedd"),
        "not a fish completion script"
    );
}
