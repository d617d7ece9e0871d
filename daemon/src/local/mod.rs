//! `murmur local`: a swarm of peers on this host training the built-in task, with no files to
//! write first.
//!
//! It creates a working folder with an authority key and, per peer, a key, an invite and a
//! config ([`swarm_dir`]); starts one `murmur run --progress` process per peer, peer 0 first
//! and the rest bootstrapping from it ([`supervisor`], [`peers`]); shows their progress live
//! ([`live`]); optionally kills and restarts peers (churn); and ends with a summary
//! ([`summary`]), `progress.csv` ([`csv`]) and `loss.png` ([`plot`]) in the folder.

mod args;
mod csv;
mod events;
mod live;
mod overrides;
mod peers;
pub(crate) mod plot;
mod record;
mod summary;
mod supervisor;
mod swarm_dir;

#[cfg(test)]
mod fake_swarm_tests;

use std::fs::File;
use std::io::{BufWriter, Write};

use anyhow::Context;

pub(crate) use self::args::LocalArgs;
pub(crate) use self::args::LocalPlan;
use self::live::LiveView;
use self::peers::Launcher;
pub(crate) use self::record::Reading;
#[cfg(test)]
pub(crate) use self::record::ReadingKind;
pub(crate) use self::summary::Summary as LocalSummary;
use self::summary::{RunFacts, Summary};
use self::supervisor::{Limits, supervise};
pub(crate) use self::swarm_dir::SwarmDir;

/// Runs `murmur local`: fails with a [`BadInput`](crate::input_error::BadInput) for bad
/// flags, and with an error after printing the summary when any peer did not finish.
pub(crate) fn run(args: &LocalArgs) -> anyhow::Result<()> {
    let plan = LocalPlan::from_args(args)?;
    let launcher = Launcher::murmur_run()?;
    let mut limits = Limits::for_plan(&plan);
    if let Some(every) = args.churn_every()? {
        limits.churn_every = every;
    }
    let summary = run_swarm(&plan, &launcher, &limits)?;
    if summary.as_planned(plan.stop_after.is_some()) {
        Ok(())
    } else {
        anyhow::bail!(
            "{} of {} peers did not finish; the summary says why",
            summary.peers - summary.finished,
            summary.peers
        )
    }
}

/// Creates the folder, runs the swarm, writes the CSV and plot, prints the summary.
fn run_swarm(plan: &LocalPlan, launcher: &Launcher, limits: &Limits) -> anyhow::Result<Summary> {
    let (summary, root, _) = swarm_outcome(plan, launcher, limits, LiveView::new(plan.json))?;
    if plan.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print!("{}", summary.to_text());
        println!(
            "folder: {} (progress.csv, loss.png, peer-N/murmur.log)",
            root.display()
        );
    }
    Ok(summary)
}

/// Runs the swarm `plan` describes, with nothing printed: its summary and every reading
/// (for `murmur bench quality`).
pub(crate) fn run_quietly(plan: &LocalPlan) -> anyhow::Result<(Summary, Vec<Reading>)> {
    let launcher = Launcher::murmur_run()?;
    let limits = Limits::for_plan(plan);
    let (summary, _, readings) = swarm_outcome(plan, &launcher, &limits, LiveView::new(true))?;
    Ok((summary, readings))
}

/// Creates the folder, runs the swarm, writes the CSV and plot; the summary, the folder and
/// the readings.
fn swarm_outcome(
    plan: &LocalPlan,
    launcher: &Launcher,
    limits: &Limits,
    mut view: LiveView,
) -> anyhow::Result<(Summary, std::path::PathBuf, Vec<Reading>)> {
    let dir = SwarmDir::create(plan.out.as_deref(), plan.peers)?;
    view.note(
        0.0,
        &format!(
            "{} peers, {}, {}, {} steps; folder {}",
            plan.peers,
            plan.mode.name(),
            plan.codec,
            plan.steps,
            dir.root().display()
        ),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let run = runtime.block_on(supervise(plan, &dir, launcher, limits, &mut view))?;

    let mut notes = run.notes;
    let csv_path = dir.root().join("progress.csv");
    let mut out = BufWriter::new(
        File::create(&csv_path).with_context(|| format!("creating {}", csv_path.display()))?,
    );
    csv::write_csv(&mut out, &run.readings)
        .and_then(|()| out.flush())
        .with_context(|| format!("writing {}", csv_path.display()))?;
    let floor = run.records.iter().find_map(|r| r.loss_floor);
    let plot_path = dir.root().join("loss.png");
    match plot::write_loss_plot(&plot_path, &run.readings, plan.peers, floor) {
        Ok(None) => {}
        Ok(Some(note)) => notes.push(note),
        Err(e) => notes.push(format!("no plot: {}", crate::error_text::describe(&e))),
    }

    let summary = Summary::build(
        RunFacts {
            plan,
            out: dir.root(),
            peer_ids: (0..plan.peers)
                .map(|i| dir.peer_id(i).map(ToString::to_string).unwrap_or_default())
                .collect(),
            logs: (0..plan.peers).map(|i| dir.log_path(i)).collect(),
            wall_s: run.wall_s,
            interrupted: run.interrupted,
            notes,
        },
        &run.records,
    );
    Ok((summary, dir.root().to_owned(), run.readings))
}
