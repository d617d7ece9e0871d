//! `<out>/progress.csv`: one row per reading (progress, eval, and the starting and final evals
//! of `ready` and `done`), on the clock of `murmur local`.

use std::io::{self, Write};

use super::record::Reading;

/// The header row.
pub(crate) const HEADER: &str = "wall_s,peer,event,step,loss,eval_loss,samples_per_s,bytes_sent";

/// Writes the header and one row per reading; empty cells where a reading has no value.
pub(crate) fn write_csv(out: &mut impl Write, readings: &[Reading]) -> io::Result<()> {
    writeln!(out, "{HEADER}")?;
    for r in readings {
        write!(out, "{:.3},{},{},", r.wall_s, r.peer, r.kind.name())?;
        cell(out, r.step)?;
        cell(out, r.loss)?;
        cell(out, r.eval_loss)?;
        cell(out, r.samples_per_s)?;
        match r.bytes_sent {
            Some(b) => writeln!(out, "{b}")?,
            None => writeln!(out)?,
        }
    }
    Ok(())
}

fn cell(out: &mut impl Write, value: Option<impl std::fmt::Display>) -> io::Result<()> {
    match value {
        Some(v) => write!(out, "{v},"),
        None => write!(out, ","),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::record::ReadingKind;

    #[test]
    fn every_row_has_every_column() {
        let readings = [
            Reading {
                wall_s: 1.23456,
                peer: 2,
                kind: ReadingKind::Progress,
                step: Some(40),
                loss: Some(2.5),
                eval_loss: None,
                samples_per_s: Some(410.25),
                bytes_sent: Some(123_456),
            },
            Reading {
                wall_s: 3.0,
                peer: 0,
                kind: ReadingKind::Eval,
                step: Some(50),
                loss: None,
                eval_loss: Some(2.25),
                samples_per_s: None,
                bytes_sent: None,
            },
        ];
        let mut out = Vec::new();
        write_csv(&mut out, &readings).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let columns = HEADER.split(',').count();
        for line in &lines {
            assert_eq!(line.split(',').count(), columns, "{line}");
        }
        assert_eq!(lines[1], "1.235,2,progress,40,2.5,,410.25,123456");
        assert_eq!(lines[2], "3.000,0,eval,50,,2.25,,");
    }
}
