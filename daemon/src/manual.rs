//! `murmur completions SHELL` and `murmur man`: shell completions and man pages, generated
//! from the command line's own definition so that they never disagree with it.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::cli::Cli;

/// Prints the completions for `shell` on stdout.
pub(crate) fn completions(shell: Shell) -> anyhow::Result<()> {
    // Generated into memory first: the generator panics when its writer fails, and a
    // closed stdout (`murmur completions bash | head`) must be an error, not a panic.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "murmur", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script)
        .and_then(|()| out.flush())
        .context("cannot write the completions to stdout")
}

/// Writes `murmur.1` and a page per command and subcommand (`murmur-run.1`,
/// `murmur-bench-allreduce.1`, …) into `out`; prints each file's path.
pub(crate) fn man_pages(out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut command = Cli::command();
    command.build();
    write_pages(&command, "murmur", out)
}

/// Writes the page of `command`, named `name`, and those of its subcommands.
fn write_pages(command: &clap::Command, name: &str, out: &Path) -> anyhow::Result<()> {
    let page = command.clone().display_name(name.to_owned());
    let mut roff = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut roff)
        .with_context(|| format!("cannot render the man page of {name}"))?;
    let path = out.join(format!("{name}.1"));
    std::fs::write(&path, roff).with_context(|| format!("cannot write {}", path.display()))?;
    // A closed stdout only loses the list; the pages are written.
    let _ = writeln!(std::io::stdout(), "{}", path.display());
    for sub in command.get_subcommands().filter(|s| s.get_name() != "help") {
        write_pages(sub, &format!("{name}-{}", sub.get_name()), out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_gets_a_man_page_naming_its_options() {
        let dir = tempfile::tempdir().unwrap();
        man_pages(dir.path()).unwrap();
        let run = std::fs::read_to_string(dir.path().join("murmur-run.1")).unwrap();
        assert!(run.starts_with(".ie") || run.contains(".TH"), "{run}");
        assert!(run.contains("config"), "{run}");
        assert!(run.contains("quiet"), "{run}");
        let top = std::fs::read_to_string(dir.path().join("murmur.1")).unwrap();
        for command in ["run", "local", "status", "completions"] {
            assert!(top.contains(command), "murmur.1 lacks {command}");
        }
        assert!(dir.path().join("murmur-bench-allreduce.1").is_file());
    }

    #[test]
    fn bash_completions_know_the_commands_and_their_flags() {
        let mut script = Vec::new();
        clap_complete::generate(Shell::Bash, &mut Cli::command(), "murmur", &mut script);
        let script = String::from_utf8(script).unwrap();
        for word in ["run", "local", "--config", "--quiet", "--peers"] {
            assert!(script.contains(word), "the completions lack {word}");
        }
    }
}
