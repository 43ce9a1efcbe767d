//! API tokens and what they grant.
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
use axum::http::{header, Method};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::api::error::ApiError;

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

    fn name(self) -> &'static str {
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

    fn covers(&self, action: Action, topic: &str) -> bool {
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
    fn find(&self, token: &str) -> Option<Arc<TokenEntry>> {
        let given: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for e in &self.entries {
            if crate::raft::rpc::secret_matches(&e.hash, &given) {
                found = Some(e.clone());
            }
        }
        found
    }
}

/// Who a request acts as, once authenticated.
#[derive(Debug, Clone)]
pub enum Access {
    /// No tokens are configured: everything is allowed.
    Open,
    Token(Arc<TokenEntry>),
    /// A public endpoint ([`is_public_route`]), served without a token: nothing is granted.
    Public,
}

impl Access {
    pub fn allows(&self, action: Action, topic: &str) -> bool {
        match self {
            Access::Open => true,
            Access::Token(t) => t.grants.iter().any(|g| g.covers(action, topic)),
            Access::Public => false,
        }
    }

    /// Whether `action` is granted on every topic name (a `*` grant).
    pub fn allows_all(&self, action: Action) -> bool {
        match self {
            Access::Open => true,
            Access::Token(t) => t
                .grants
                .iter()
                .any(|g| g.pattern == "*" && (g.action == action || g.action == Action::Admin)),
            Access::Public => false,
        }
    }

    /// Whether the topic is visible at all: some action is granted on it.
    pub fn sees(&self, topic: &str) -> bool {
        match self {
            Access::Open => true,
            Access::Token(t) => t.grants.iter().any(|g| glob_match(&g.pattern, topic)),
            Access::Public => false,
        }
    }

    pub fn require(&self, action: Action, topic: &str) -> Result<(), ApiError> {
        if self.allows(action, topic) {
            Ok(())
        } else {
            Err(self.forbidden(format!("{} on topic {topic:?}", action.name())))
        }
    }

    pub fn require_all(&self, action: Action) -> Result<(), ApiError> {
        if self.allows_all(action) {
            Ok(())
        } else {
            Err(self.forbidden(format!(
                "{} on every topic ({}:*)",
                action.name(),
                action.name()
            )))
        }
    }

    fn require_sees(&self, topic: &str) -> Result<(), ApiError> {
        if self.sees(topic) {
            Ok(())
        } else {
            Err(self.forbidden(format!("some action on topic {topic:?}")))
        }
    }

    fn forbidden(&self, what: String) -> ApiError {
        let name = match self {
            Access::Open | Access::Public => "",
            Access::Token(t) => &t.name,
        };
        ApiError::forbidden(format!("token {name:?} is not granted {what}"))
    }
}

/// What an endpoint needs, decided from its method and route before the handler runs.
#[derive(Debug, PartialEq, Eq)]
enum Need {
    /// Any valid token (the handler filters or checks further).
    Token,
    /// Some action on the topic: reading its description.
    Sees(String),
    Action(Action, String),
    /// `admin:*`: operations on the whole cluster.
    ClusterAdmin,
    /// A route the table does not list: refused.
    Unlisted,
}

