//! [`ConfigError`]: what is wrong with a config file, said with the file, line and key.

use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

use crate::input_error::BadInput;

/// Why a config file cannot be used. Every variant names the file; all but
/// [`ConfigError::Read`] name the line and the key.
#[derive(Debug, Error)]
pub(crate) enum ConfigError {
    /// The config file could not be read.
    #[error("{}: cannot read the config: {source}", path.display())]
    Read {
        /// The config file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The text is not TOML, or a key is unknown, or a value has the wrong type.
    #[error("{}:{line}:{column}:{key}{message}", path.display(), key = KeyPrefix(key))]
    Syntax {
        /// The config file.
        path: PathBuf,
        /// 1-based line of the fault.
        line: usize,
        /// 1-based column of the fault.
        column: usize,
        /// The dotted key at fault, when the fault is inside one.
        key: Option<String>,
        /// What was wrong, as the TOML reader says it.
        message: String,
    },
    /// A value parsed but is not allowed (out of range, inconsistent, or a file it names
    /// cannot be used).
    #[error("{at}: {reason}")]
    Invalid {
        /// Where the value is.
        at: Location,
        /// What is wrong and what is allowed.
        reason: String,
    },
}

impl ConfigError {
    /// The dotted key the error is about, if any.
    #[cfg(test)]
    pub(crate) fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Read { .. } => None,
            ConfigError::Syntax { key, .. } => key.as_deref(),
            ConfigError::Invalid { at, .. } => Some(&at.key),
        }
    }

    /// The 1-based line the error is about, if known.
    #[cfg(test)]
    pub(crate) fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Read { .. } => None,
            ConfigError::Syntax { line, .. } => Some(*line),
            ConfigError::Invalid { at, .. } => at.line,
        }
    }
}

/// A config error is the user's input at fault: the process exits with code 2.
impl From<ConfigError> for BadInput {
    fn from(error: ConfigError) -> Self {
        BadInput(error.to_string())
    }
}

/// A key in a config file: `FILE:LINE: key = value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Location {
    /// The config file.
    pub(crate) path: PathBuf,
    /// 1-based line of the key, or of its nearest written table when the key is left to
    /// its default; `None` when neither is written.
    pub(crate) line: Option<usize>,
    /// The dotted key.
    pub(crate) key: String,
    /// The value as written, or the default's value followed by `(default)`.
    pub(crate) value: String,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        // A value pasted by mistake may be megabytes long; the start identifies it.
        const SHOWN: usize = 120;
        match self.value.char_indices().nth(SHOWN) {
            Some((cut, _)) => write!(f, ": {} = {}…", self.key, &self.value[..cut]),
            None => write!(f, ": {} = {}", self.key, self.value),
        }
    }
}

/// `key: ` when there is a key, nothing otherwise.
struct KeyPrefix<'a>(&'a Option<String>);

impl fmt::Display for KeyPrefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(key) => write!(f, " {key}: "),
            None => f.write_str(" "),
        }
    }
}
