//! The public HTTP API of API.md: routing, the shutdown gate, and one module per family.
//!
//! Each handler carries its own OpenAPI description (`#[utoipa::path]`: parameters, body,
//! every answer with its status and problem codes), and [`operations`] registers handler and
//! description together; [`openapi`] assembles them into the document served at
//! `GET /v1/openapi.json`.

pub mod cluster;
pub mod error;
pub mod limits;
pub mod membership;
pub mod openapi;
pub mod records;
pub mod reports;
pub mod subscriptions;
pub mod topics;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use self::error::ApiError;
pub use crate::auth::Access;
use crate::node::AppState;

/// Every operation of the API, each registered together with its description (its
/// `#[utoipa::path]`), so that what is routed and what [`openapi::document`] describes are one
/// list: the `/v1` operations, and the probes outside `/v1`.
pub(crate) fn operations() -> (OpenApiRouter<AppState>, OpenApiRouter<AppState>) {
    let v1 = OpenApiRouter::default()
        .routes(routes!(topics::list))
        .routes(routes!(topics::create, topics::get, topics::delete))
        .routes(routes!(records::read, records::publish))
        .routes(routes!(reports::topic))
        .routes(routes!(reports::all))
        .routes(routes!(reports::broadcast))
        .routes(routes!(subscriptions::list))
        .routes(routes!(
            subscriptions::create,
            subscriptions::get,
            subscriptions::delete
        ))
        .routes(routes!(subscriptions::pull))
        .routes(routes!(subscriptions::ack))
        .routes(routes!(subscriptions::nack))
        .routes(routes!(subscriptions::extend))
        .routes(routes!(subscriptions::cursor))
        .routes(routes!(cluster::status))
        .routes(routes!(cluster::snapshot))
        .routes(routes!(membership::add_node))
        .routes(routes!(membership::remove_node))
        .routes(routes!(membership::set_voters))
        .routes(routes!(membership::transfer_leader))
        .routes(routes!(openapi::description));
    let probes = OpenApiRouter::default()
        .routes(routes!(cluster::healthz))
        .routes(routes!(cluster::readyz));
    (v1, probes)
}

pub fn router(state: AppState) -> Router {
    let body_limit = state.settings.max_body_bytes;
    let (v1, probes) = operations();
    let v1 = v1
        .layer(middleware::from_fn_with_state(state.clone(), shutdown_gate))
        .layer(middleware::from_fn_with_state(state.clone(), auth_gate))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            limits::load_gate,
        ))
        .layer(DefaultBodyLimit::max(body_limit));
    let (routes, _) = v1.merge(probes).split_for_parts();
    routes
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

/// Described as the `{topic}` path parameter.
impl utoipa::IntoParams for TopicName {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![name_param("topic", "The topic's name")]
    }
}

/// A path parameter that is a topic or subscription name, as [`check_name`] checks it.
pub(crate) fn name_param(name: &str, description: &str) -> utoipa::openapi::path::Parameter {
    use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
    use utoipa::openapi::{ObjectBuilder, Required, Type};
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Path)
        .required(Required::True)
        .description(Some(description))
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(raftq_client::api::NAME_PATTERN)),
        ))
        .build()
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
