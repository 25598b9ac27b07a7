//! `openarray completions SHELL` and `openarray man`: shell completions and
//! manual pages generated from the command line definition itself, so they
//! never fall behind it.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::CommandFactory;

use crate::output::fail;

/// The completion script for `shell` on standard output.
pub fn completions(shell: clap_complete::Shell) -> ExitCode {
    let mut cmd = crate::Cli::command();
    let name = cmd.get_name().to_string();
    clap_complete::generate(shell, &mut cmd, name, &mut std::io::stdout());
    ExitCode::SUCCESS
}

/// The page of `openarray` on standard output; with `dir`, one page per
/// command and subcommand (`openarray-device-add.1`, ...) written there.
pub fn man(dir: Option<&Path>) -> ExitCode {
    let cmd = crate::Cli::command();
    let written = match dir {
        Some(dir) => std::fs::create_dir_all(dir)
            .and_then(|()| clap_mangen::generate_to(cmd, dir))
            .map_err(|e| anyhow::anyhow!("cannot write the pages to {}: {e}", dir.display())),
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd)
                .render(&mut page)
                .and_then(|()| std::io::stdout().write_all(&page))
                .map_err(anyhow::Error::from)
        }
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}
