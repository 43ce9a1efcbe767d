//! API tokens and what they grant: the tokens file, its hashes and grants. What each `/v1`
//! route needs, and the check of a request against it, are [`crate::api::auth`]'s.
//!
//! A token is a random string the operator hands to an application. The server never holds
//! it: the tokens file lists each token's SHA-256 (tokens are long and random, so a fast hash
//! is enough; there is nothing to guess from), its name for logs, and its grants. A grant is
//! `ACTION:PATTERN`: `publish`, `consume` or `admin` on the topics whose names match
//! `PATTERN`, where `*` matches any run of characters (`orders.*`, `*`). `admin` includes
//! `publish` and `consume`. Operations on the whole cluster (membership, leadership,
//! snapshots) need `admin:*`.
//!
//! ```toml
//! [[token]]
//! name = "orders-writer"
//! sha256 = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
//! grants = ["publish:orders.*"]
//! ```
//!
//! The API's description (`GET /v1/openapi.json`) is public: it needs no token, and grants
//! nothing.
//!
//! With no tokens file the API is open (and the node says so loudly at start-up). The cluster
//! secret, which opens the node-to-node Raft endpoints, is never a valid API token, and no API
//! token opens those endpoints.

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::codec::hex;

/// What a grant allows on the topics it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Publish records (and broadcast markers).
    Publish,
    /// Read, pull, ack, nack, extend leases, move cursors, create subscriptions.
    Consume,
    /// Create and delete topics and subscriptions; with pattern `*`, the cluster too.
    /// Includes `Publish` and `Consume`.
    Admin,
}

impl Action {
    fn parse(text: &str) -> Option<Action> {
        match text {
            "publish" => Some(Action::Publish),
            "consume" => Some(Action::Consume),
            "admin" => Some(Action::Admin),
            _ => None,
        }
    }

    /// The action's name in a grant (`publish`, `consume`, `admin`).
    pub fn name(self) -> &'static str {
        match self {
            Action::Publish => "publish",
            Action::Consume => "consume",
            Action::Admin => "admin",
        }
    }
}

/// One `ACTION:PATTERN` grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub action: Action,
    pub pattern: String,
}

impl Grant {
    pub fn parse(text: &str) -> anyhow::Result<Grant> {
        let (action, pattern) = text
            .split_once(':')
            .ok_or_else(|| anyhow!("grant {text:?} is not of the form ACTION:PATTERN"))?;
        let action = Action::parse(action).ok_or_else(|| {
            anyhow!("grant {text:?}: unknown action {action:?} (publish, consume or admin)")
        })?;
        let literal_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if pattern.is_empty()
            || pattern.len() > 128
            || !pattern.chars().all(|c| c == '*' || literal_ok(c))
        {
            bail!(
                "grant {text:?}: the pattern must be 1 to 128 characters of [A-Za-z0-9._-] and `*`"
            );
        }
        Ok(Grant {
            action,
            pattern: pattern.to_string(),
        })
    }

    /// Whether this grant allows `action` on `topic` (`admin` allows every action).
    pub fn covers(&self, action: Action, topic: &str) -> bool {
        (self.action == action || self.action == Action::Admin) && glob_match(&self.pattern, topic)
    }
}

/// `*` matches any run of characters (also none); everything else matches itself.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    // Classic greedy match with one backtrack point: linear in practice, never exponential.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ni));
            pi += 1;
        } else if pi < p.len() && p[pi] == n[ni] {
            pi += 1;
            ni += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// One configured token: never the token itself, only its hash.
pub struct TokenEntry {
    pub name: String,
    hash: [u8; 32],
    pub grants: Vec<Grant>,
}

impl std::fmt::Debug for TokenEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEntry")
            .field("name", &self.name)
            .field("grants", &self.grants)
            .finish_non_exhaustive()
    }
}

