//! Setting up and removing what the containers need: the tools the machine must have, the
//! image built from the server binary, the network and one container per node (and whatever a
//! run with the same names left behind).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _};

use super::{DockerConfig, DATA_MOUNT, GATEWAY_HOST, IMAGE_BIN};
use crate::hosts::net::{
    have, insert_forward_rule, remove_forward_rules, require_root, run, run_quiet,
};

/// The files `ldd` says `bin` loads, the dynamic loader included (absolute paths, in order).
/// An empty list: a static binary.
pub(super) fn parse_ldd(output: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for line in output.lines().map(str::trim) {
        if line.is_empty() || line.contains("statically linked") {
            continue;
        }
        let path = match line.split_once("=>") {
            Some((name, target)) => {
                let target = target.trim();
                if target.starts_with("not found") {
                    bail!(
                        "the server binary needs {} and this machine does not have it",
                        name.trim()
                    );
                }
                target.split_whitespace().next().unwrap_or("")
            }
            None => line.split_whitespace().next().unwrap_or(""),
        };
        // `linux-vdso.so.1 (0x...)` is the kernel's; everything else is a file.
        if path.starts_with('/') {
            files.push(PathBuf::from(path));
        }
    }
    Ok(files)
}

/// Checks what the containers need: root, Docker with a daemon that answers, `nsenter`,
/// `iptables`, `ip`, `ldd`, `tar`.
pub fn preflight() -> anyhow::Result<()> {
    require_root(
        "the Docker hosts (they enter the containers' network namespaces and add iptables \
         rules)",
    )?;
    if !have("docker", "--version") {
        bail!(
            "`docker` not found: install Docker (the engine and its command-line client) and \
             start the daemon, or use --hosts netns"
        );
    }
    if let Err(err) = run("docker", &["version", "--format", "{{.Server.Version}}"]) {
        bail!(
            "the Docker daemon does not answer ({err:#}); start it (e.g. `systemctl start \
             docker`), or use --hosts netns"
        );
    }
    for (program, probe, package) in [
        ("nsenter", "--version", "util-linux"),
        ("iptables", "-V", "iptables"),
        ("ip", "-V", "iproute2"),
        ("ldd", "--version", "libc-bin"),
        ("tar", "--version", "tar"),
    ] {
        if !have(program, probe) {
            bail!("`{program}` not found; install it (apt-get install {package})");
        }
    }
    Ok(())
}

/// Removes everything a run with this configuration creates, whether or not it exists.
pub(super) fn remove_leftovers(cfg: &DockerConfig) {
    let names = run("docker", &["ps", "-a", "--format", "{{.Names}}"]).unwrap_or_default();
    let ours: Vec<&str> = names.lines().filter(|n| cfg.is_ours(n)).collect();
    for name in &ours {
        // A paused container is unpaused first: removing a frozen one can hang.
        run_quiet("docker", &["unpause", name]);
    }
    if !ours.is_empty() {
        let mut args = vec!["rm", "-f", "-v"];
        args.extend(ours.iter().copied());
        run_quiet("docker", &args);
    }
    run_quiet("docker", &["network", "rm", &cfg.network()]);
    remove_forward_rules(&cfg.bridge());
    run_quiet("docker", &["image", "rm", "-f", &cfg.image]);
}

/// Builds the image from the server binary: a root filesystem with the binary, the libraries
/// `ldd` lists and the loader, imported as a scratch image.
pub(super) fn build_image(cfg: &DockerConfig) -> anyhow::Result<()> {
    let bin = cfg.bin.to_string_lossy().into_owned();
    let ldd = Command::new("ldd")
        .arg(&bin)
        .stdin(Stdio::null())
        .output()
        .context("cannot run ldd")?;
    let text =
        String::from_utf8_lossy(&ldd.stdout).into_owned() + &String::from_utf8_lossy(&ldd.stderr);
    // ldd fails for a static binary ("not a dynamic executable"): it needs nothing else.
    let files = if ldd.status.success() {
        parse_ldd(&text)?
    } else if text.contains("not a dynamic executable") {
        Vec::new()
    } else {
        bail!("`ldd {bin}` failed: {}", text.trim());
    };
    let root = cfg.run_dir.join("image-root");
    let tarball = cfg.run_dir.join("image.tar");
    let _ = std::fs::remove_dir_all(&root);
    let copy = |from: &Path, to: &Path| -> anyhow::Result<()> {
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        // Follows symlinks: the image gets the files themselves under the names asked for.
        std::fs::copy(from, to)
            .with_context(|| format!("cannot copy {} into the image", from.display()))?;
        Ok(())
    };
    copy(&cfg.bin, &root.join(IMAGE_BIN.trim_start_matches('/')))?;
    for file in &files {
        copy(file, &root.join(file.strip_prefix("/").unwrap_or(file)))?;
    }
    for dir in ["tmp", DATA_MOUNT.trim_start_matches('/')] {
        std::fs::create_dir_all(root.join(dir)).context("cannot lay out the image")?;
    }
    let result = (|| {
        run(
            "tar",
            &[
                "-C",
                &root.to_string_lossy(),
                "-cf",
                &tarball.to_string_lossy(),
                ".",
            ],
        )?;
        run(
            "docker",
            &[
                "import",
                "--change",
                &format!("ENTRYPOINT [\"{IMAGE_BIN}\"]"),
                &tarball.to_string_lossy(),
                &cfg.image,
            ],
        )
        .context("cannot import the image")?;
        anyhow::Ok(())
    })();
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_file(&tarball);
    result.with_context(|| format!("cannot build the image {}", cfg.image))
}

pub(super) fn create_network(cfg: &DockerConfig) -> anyhow::Result<()> {
    let [a, b, c] = cfg.subnet;
    run(
        "docker",
        &[
            "network",
            "create",
            "--driver",
            "bridge",
            "--subnet",
            &format!("{a}.{b}.{c}.0/24"),
            "--gateway",
            &cfg.layout().addr(GATEWAY_HOST).to_string(),
            "--opt",
            &format!("com.docker.network.bridge.name={}", cfg.bridge()),
            &cfg.network(),
        ],
    )
    .with_context(|| {
        format!(
            "cannot create the Docker network {} (another network on the same subnet? try \
             another --subnet)",
            cfg.network()
        )
    })?;
    insert_forward_rule(&cfg.bridge())?;
    // The harness talks to the containers' addresses directly, through the bridge.
    let route = run("ip", &["route", "get", &cfg.node_addr(1).to_string()])?;
    if !route.split_whitespace().any(|w| w == cfg.bridge()) {
        bail!(
            "this machine does not route {} to the Docker network's bridge {} but: {}; \
             choose another --subnet",
            cfg.node_addr(1),
            cfg.bridge(),
            route.trim()
        );
    }
    for id in 1..=cfg.nodes {
        let args = cfg.create_args(id);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run("docker", &args)
            .with_context(|| format!("cannot create the container of node {id}"))?;
    }
    Ok(())
}