/// Percent-decodes a path segment; `None` if it is not valid UTF-8 or a valid escape.
fn decode_segment(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hexpair = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hexpair, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn need(method: &Method, route: &str, path: &str) -> Result<Need, ApiError> {
    let topic = || -> Result<String, ApiError> {
        let raw = path.split('/').nth(3).unwrap_or_default();
        let name = decode_segment(raw).unwrap_or_default();
        crate::api::check_name("topic", &name)?;
        Ok(name)
    };
    let post = method == Method::POST;
    Ok(match route {
        "/v1/topics/{topic}" if method == Method::GET => Need::Sees(topic()?),
        "/v1/topics/{topic}" => Need::Action(Action::Admin, topic()?),
        "/v1/topics/{topic}/records" if post => Need::Action(Action::Publish, topic()?),
        "/v1/topics/{topic}/records" => Need::Action(Action::Consume, topic()?),
        "/v1/topics/{topic}/report" | "/v1/topics/{topic}/subscriptions" => Need::Sees(topic()?),
        "/v1/topics/{topic}/subscriptions/{sub}" => match *method {
            Method::GET => Need::Sees(topic()?),
            Method::DELETE => Need::Action(Action::Admin, topic()?),
            _ => Need::Action(Action::Consume, topic()?),
        },
        "/v1/topics/{topic}/subscriptions/{sub}/pull"
        | "/v1/topics/{topic}/subscriptions/{sub}/ack"
        | "/v1/topics/{topic}/subscriptions/{sub}/nack"
        | "/v1/topics/{topic}/subscriptions/{sub}/extend"
        | "/v1/topics/{topic}/subscriptions/{sub}/cursor" => {
            Need::Action(Action::Consume, topic()?)
        }
        "/v1/cluster" if method == Method::GET => Need::Token,
        r if r.starts_with("/v1/cluster") => Need::ClusterAdmin,
        // Listings and broadcasts: the handler filters by, or checks, each topic.
        "/v1/topics" | "/v1/report" | "/v1/broadcast" => Need::Token,
        // A route this table does not list is refused, never opened to any valid token: a new
        // endpoint must say here what it needs (`every_routed_operation_has_a_permission`).
        _ => Need::Unlisted,
    })
}

/// The `/v1` routes that need no token: the API's description, which tells nothing about the
/// data. The Authorization header is not looked at there.
const PUBLIC_ROUTES: &[&str] = &["/v1/openapi.json"];

/// Whether the `/v1` route pattern `route` is served without a token.
pub fn is_public_route(route: &str) -> bool {
    PUBLIC_ROUTES.contains(&route)
}

/// Authenticates a `/v1` request and checks what its endpoint needs. `route` is the matched
/// route pattern (`None` for an unknown path, which any valid token may get a 404 for).
pub fn authorize(
    tokens: &Tokens,
    cluster_secret: &str,
    method: &Method,
    route: Option<&str>,
    path: &str,
    headers: &axum::http::HeaderMap,
) -> Result<Access, ApiError> {
    if tokens.is_empty() {
        return Ok(Access::Open);
    }
    if route.is_some_and(is_public_route) {
        return Ok(Access::Public);
    }
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
    let Some(bearer) = bearer.filter(|b| !b.is_empty()) else {
        return Err(ApiError::unauthorized(
            "this node needs an API token: send `Authorization: Bearer <token>`",
        ));
    };
    if crate::raft::rpc::secret_matches(bearer.as_bytes(), cluster_secret.as_bytes()) {
        return Err(ApiError::unauthorized(
            "the cluster secret only opens the node-to-node endpoints; use an API token",
        ));
    }
    let access = tokens
        .find(bearer)
        .map(Access::Token)
        .ok_or_else(|| ApiError::unauthorized("the API token is not valid on this node"))?;
    match route.map(|r| need(method, r, path)).transpose()? {
        None | Some(Need::Token) => {}
        Some(Need::Sees(topic)) => access.require_sees(&topic)?,
        Some(Need::Action(action, topic)) => access.require(action, &topic)?,
        Some(Need::ClusterAdmin) => {
            if !access.allows_all(Action::Admin) {
                return Err(access.forbidden("admin on the cluster (admin:*)".into()));
            }
        }
        Some(Need::Unlisted) => {
            return Err(ApiError::forbidden(format!(
                "{method} {route} has no permission defined, so no token may use it",
                route = route.unwrap_or_default()
            )));
        }
    }
    Ok(access)
}

/// A new random token: `rq_` and 64 hex digits (256 bits).
pub fn new_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("rq_{}", hex(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation the router serves under `/v1` (as the API description lists them) has
    /// its own row in the permission table; a route it does not list is refused.
    #[test]
    fn every_routed_operation_has_a_permission() {
        let doc = crate::api::openapi::document();
        let mut checked = 0;
        for (route, item) in &doc.paths.paths {
            if !route.starts_with("/v1/") || is_public_route(route) {
                continue;
            }
            let path = route.replace("{topic}", "orders").replace("{sub}", "s");
            let methods = [
                (Method::GET, item.get.is_some()),
                (Method::PUT, item.put.is_some()),
                (Method::POST, item.post.is_some()),
                (Method::DELETE, item.delete.is_some()),
                (Method::PATCH, item.patch.is_some()),
            ];
            for (method, _) in methods.iter().filter(|(_, served)| *served) {
                let need = need(method, route, &path).expect("a valid topic name");
                assert!(
                    !matches!(need, Need::Unlisted),
                    "{method} {route} is routed but has no permission in auth::need"
                );
                checked += 1;
            }
        }
        assert!(checked >= 20, "only {checked} operations found");
        assert!(matches!(
            need(&Method::POST, "/v1/something-new", "/v1/something-new"),
            Ok(Need::Unlisted)
        ));
    }

    /// A valid token, even an admin's, is refused on a route the table does not list.
    #[test]
    fn an_unlisted_route_is_refused_to_every_token() {
        for token in ["r-token", "w-token", "c-token"] {
            assert_eq!(
                check(Some(token), Method::POST, "/v1/unlisted", "/v1/unlisted").err(),
                Some(403),
                "{token}"
            );
        }
        // The listings stay open to any valid token (their handlers filter by topic).
        assert!(check(Some("w-token"), Method::GET, "/v1/topics", "/v1/topics").is_ok());
        assert!(check(Some("c-token"), Method::GET, "/v1/report", "/v1/report").is_ok());
    }

    const SECRET: &str = "cluster-secret-0123456789";

    fn tokens() -> Tokens {
        let text = format!(
            "[[token]]\nname = \"writer\"\nsha256 = \"{}\"\ngrants = [\"publish:orders.*\"]\n\
             [[token]]\nname = \"root\"\nsha256 = \"{}\"\ngrants = [\"admin:*\"]\n\
             [[token]]\nname = \"reader\"\nsha256 = \"{}\"\ngrants = [\"consume:orders.eu\", \"admin:scratch-*\"]\n",
            token_hash_hex("w-token"),
            token_hash_hex("r-token").to_uppercase(),
            token_hash_hex("c-token"),
        );
        Tokens::parse(&text, SECRET).unwrap()
    }

    fn check(token: Option<&str>, method: Method, route: &str, path: &str) -> Result<Access, u16> {
        let mut headers = axum::http::HeaderMap::new();
        if let Some(t) = token {
            headers.insert(
                header::AUTHORIZATION,
                format!("Bearer {t}").parse().unwrap(),
            );
        }
        authorize(&tokens(), SECRET, &method, Some(route), path, &headers)
            .map_err(|e| e.problem.status)
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
    fn each_action_is_checked_on_its_endpoint() {
        let t = "/v1/topics/{topic}/records";
        assert!(check(
            Some("w-token"),
            Method::POST,
            t,
            "/v1/topics/orders.eu/records"
        )
        .is_ok());
        assert_eq!(
            check(
                Some("w-token"),
                Method::GET,
                t,
                "/v1/topics/orders.eu/records"
            )
            .unwrap_err(),
            403
        );
        assert_eq!(
            check(
                Some("w-token"),
                Method::POST,
                t,
                "/v1/topics/billing/records"
            )
            .unwrap_err(),
            403
        );
        assert!(check(
            Some("c-token"),
            Method::GET,
            t,
            "/v1/topics/orders.eu/records"
        )
        .is_ok());
        assert_eq!(
            check(
                Some("c-token"),
                Method::POST,
                t,
                "/v1/topics/orders.eu/records"
            )
            .unwrap_err(),
            403
        );
        // admin includes publish and consume, on its own pattern only.
        assert!(check(
            Some("c-token"),
            Method::POST,
            t,
            "/v1/topics/scratch-1/records"
        )
        .is_ok());
        let topic = "/v1/topics/{topic}";
        assert_eq!(
            check(Some("w-token"), Method::PUT, topic, "/v1/topics/orders.eu").unwrap_err(),
            403
        );
        assert!(check(Some("w-token"), Method::GET, topic, "/v1/topics/orders.eu").is_ok());
        assert_eq!(
            check(Some("w-token"), Method::GET, topic, "/v1/topics/billing").unwrap_err(),
            403
        );
        let sub = "/v1/topics/{topic}/subscriptions/{sub}";
        assert!(check(
            Some("c-token"),
            Method::PUT,
            sub,
            "/v1/topics/orders.eu/subscriptions/s"
        )
        .is_ok());
        assert_eq!(
            check(
                Some("c-token"),
                Method::DELETE,
                sub,
                "/v1/topics/orders.eu/subscriptions/s"
            )
            .unwrap_err(),
            403
        );
        // The cluster: anyone may look, only admin:* may change it.
        assert!(check(Some("w-token"), Method::GET, "/v1/cluster", "/v1/cluster").is_ok());
        assert_eq!(
            check(
                Some("c-token"),
                Method::POST,
                "/v1/cluster/snapshot",
                "/v1/cluster/snapshot"
            )
            .unwrap_err(),
            403
        );
        assert!(check(
            Some("r-token"),
            Method::POST,
            "/v1/cluster/snapshot",
            "/v1/cluster/snapshot"
        )
        .is_ok());
    }

    #[test]
    fn missing_wrong_and_secret_tokens_are_unauthorized() {
        let route = "/v1/cluster";
        assert_eq!(check(None, Method::GET, route, route).unwrap_err(), 401);
        assert_eq!(
            check(Some("nope"), Method::GET, route, route).unwrap_err(),
            401
        );
        assert_eq!(
            check(Some(SECRET), Method::GET, route, route).unwrap_err(),
            401
        );
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(header::AUTHORIZATION, "Basic dXNlcjpwYXNz".parse().unwrap());
        let err = authorize(
            &tokens(),
            SECRET,
            &Method::GET,
            Some(route),
            route,
            &headers,
        )
        .unwrap_err();
        assert_eq!(err.problem.status, 401);
        // No tokens configured: open.
        assert!(matches!(
            authorize(
                &Tokens::default(),
                SECRET,
                &Method::GET,
                Some(route),
                route,
                &headers
            ),
            Ok(Access::Open)
        ));
    }

    #[test]
    fn the_description_is_public_and_grants_nothing() {
        let route = "/v1/openapi.json";
        for token in [None, Some("nope"), Some(SECRET), Some("r-token")] {
            let access = check(token, Method::GET, route, route)
                .unwrap_or_else(|status| panic!("{token:?}: {status}"));
            assert!(matches!(access, Access::Public), "{token:?}");
            assert!(!access.sees("orders.eu"));
            assert!(!access.allows(Action::Consume, "orders.eu"));
            assert!(!access.allows_all(Action::Admin));
        }
        // Only that route: the cluster secret still opens nothing else.
        assert_eq!(
            check(Some(SECRET), Method::GET, "/v1/topics", "/v1/topics").unwrap_err(),
            401
        );
        assert_eq!(
            check(None, Method::GET, "/v1/topics", "/v1/openapi.json/x").unwrap_err(),
            401
        );
    }

    #[test]
    fn escaped_topic_names_are_judged_decoded() {
        // `orders%2Eeu` is `orders.eu`; a pattern must never match the escaped form instead.
        let t = "/v1/topics/{topic}/records";
        assert!(check(
            Some("w-token"),
            Method::POST,
            t,
            "/v1/topics/orders%2Eeu/records"
        )
        .is_ok());
        assert_eq!(
            check(
                Some("w-token"),
                Method::POST,
                t,
                "/v1/topics/orders%2F/records"
            )
            .unwrap_err(),
            400
        );
        assert_eq!(
            check(Some("w-token"), Method::POST, t, "/v1/topics/%ZZ/records").unwrap_err(),
            400
        );
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
