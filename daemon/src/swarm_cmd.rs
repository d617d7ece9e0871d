//! `murmur init`, `murmur swarm new`, `murmur swarm invite` and `murmur config check`:
//! the keys, configs and invites a swarm starts from (`swarm revoke` is `revoke_cmd`).
//!
//! The workflow (see docs/config.md): the organizer runs `swarm new` and publishes
//! `swarm.toml`; each volunteer runs `init` and sends the printed peer id; the organizer
//! runs `swarm invite <peer id>` and sends back the invite; the volunteer checks its config
//! with `config check` and starts `murmur run`.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::Context;
use murmur_protocol::identity::{Invite, Keypair, PeerId, SwarmId};

use crate::cli::{ConfigCommand, InitArgs, SwarmCommand, SwarmInviteArgs, SwarmNewArgs};
use crate::config::{self, ConfigFile, LoadedConfig, LogFormat, template};
use crate::first_peer;
use crate::input_error::BadInput;

const SECONDS_PER_DAY: u64 = 86_400;

/// `murmur init`: a new peer key and a commented config.
pub(crate) fn init(args: &InitArgs) -> anyhow::Result<()> {
    let key_file = args.dir.join("murmur.key");
    let config_file = args.dir.join("murmur.toml");
    prepare(&args.dir, &[&key_file, &config_file], args.force)?;
    let keypair = Keypair::create_file(&key_file).map_err(|e| BadInput(e.to_string()))?;
    write_new(&config_file, &template::for_init())?;

    let peer = keypair.peer_id();
    println!("peer id: {peer}");
    println!("wrote {} (mode 0600, keep it secret)", key_file.display());
    println!("wrote {}", config_file.display());
    println!();
    println!("next steps:");
    println!("  1. send your peer id to the swarm's organizer; they send back an invite");
    println!(
        "  2. save the invite as {}",
        args.dir.join("invite").display()
    );
    println!(
        "  3. save the swarm's published swarm.toml as {} (replacing this one)",
        config_file.display()
    );
    println!(
        "  4. murmur config check {0}; then murmur run --config {0}; watch it with murmur status",
        config_file.display()
    );
    Ok(())
}

/// The swarm authority's key and the swarm's id, checked against each other: the key must
/// be the authority `swarm_config` names.
pub(crate) fn load_authority(
    authority_key: &Path,
    swarm_config: &Path,
) -> anyhow::Result<(Keypair, SwarmId)> {
    let authority = Keypair::load_file(authority_key).map_err(|e| BadInput(e.to_string()))?;
    let config = ConfigFile::read(swarm_config).map_err(BadInput::from)?;
    if authority.peer_id() != config.checked.authority {
        return Err(BadInput(format!(
            "{} is the key of {}, but {} names authority {}; pass the authority key of \
             this swarm",
            authority_key.display(),
            authority.peer_id(),
            swarm_config.display(),
            config.checked.authority
        ))
        .into());
    }
    Ok((authority, config.checked.swarm.clone()))
}

/// `murmur swarm …`.
pub(crate) fn swarm(command: SwarmCommand) -> anyhow::Result<()> {
    match command {
        SwarmCommand::New(args) => swarm_new(&args),
        SwarmCommand::Invite(args) => swarm_invite(&args),
        SwarmCommand::Revoke(args) => crate::revoke_cmd::revoke(&args),
    }
}

/// `murmur config …`.
pub(crate) fn config(command: ConfigCommand) -> anyhow::Result<()> {
    match command {
        ConfigCommand::Check { file } => {
            let loaded = config::load(&file).map_err(BadInput::from)?;
            println!("{}", summary(&loaded));
            Ok(())
        }
    }
}

fn swarm_new(args: &SwarmNewArgs) -> anyhow::Result<()> {
    // Check the flags before anything is written.
    let id = match &args.id {
        Some(id) => Some(
            SwarmId::new(id.clone())
                .map_err(|e| BadInput(format!("--id {id:?} is not a swarm id: {e}")))?,
        ),
        None => None,
    };
    let prefix = args
        .public_host
        .as_deref()
        .map(first_peer::host_prefix)
        .transpose()?;
    if args.peer_port == 0 {
        return Err(BadInput(
            "--peer-port 0: the first peer needs a fixed port for volunteers to reach it".into(),
        )
        .into());
    }
    let key_file = args.dir.join("authority.key");
    let config_file = args.dir.join("swarm.toml");
    let peer_dir = args.dir.join("peer");
    let peer_files = first_peer::files(&peer_dir);
    prepare(&args.dir, &[&key_file, &config_file], args.force)?;
    if !args.no_peer {
        prepare(
            &peer_dir,
            &peer_files.iter().collect::<Vec<_>>(),
            args.force,
        )?;
    }
    let authority = Keypair::create_file(&key_file).map_err(|e| BadInput(e.to_string()))?;
    let authority_id = authority.peer_id();
    let swarm = match id {
        Some(id) => id,
        None => default_swarm_id(&authority_id)?,
    };
    let mut swarm_toml = template::for_swarm(&swarm, &authority_id);
    let first = if args.no_peer {
        None
    } else {
        let first = first_peer::write(
            &peer_dir,
            &authority,
            &swarm,
            &swarm_toml,
            args.peer_port,
            prefix.as_deref(),
        )?;
        if prefix.is_some() {
            swarm_toml = first_peer::with_bootstrap(&swarm_toml, &first.addresses);
        }
        Some(first)
    };
    write_new(&config_file, &swarm_toml)?;

    println!("swarm: {swarm}");
    println!("authority: {authority_id}");
    println!(
        "wrote {} (mode 0600: whoever holds it admits peers; keep it offline if you can)",
        key_file.display()
    );
    println!("wrote {}", config_file.display());
    if let Some(first) = &first {
        println!("first peer: {} in {}", first.id, peer_dir.display());
    }
    println!();
    println!("next steps:");
    let mut step = 0;
    let mut next = |text: String| {
        step += 1;
        println!("  {step}. {text}");
    };
    if let Some(first) = &first {
        next(format!(
            "start your first peer: murmur run --config {} (open UDP and TCP port {} to it)",
            first.config.display(),
            args.peer_port
        ));
        if prefix.is_none() {
            next(format!(
                "put its addresses, with your public IP, into [net] bootstrap of {}: {}",
                config_file.display(),
                first.addresses.join(" ")
            ));
        }
    }
    next(format!(
        "edit the task and averaging sections of {} (the first peer's copy too), then \
         publish it",
        config_file.display()
    ));
    next(format!(
        "for each volunteer's peer id: murmur swarm invite PEER_ID --authority-key {} \
         --swarm-config {} --out PEER_ID.invite, and send them the invite",
        key_file.display(),
        config_file.display()
    ));
    Ok(())
}

