//! `murmur-scenario`: runs one scenario of the network harness and prints its report.
//!
//! ```text
//! murmur-scenario NAME [--long] [--out DIR] [--cases TEXT]
//! ```
//!
//! Without `--long` it runs the short version the CI tests run. `--cases` runs only the
//! cases whose names hold `TEXT` (the all-reduce benchmarks: `butterfly-efficiency`,
//! `quic-window`, `stage-offloads`), to measure one row again without the rest. It needs
//! root, iproute2 and the `murmur` binary beside this one (`cargo build --release -p murmur
//! -p murmur-netns`).
//! Exits 0 when every acceptance bound holds, 1 when one does not, 2 on bad arguments.

use std::path::PathBuf;
use std::process::ExitCode;

use murmur_netns::scenario::{
    Report, ScenarioOptions, allreduce, churn, convergence, partition, straggler,
};

/// The scenarios, by name.
const SCENARIOS: &[&str] = &[
    "butterfly-efficiency",
    "latency",
    "quic-window",
    "stage-offloads",
    "straggler",
    "convergence",
    "partition",
    "churn",
    "churn-butterfly",
];

fn main() -> ExitCode {
    let mut long = false;
    let mut out = None;
    let mut cases = None;
    let mut name = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--long" => long = true,
            "--out" => out = args.next().map(PathBuf::from),
            "--cases" => match args.next() {
                Some(text) => cases = Some(text),
                None => return usage("--cases needs the text a case's name holds"),
            },
            _ if name.is_none() && !arg.starts_with('-') => name = Some(arg),
            _ => return usage(&format!("unexpected argument {arg:?}")),
        }
    }
    let Some(name) = name else {
        return usage("no scenario named");
    };
    let out = out.unwrap_or_else(|| std::env::temp_dir().join(format!("murmur-scenario-{name}")));
    let netem = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name("murmur-netem"),
        Err(error) => return fail(&format!("cannot find this program's folder: {error}")),
    };
    let options = match ScenarioOptions::beside_netem(long, out, netem) {
        Ok(options) => ScenarioOptions { cases, ..options },
        Err(error) => return fail(&format!("{error:#}")),
    };
    let report: anyhow::Result<Box<dyn Report>> = match name.as_str() {
        "butterfly-efficiency" => {
            allreduce::butterfly_efficiency(&options).map(|r| Box::new(r) as Box<dyn Report>)
        }
        "latency" => allreduce::latency(&options).map(|r| Box::new(r) as Box<dyn Report>),
        "quic-window" => allreduce::quic_window(&options).map(|r| Box::new(r) as Box<dyn Report>),
        "stage-offloads" => {
            allreduce::stage_offloads(&options).map(|r| Box::new(r) as Box<dyn Report>)
        }
        "straggler" => straggler::run(&options).map(|r| Box::new(r) as Box<dyn Report>),
        "convergence" => convergence::run(&options).map(|r| Box::new(r) as Box<dyn Report>),
        "partition" => partition::run(&options).map(|r| Box::new(r) as Box<dyn Report>),
        "churn" => churn::run(&options).map(|r| Box::new(r) as Box<dyn Report>),
        "churn-butterfly" => {
            churn::run_mode(&options, "butterfly").map(|r| Box::new(r) as Box<dyn Report>)
        }
        _ => return usage(&format!("no scenario named {name:?}")),
    };
    match report {
        Err(error) => fail(&format!("{name}: {error:#}")),
        Ok(report) => {
            println!("{}", report.to_json());
            match report.check() {
                Ok(()) => ExitCode::SUCCESS,
                Err(missed) => fail(&format!("{name}: {missed}")),
            }
        }
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!(
        "murmur-scenario: {why}\nusage: murmur-scenario NAME [--long] [--out DIR] [--cases TEXT]\nscenarios: {}",
        SCENARIOS.join(", ")
    );
    ExitCode::from(2)
}

fn fail(why: &str) -> ExitCode {
    eprintln!("murmur-scenario: {why}");
    ExitCode::from(1)
}
