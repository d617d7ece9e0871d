//! Errors in what the user gave us (a config or scenario file, a flag), as opposed to
//! failures while running: the process exits with code 2 for these.

use std::fmt;

/// A message naming the bad input and what was wrong with it.
#[derive(Debug)]
pub(crate) struct BadInput(pub(crate) String);

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}
