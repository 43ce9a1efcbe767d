//! The public HTTP API of API.md: routing, the shutdown gate, and one module per family.

pub mod cluster;
pub mod error;
pub mod limits;
pub mod membership;
pub mod records;
pub mod reports;
pub mod subscriptions;
pub mod topics;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;

use self::error::ApiError;
pub use crate::auth::Access;
use crate::node::AppState;

pub fn router(state: AppState) -> Router {
    let body_limit = state.settings.max_body_bytes;
    let v1 = Router::new()
        .route("/v1/topics", get(topics::list))
        .route(
            "/v1/topics/{topic}",
            put(topics::create).get(topics::get).delete(topics::delete),
        )
        .route(
            "/v1/topics/{topic}/records",
            get(records::read).post(records::publish),
        )
        .route("/v1/topics/{topic}/report", get(reports::topic))
        .route("/v1/report", get(reports::all))
        .route("/v1/broadcast", post(reports::broadcast))
        .route("/v1/topics/{topic}/subscriptions", get(subscriptions::list))
        .route(
            "/v1/topics/{topic}/subscriptions/{sub}",
            put(subscriptions::create)
                .get(subscriptions::get)
                .delete(subscriptions::delete),
        )
        .route(
            "/v1/topics/{topic}/subscriptions/{sub}/pull",
            post(subscriptions::pull),
        )
        .route(
            "/v1/topics/{topic}/subscriptions/{sub}/ack",
            post(subscriptions::ack),
        )
        .route(
            "/v1/topics/{topic}/subscriptions/{sub}/nack",
            post(subscriptions::nack),
        )
        .route(
            "/v1/topics/{topic}/subscriptions/{sub}/extend",
            post(subscriptions::extend),
        )
        .route(
            "/v1/topics/{topic}/subscriptions/{sub}/cursor",
            put(subscriptions::cursor),
        )
        .route("/v1/cluster", get(cluster::status))
        .route("/v1/cluster/snapshot", post(cluster::snapshot))
        .route("/v1/cluster/nodes", post(membership::add_node))
        .route("/v1/cluster/nodes/{id}", delete(membership::remove_node))
        .route("/v1/cluster/voters", post(membership::set_voters))
        .route(
            "/v1/cluster/transfer-leader",
            post(membership::transfer_leader),
        )
        .layer(middleware::from_fn_with_state(state.clone(), shutdown_gate))
        .layer(middleware::from_fn_with_state(state.clone(), auth_gate))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            limits::load_gate,
        ))
        .layer(DefaultBodyLimit::max(body_limit));
    Router::new()
        .merge(v1)
        .route("/healthz", get(cluster::healthz))
        .route("/readyz", get(cluster::readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// Every `/v1` request is authenticated and checked against what its endpoint needs before
/// anything else happens (see [`crate::auth`]); the handler gets the [`Access`] it acts as.
async fn auth_gate(State(node): State<AppState>, mut req: Request, next: Next) -> Response {
    // A cheap clone (the route pattern is shared), so the request can be borrowed below.
    let route = req.extensions().get::<MatchedPath>().cloned();
    let access = crate::auth::authorize(
        &node.settings.tokens,
        &node.settings.cluster_secret,
        req.method(),
        route.as_ref().map(MatchedPath::as_str),
        req.uri().path(),
        req.headers(),
    );
    match access {
        Ok(access) => {
            req.extensions_mut().insert(access);
            next.run(req).await
        }
        Err(e) => {
            let unauthorized = e.problem.status == 401;
            let mut resp = e.into_response();
            if unauthorized {
                resp.headers_mut().insert(
                    axum::http::header::WWW_AUTHENTICATE,
                    axum::http::HeaderValue::from_static("Bearer realm=\"raftq\""),
                );
            }
            resp
        }
    }
}

/// While shutting down, every `/v1` request is answered 503 `shutting_down` (with the
/// leader's address) before anything else happens.
async fn shutdown_gate(State(node): State<AppState>, req: Request, next: Next) -> Response {
    if node.is_shutting_down() {
        return ApiError::shutting_down(node.leader().filter(|(id, _)| *id != node.id))
            .into_response();
    }
    next.run(req).await
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::invalid(format!("no endpoint {}; see API.md", uri.path())).with_status(404)
}

async fn method_not_allowed() -> ApiError {
    ApiError::invalid("method not allowed on this endpoint").with_status(405)
}

/// The `{topic}` path segment, with an undecodable segment answered as a problem.
pub struct TopicName(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for TopicName {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        let axum::extract::Path(name) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|e| {
                    ApiError::invalid(format!("invalid topic in path: {}", e.body_text()))
                })?;
        check_name("topic", &name)?;
        Ok(TopicName(name))
    }
}

/// Checks a topic or subscription name from the path.
pub fn check_name(kind: &str, name: &str) -> Result<(), ApiError> {
    if raftq_client::api::is_valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "invalid {kind} name {name:?}: names are 1 to 128 characters of [A-Za-z0-9._-]"
        )))
    }
}

/// Parses a JSON body into `T`, with a problem that says what is wrong.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("malformed JSON body: {e}")))
}