fn swarm_invite(args: &SwarmInviteArgs) -> anyhow::Result<()> {
    let peer = PeerId::from_str(args.peer_id.trim()).map_err(|e| {
        BadInput(format!(
            "PEER_ID {:?} is not a peer id: {e}; pass the id `murmur init` printed \
             (12D3KooW…)",
            args.peer_id
        ))
    })?;
    let (authority, swarm) = load_authority(&args.authority_key, &args.swarm_config)?;
    let issued_at = crate::clock::unix_s();
    let expires_at = issued_at.saturating_add(args.valid_days * SECONDS_PER_DAY);
    let invite = Invite::issue(&authority, &peer, &swarm, issued_at, expires_at)
        .context("signing the invite")?;
    std::fs::write(&args.out, invite.encode())
        .with_context(|| format!("writing the invite to {}", args.out.display()))?;
    println!(
        "wrote {}: admits {peer} to swarm {swarm} for {} days (until unix time {expires_at})",
        args.out.display(),
        args.valid_days
    );
    println!("send it to the peer, who saves it where its config's swarm.invite_file points");
    Ok(())
}

/// `swarm-` and the lowercased start of the authority's id: unique enough, and a valid id.
fn default_swarm_id(authority: &PeerId) -> anyhow::Result<SwarmId> {
    let text = authority.to_string();
    // Peer ids are base58 (ASCII letters and digits); skip the `12D3KooW` prefix all share.
    let tail: String = text.chars().skip(8).take(10).collect();
    SwarmId::new(format!("swarm-{}", tail.to_ascii_lowercase()))
        .context("deriving a swarm id from the authority's peer id")
}

/// Creates `dir` and refuses to go on if any of `files` exists, unless `force`, in which
/// case they are removed. Nothing is written unless every file may be.
fn prepare(dir: &Path, files: &[&PathBuf], force: bool) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for file in files {
        if file.symlink_metadata().is_ok() {
            if !force {
                return Err(BadInput(format!(
                    "{} already exists; refusing to overwrite it (pass --force to replace it)",
                    file.display()
                ))
                .into());
            }
            std::fs::remove_file(file).with_context(|| format!("removing {}", file.display()))?;
        }
    }
    Ok(())
}

/// Writes a new file, failing if it exists.
fn write_new(path: &Path, text: &str) -> anyhow::Result<()> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .with_context(|| format!("writing {}", path.display()))
}

/// One paragraph: who, which swarm, how it averages, what it trains.
fn summary(loaded: &LoadedConfig) -> String {
    let now = crate::clock::unix_s();
    let days_left = loaded.invite.expires_at().saturating_sub(now) / SECONDS_PER_DAY;
    let model = match config::param_count(&loaded.task) {
        Some(count) => format!("{} model of {count} parameters", model_kind(loaded)),
        None => format!(
            "{} model (its size depends on the data files)",
            model_kind(loaded)
        ),
    };
    let model =
        match config::memory_estimate(&loaded.task, loaded.training.passes, &loaded.averaging.mode)
        {
            Some(estimate) => format!("{model}, which needs {estimate}"),
            None => model,
        };
    let model = match config::param_count(&loaded.task).and_then(|count| {
        config::frames::largest_frame_of(&loaded.averaging.mode, loaded.averaging.codec, count)
    }) {
        Some(frame) => format!("{model}; {frame}"),
        None => model,
    };
    let metrics = match loaded.metrics_listen {
        Some(addr) => format!("metrics on http://{addr}/metrics"),
        None => "no metrics endpoint".to_owned(),
    };
    format!(
        "{}: ok. Peer {} joins swarm {} (authority {}) with an invite valid for {days_left} \
         more days. It averages with {} over codec {}, trains a {model} for {} steps, and \
         keeps {} checkpoints in {}; {metrics}; logs at {} as {}.",
        loaded.path.display(),
        loaded.peer_id,
        loaded.swarm,
        loaded.authority,
        loaded.averaging.mode.mode().name(),
        loaded.averaging.codec,
        match loaded.training.steps {
            0 => "unlimited".to_owned(),
            steps => steps.to_string(),
        },
        loaded.checkpoint.keep,
        loaded.checkpoint.dir.display(),
        loaded.log.level,
        match loaded.log.format {
            LogFormat::Human => "text",
            LogFormat::Json => "JSON",
        },
    )
}

fn model_kind(loaded: &LoadedConfig) -> &'static str {
    match loaded.task.model {
        murmur_trainer::ModelConfig::Gpt(_) => "gpt",
        murmur_trainer::ModelConfig::Mlp(_) => "mlp",
    }
}
