//! `murmur-netem`: the user-space delay and loss stage of the network harness, and the bulk
//! TCP sender and receiver that measure a link's rate.
//!
//! ```text
//! murmur-netem delay --tun NAME [--seed N] [--queue-packets N] [--queues N] [--offloads on|off] --link SUBNET,DELAY_MICROS,LOSS ...
//! murmur-netem bulk-recv --listen ADDR:PORT [--limit-secs N]
//! murmur-netem bulk-send --to ADDR:PORT --seconds S
//! ```
//!
//! `delay` prints `{"event":"ready",...}` once its TUN device is open and, when it receives
//! SIGTERM or SIGINT, a `{"event":"stats",...}` line with its counters before exiting.

mod bulk;
mod stage;
mod tun;

use std::time::Duration;

use anyhow::{Context, bail};
use murmur_netns::LinkImpairment;

/// The most queues (threads) the delay stage runs.
const MAX_QUEUES: usize = 16;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(command) = args.next() else {
        bail!("no command given; use `delay`, `bulk-recv` or `bulk-send`");
    };
    let flags = Flags::parse(args)?;
    match command.as_str() {
        "delay" => {
            let links = flags
                .all("--link")
                .map(|text| text.parse::<LinkImpairment>())
                .collect::<Result<Vec<_>, _>>()?;
            let queues: usize = flags.parsed_or("--queues", 1)?;
            if !(1..=MAX_QUEUES).contains(&queues) {
                bail!("--queues {queues}: give 1 to {MAX_QUEUES}");
            }
            let offloads = match flags.last("--offloads").unwrap_or("off") {
                "on" => true,
                "off" => false,
                other => bail!("--offloads {other}: give on or off"),
            };
            stage::run(stage::StageSettings {
                tun: flags.one("--tun")?.to_owned(),
                seed: flags.parsed_or("--seed", 0)?,
                queue_packets: flags.parsed_or("--queue-packets", 4096)?,
                queues,
                offloads,
                links,
            })
        }
        "bulk-recv" => bulk::receive(
            flags.one("--listen")?,
            Duration::from_secs(flags.parsed_or("--limit-secs", 60)?),
        ),
        "bulk-send" => bulk::send(
            flags.one("--to")?,
            Duration::from_secs_f64(flags.parsed_or("--seconds", 5.0)?),
        ),
        other => bail!("unknown command `{other}`; use `delay`, `bulk-recv` or `bulk-send`"),
    }
}

/// `--name value` pairs, in order; a name may repeat.
struct Flags(Vec<(String, String)>);

impl Flags {
    fn parse(mut args: impl Iterator<Item = String>) -> anyhow::Result<Self> {
        let mut pairs = Vec::new();
        while let Some(name) = args.next() {
            if !name.starts_with("--") {
                bail!("expected a --flag, found `{name}`");
            }
            let value = args
                .next()
                .with_context(|| format!("{name} needs a value"))?;
            pairs.push((name, value));
        }
        Ok(Self(pairs))
    }

    fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(flag, _)| flag == name)
            .map(|(_, value)| value.as_str())
    }

    fn last(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(flag, _)| flag == name)
            .map(|(_, value)| value.as_str())
    }

    fn one(&self, name: &str) -> anyhow::Result<&str> {
        self.last(name)
            .with_context(|| format!("{name} is required"))
    }

    fn parsed_or<T>(&self, name: &str, default: T) -> anyhow::Result<T>
    where
        T: std::str::FromStr,
        T::Err: std::error::Error + Send + Sync + 'static,
    {
        match self.last(name) {
            Some(text) => text
                .parse()
                .with_context(|| format!("{name} `{text}` is not valid")),
            None => Ok(default),
        }
    }
}