/// Every token a node accepts. Empty means the API is open.
#[derive(Debug, Default)]
pub struct Tokens {
    entries: Vec<Arc<TokenEntry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    token: Vec<TokenConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenConfig {
    name: String,
    sha256: String,
    grants: Vec<String>,
}

/// SHA-256 of a token, as the tokens file holds it (lowercase hex).
pub fn token_hash_hex(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

fn parse_hash(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in text.as_bytes().chunks(2).enumerate() {
        let s = std::str::from_utf8(chunk).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

impl Tokens {
    /// Reads and checks a tokens file. `cluster_secret` must not be one of its tokens.
    pub fn load(path: &Path, cluster_secret: &str) -> anyhow::Result<Tokens> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the tokens file {}", path.display()))?;
        Self::parse(&text, cluster_secret)
            .with_context(|| format!("invalid tokens file {}", path.display()))
    }

    pub fn parse(text: &str, cluster_secret: &str) -> anyhow::Result<Tokens> {
        let file: TokensFile = toml::from_str(text)?;
        if file.token.is_empty() {
            bail!(
                "it lists no [[token]]; remove the setting to run with an open API, or add a token"
            );
        }
        let secret_hash = Sha256::digest(cluster_secret.as_bytes());
        let mut entries: Vec<Arc<TokenEntry>> = Vec::new();
        for t in file.token {
            let hash = parse_hash(&t.sha256.to_ascii_lowercase()).ok_or_else(|| {
                anyhow!(
                    "token {:?}: sha256 must be 64 hex digits (the SHA-256 of the token; \
                     `raftq token create` prints it)",
                    t.name
                )
            })?;
            if t.name.is_empty() || t.name.len() > 128 {
                bail!("a token's name must be 1 to 128 characters");
            }
            if entries.iter().any(|e| e.name == t.name) {
                bail!("token {:?} is listed twice", t.name);
            }
            if entries.iter().any(|e| e.hash == hash) {
                bail!("token {:?} has the same hash as another token", t.name);
            }
            if hash[..] == secret_hash[..] {
                bail!(
                    "token {:?} is the cluster secret; the cluster secret must never be an API token",
                    t.name
                );
            }
            if t.grants.is_empty() {
                bail!("token {:?} has no grants", t.name);
            }
            let grants = t
                .grants
                .iter()
                .map(|g| Grant::parse(g))
                .collect::<anyhow::Result<Vec<_>>>()
                .with_context(|| format!("token {:?}", t.name))?;
            entries.push(Arc::new(TokenEntry {
                name: t.name,
                hash,
                grants,
            }));
        }
        Ok(Tokens { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entry of `token`, comparing against every configured hash in constant time.
    pub fn find(&self, token: &str) -> Option<Arc<TokenEntry>> {
        let given: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for e in &self.entries {
            if secret_matches(&e.hash, &given) {
                found = Some(e.clone());
            }
        }
        found
    }
}

/// A new random token: `rq_` and 64 hex digits (256 bits).
pub fn new_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("rq_{}", hex(&bytes))
}

/// Constant-time comparison, so a wrong secret's timing says nothing about the right one.
pub fn secret_matches(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = given.len() ^ expected.len();
    for (i, b) in expected.iter().enumerate() {
        diff |= (given.get(i).copied().unwrap_or(0) ^ b) as usize;
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "cluster-secret-0123456789";

    #[test]
    fn secret_comparison() {
        assert!(secret_matches(b"abc", b"abc"));
        assert!(!secret_matches(b"abd", b"abc"));
        assert!(!secret_matches(b"ab", b"abc"));
        assert!(!secret_matches(b"abcd", b"abc"));
        assert!(!secret_matches(b"", b"abc"));
    }

    #[test]
    fn glob_matches_stars_anywhere() {
        for (p, n, want) in [
            ("*", "anything", true),
            ("orders.*", "orders.eu", true),
            ("orders.*", "orders.", true),
            ("orders.*", "orders", false),
            ("*.eu", "orders.eu", true),
            ("*.eu", "orders.us", false),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXcYb", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
            ("**", "", true),
        ] {
            assert_eq!(glob_match(p, n), want, "{p} vs {n}");
        }
    }

    #[test]
    fn bad_tokens_files_say_what_is_wrong() {
        let h = token_hash_hex("x");
        for (text, want) in [
            ("".to_string(), "no [[token]]"),
            ("[[token]]\nname = \"a\"\nsha256 = \"abc\"\ngrants = [\"admin:*\"]\n".to_string(), "64 hex digits"),
            (format!("[[token]]\nname = \"a\"\nsha256 = \"{h}\"\ngrants = []\n"), "no grants"),
            (format!("[[token]]\nname = \"a\"\nsha256 = \"{h}\"\ngrants = [\"read:*\"]\n"), "unknown action"),
            (format!("[[token]]\nname = \"a\"\nsha256 = \"{h}\"\ngrants = [\"admin:a/b\"]\n"), "pattern"),
            (format!("[[token]]\nname = \"a\"\nsha256 = \"{h}\"\ngrants = [\"admin\"]\n"), "ACTION:PATTERN"),
            (
                format!("[[token]]\nname = \"a\"\nsha256 = \"{h}\"\ngrants = [\"admin:*\"]\n[[token]]\nname = \"a\"\nsha256 = \"{}\"\ngrants = [\"admin:*\"]\n", token_hash_hex("y")),
                "listed twice",
            ),
            (
                format!("[[token]]\nname = \"s\"\nsha256 = \"{}\"\ngrants = [\"admin:*\"]\n", token_hash_hex(SECRET)),
                "cluster secret",
            ),
            (format!("[[token]]\nname = \"a\"\nsha256 = \"{h}\"\ngrants = [\"admin:*\"]\ntoken = \"x\"\n"), "unknown field"),
        ] {
            let err = format!("{:#}", Tokens::parse(&text, SECRET).unwrap_err());
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
    }
}
