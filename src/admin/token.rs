//! `raftq token`: make API tokens and the tokens-file entries that grant them.
//!
//! The server holds only each token's SHA-256 (see [`crate::tokens`]); these commands run on
//! the operator's machine and talk to no node.

use std::io::{self, BufRead};
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::tokens::{new_token, token_hash_hex, Grant};

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Generate a new random token and print it with the `[[token]]` entry that grants it.
    Create(CreateArgs),
    /// Print the SHA-256 of a token read from stdin (its first line), as the tokens file holds it.
    Hash,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Name of the token, shown in errors and logs (never the token itself).
    #[arg(long)]
    pub name: String,
    /// `ACTION:PATTERN`, repeatable: publish, consume or admin on the topics matching PATTERN
    /// (`*` matches any run of characters). admin includes publish and consume; admin:* also
    /// covers the cluster endpoints.
    #[arg(long = "grant", value_name = "ACTION:PATTERN", required = true)]
    pub grants: Vec<String>,
    /// Print `{"token", "name", "sha256", "grants"}` as JSON instead.
    #[arg(long)]
    pub json: bool,
}

fn toml_string(s: &str) -> String {
    // Names and grants are checked to be simple text; Debug quoting is valid TOML for them.
    format!("{s:?}")
}

pub fn token(args: TokenArgs) -> ExitCode {
    match args.command {
        TokenCommand::Create(a) => create(a),
        TokenCommand::Hash => hash(),
    }
}

fn create(a: CreateArgs) -> ExitCode {
    if a.name.is_empty()
        || a.name.len() > 128
        || a.name
            .chars()
            .any(|c| c.is_control() || c == '"' || c == '\\')
    {
        eprintln!("raftq: error: --name must be 1 to 128 printable characters without quotes or backslashes");
        return ExitCode::from(2);
    }
    for g in &a.grants {
        if let Err(e) = Grant::parse(g) {
            eprintln!("raftq: error: {e}");
            return ExitCode::from(2);
        }
    }
    let token = new_token();
    let sha = token_hash_hex(&token);
    if a.json {
        let v =
            serde_json::json!({"token": token, "name": a.name, "sha256": sha, "grants": a.grants});
        println!("{v}");
    } else {
        let grants: Vec<String> = a.grants.iter().map(|g| toml_string(g)).collect();
        println!("# The token (shown only now; the server keeps only its hash):");
        println!("# {token}");
        println!(
            "# Add this entry to the tokens file of every node, then restart them one by one:"
        );
        println!("[[token]]");
        println!("name = {}", toml_string(&a.name));
        println!("sha256 = \"{sha}\"");
        println!("grants = [{}]", grants.join(", "));
    }
    ExitCode::SUCCESS
}

fn hash() -> ExitCode {
    let mut line = String::new();
    if let Err(e) = io::stdin().lock().read_line(&mut line) {
        eprintln!("raftq: error: cannot read the token from stdin: {e}");
        return ExitCode::from(1);
    }
    let token = line.trim_end_matches(['\r', '\n']);
    if token.is_empty() {
        eprintln!("raftq: error: no token on stdin");
        return ExitCode::from(2);
    }
    println!("{}", token_hash_hex(token));
    ExitCode::SUCCESS
}
