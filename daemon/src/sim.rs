//! `murmur sim FILE`: run a simulated swarm from a TOML scenario.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use murmur_gossip::sim::{self, Scenario};

use crate::cli::SimArgs;
use crate::input_error::BadInput;

pub(crate) fn run(args: &SimArgs) -> anyhow::Result<()> {
    let scenario = load(&args.file)?;
    if args.check {
        println!("{}: ok", args.file.display());
        return Ok(());
    }
    let report =
        sim::run(&scenario).map_err(|e| BadInput(format!("{}: {e}", args.file.display())))?;

    let csv = args.csv.clone().unwrap_or_else(|| {
        let stem = if scenario.name.is_empty() {
            args.file
                .file_stem()
                .map_or("sim".into(), |s| s.to_string_lossy().into_owned())
        } else {
            scenario.name.clone()
        };
        PathBuf::from(format!("{stem}.rounds.csv"))
    });
    let mut out =
        BufWriter::new(File::create(&csv).with_context(|| format!("creating {}", csv.display()))?);
    report
        .write_csv(&mut out)
        .and_then(|()| out.flush())
        .with_context(|| format!("writing {}", csv.display()))?;

    if args.json {
        println!("{}", serde_json::to_string(&report.summary)?);
    } else {
        println!("{}", report.summary);
        println!("per-round records: {}", csv.display());
    }
    Ok(())
}

/// Reads and validates a scenario; every failure names the file (and the line, for TOML).
fn load(path: &std::path::Path) -> anyhow::Result<Scenario> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| BadInput(format!("cannot read scenario {}: {e}", path.display())))?;
    let scenario: Scenario =
        toml::from_str(&text).map_err(|e| BadInput(format!("{}: {e}", path.display())))?;
    scenario
        .validate()
        .map_err(|e| BadInput(format!("{}: {e}", path.display())))?;
    Ok(scenario)
}
