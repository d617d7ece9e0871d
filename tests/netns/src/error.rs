//! What can go wrong while building, using or tearing down a harness.

use std::time::Duration;

/// Why a harness could not be built or a command in it could not be run.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// Network namespaces, veth pairs and TUN devices need root.
    #[error(
        "the network harness needs root (effective uid is {euid}); run the tests as root, e.g. in the CI container"
    )]
    NotRoot {
        /// The effective user id found.
        euid: u32,
    },
    /// A tool the harness runs is not installed.
    #[error(
        "`{tool}` is not installed; install the Debian package {package} (scripts/setup.sh does)"
    )]
    ToolMissing {
        /// The program looked for.
        tool: &'static str,
        /// The Debian package that provides it.
        package: &'static str,
    },
    /// The topology asks for something the harness cannot build.
    #[error("invalid topology: {reason}")]
    InvalidTopology {
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// A program could not be started.
    #[error("could not start `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A command exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// The exit status.
        status: std::process::ExitStatus,
        /// What it wrote to standard error.
        stderr: String,
    },
    /// A command ran past its time limit and was killed.
    #[error("`{command}` did not finish within {limit:?} and was killed")]
    Timeout {
        /// The command line.
        command: String,
        /// The limit it was given.
        limit: Duration,
    },
    /// Waiting on a child process failed.
    #[error("could not wait for `{command}`: {source}")]
    Wait {
        /// The command line.
        command: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The delay stage did not report that its TUN device was open.
    #[error(
        "the delay stage (murmur-netem) did not become ready within {limit:?}; its last output: {output:?}"
    )]
    DelayStageNotReady {
        /// How long the harness waited.
        limit: Duration,
        /// The last line it printed, if any.
        output: Option<String>,
    },
    /// The delay stage's final report was missing or malformed.
    #[error("the delay stage (murmur-netem) gave no readable report: {detail}")]
    DelayStageReport {
        /// What was missing or malformed.
        detail: String,
    },
    /// A partition names peers the network does not have, or a peer twice.
    #[error("invalid partition: {reason}")]
    InvalidPartition {
        /// What is wrong and what is allowed.
        reason: String,
    },
}
