//! `zonedd install-unit`: Install the systemd unit zonedd@.service.
//!
//! Writes `scripts/systemd/zonedd@.service` (built into the binary) to
//! /etc/systemd/system (or `--dir`), pointing ExecStart/ExecStop at this zonedd binary, and
//! prints the commands that enable it for a backend.

use super::CliError;

const UNIT: &str = include_str!("../../scripts/systemd/zonedd@.service");
const UNIT_NAME: &str = "zonedd@.service";
const TEMPLATE_BIN: &str = "/usr/local/bin/zonedd";

pub use crate::cli::install_unit::Args;

/// The unit text with the binary path filled in.
pub fn unit_text(bin: &str) -> String {
    UNIT.replace(TEMPLATE_BIN, bin)
}

pub fn run(args: Args) -> Result<(), CliError> {
    let bin = match args.bin {
        Some(b) => b,
        None => std::env::current_exe()
            .and_then(std::fs::canonicalize)
            .map_err(|e| CliError::Failed(format!("cannot find this binary's path: {e}")))?,
    };
    let bin = bin.display().to_string();
    if bin.contains(char::is_whitespace) {
        return Err(CliError::Usage(format!(
            "binary path {bin:?} contains whitespace"
        )));
    }
    let text = unit_text(&bin);
    if args.print {
        print!("{text}");
        return Ok(());
    }
    let dest = args.dir.join(UNIT_NAME);
    std::fs::create_dir_all(&args.dir)
        .and_then(|_| std::fs::write(&dest, &text))
        .map_err(|e| CliError::Failed(format!("writing {}: {e}", dest.display())))?;
    println!("installed {}", dest.display());
    println!("enable a volume (BACKEND formatted with `zonedd format`):");
    println!("  systemctl daemon-reload");
    println!("  systemctl enable --now \"zonedd@$(systemd-escape --path BACKEND).service\"");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_runs_the_given_binary_in_the_foreground() {
        let t = unit_text("/opt/z/bin/zonedd");
        assert!(!t.contains(TEMPLATE_BIN));
        assert!(t.contains(
            "ExecStart=/opt/z/bin/zonedd create --backend %f --foreground --recover-if-present"
        ));
        assert!(t.contains("ExecStop=/opt/z/bin/zonedd delete --backend %f"));
        assert!(t.contains("Type=notify"));
        assert!(t.contains("Restart=on-failure"));
    }
}
