//! What each `/v1` route needs (the route-to-permission table) and the check of a request
//! against it: authentication by bearer token, then the action the route needs on its topic.
//! A route the table does not list is refused to every token. The tokens themselves are
//! [`crate::tokens`]'.

use std::sync::Arc;

use axum::http::{header, Method};

use super::error::ApiError;
use crate::tokens::{glob_match, secret_matches, Action, TokenEntry, Tokens};

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
        super::check_name("topic", &name)?;
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
    if secret_matches(bearer.as_bytes(), cluster_secret.as_bytes()) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::token_hash_hex;

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
}
