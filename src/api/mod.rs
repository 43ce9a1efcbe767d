//! The public HTTP API of API.md: routing, the shutdown gate, and one module per family.
//!
//! Each handler carries its own OpenAPI description (`#[utoipa::path]`: parameters, body,
//! every answer with its status and problem codes), and [`operations`] registers handler and
//! description together; [`openapi`] assembles them into the document served at
//! `GET /v1/openapi.json`.

pub mod auth;
pub mod cluster;
pub mod error;
pub mod limits;
pub mod membership;
pub mod openapi;
pub mod records;
pub mod reports;
pub mod subscriptions;
pub mod topics;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRef, MatchedPath, Request, State};
use axum::http::Uri;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use self::error::ApiError;
use self::limits::Limits;
use crate::node::{AppState, Node, WriteError};
use crate::state::{Command, CommitPoint, Outcome};
pub use auth::Access;

/// What the API's handlers and middleware share: the replica, and the API's own load limits.
/// A handler takes the part it needs (`State<AppState>` or `State<Arc<Limits>>`).
#[derive(Clone)]
pub struct ApiState {
    pub node: AppState,
    pub limits: Arc<Limits>,
}

impl FromRef<ApiState> for AppState {
    fn from_ref(state: &ApiState) -> AppState {
        state.node.clone()
    }
}

impl FromRef<ApiState> for Arc<Limits> {
    fn from_ref(state: &ApiState) -> Arc<Limits> {
        state.limits.clone()
    }
}

/// Every operation of the API, each registered together with its description (its
/// `#[utoipa::path]`), so that what is routed and what [`openapi::document`] describes are one
/// list: the `/v1` operations, and the probes outside `/v1`.
pub(crate) fn operations() -> (OpenApiRouter<ApiState>, OpenApiRouter<ApiState>) {
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

/// The public API's routes, on `node`.
pub fn router(node: AppState) -> Router {
    let body_limit = node.settings().max_body_bytes;
    let state = ApiState {
        limits: Arc::new(Limits::new(node.settings())),
        node,
    };
    let (v1, probes) = operations();
    let v1 = v1
        .layer(middleware::from_fn_with_state(
            state.node.clone(),
            shutdown_gate,
        ))
        .layer(middleware::from_fn_with_state(
            state.node.clone(),
            auth_gate,
        ))
        .layer(middleware::from_fn_with_state(
            state.limits.clone(),
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
/// anything else happens (see [`auth`]); the handler gets the [`Access`] it acts as.
async fn auth_gate(State(node): State<AppState>, mut req: Request, next: Next) -> Response {
    // A cheap clone (the route pattern is shared), so the request can be borrowed below.
    let route = req.extensions().get::<MatchedPath>().cloned();
    let settings = node.settings();
    let access = auth::authorize(
        &settings.tokens,
        &settings.cluster_secret,
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
        return ApiError::shutting_down(node.other_leader()).into_response();
    }
    next.run(req).await
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::invalid(format!("no endpoint {}; see API.md", uri.path())).with_status(404)
}

async fn method_not_allowed() -> ApiError {
    ApiError::invalid("method not allowed on this endpoint").with_status(405)
}

/// The replica's answer to a write, as the problem API.md gives it. `uri` is the request's,
/// for the 307 to the leader.
pub fn write_error(e: WriteError, uri: &Uri) -> ApiError {
    match e {
        WriteError::NotLeader { id, url } => ApiError::not_leader(id, &url, &path_and_query(uri)),
        WriteError::NoLeader => ApiError::no_leader(),
        WriteError::ShuttingDown { leader } => ApiError::shutting_down(leader),
        WriteError::Overloaded(why) => ApiError::overloaded(why),
        WriteError::Refused(refused) => refused.into(),
        WriteError::Invalid(why) => ApiError::invalid(why),
        WriteError::Conflict(why) => ApiError::invalid(why).with_status(409),
        WriteError::Indeterminate(why) => ApiError::indeterminate(why),
        WriteError::Internal(why) => ApiError::internal(why),
        WriteError::Unavailable(why) => ApiError::internal(why).with_status(503),
        WriteError::TimedOut(why) => ApiError::internal(why).with_status(504),
    }
}

/// The path and query of `uri`, for a redirect to the same endpoint on another node.
fn path_and_query(uri: &Uri) -> String {
    uri.path_and_query()
        .map_or_else(|| uri.path().to_string(), |pq| pq.as_str().to_string())
}

/// Proposes `cmd` on `node` and answers as the API does.
pub async fn propose(
    node: &Node,
    uri: &Uri,
    cmd: Command,
) -> Result<(Outcome, CommitPoint), ApiError> {
    node.propose(cmd).await.map_err(|e| write_error(e, uri))
}

/// Answers 307 to the leader or 503 `no_leader` unless this node leads with a quorum.
pub fn require_leader(node: &Node, uri: &Uri) -> Result<(), ApiError> {
    node.check_leader().map_err(|e| write_error(e, uri))
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
/// An answer that holds records: JSON, or their binary form (`application/vnd.raftq.records`,
/// `raftq_client::api::records_form`) when the request's `Accept` names it.
pub enum RecordsAnswer<T> {
    Json(T),
    Binary(Vec<u8>),
}

impl<T> RecordsAnswer<T> {
    /// `answer` in the form `headers` ask for: the binary form made by `binary`, or JSON.
    pub fn new(
        headers: &axum::http::HeaderMap,
        answer: T,
        binary: impl FnOnce(&T) -> Result<Vec<u8>, String>,
    ) -> Result<Self, ApiError> {
        if accepts_records(headers) {
            binary(&answer)
                .map(RecordsAnswer::Binary)
                .map_err(|e| ApiError::internal(format!("encoding the records: {e}")))
        } else {
            Ok(RecordsAnswer::Json(answer))
        }
    }
}

/// An answer holding records, as a JSON body.
pub trait JsonBody {
    fn json_body(&self) -> serde_json::Result<Vec<u8>>;
}

impl JsonBody for raftq_client::api::PullResponse {
    fn json_body(&self) -> serde_json::Result<Vec<u8>> {
        self.to_json()
    }
}

impl JsonBody for raftq_client::api::ReadResponse {
    fn json_body(&self) -> serde_json::Result<Vec<u8>> {
        self.to_json()
    }
}

impl<T: JsonBody> IntoResponse for RecordsAnswer<T> {
    fn into_response(self) -> Response {
        match self {
            RecordsAnswer::Json(answer) => match answer.json_body() {
                Ok(body) => (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        axum::http::HeaderValue::from_static("application/json"),
                    )],
                    body,
                )
                    .into_response(),
                Err(e) => {
                    ApiError::internal(format!("encoding the answer as JSON: {e}")).into_response()
                }
            },
            RecordsAnswer::Binary(body) => (
                [(
                    axum::http::header::CONTENT_TYPE,
                    raftq_client::api::RECORDS_CONTENT_TYPE,
                )],
                body,
            )
                .into_response(),
        }
    }
}

/// Whether a request's `Accept` names the binary form of records (any of its media ranges,
/// whatever its parameters).
pub(crate) fn accepts_records(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|range| range.split(';').next())
        .any(|media| {
            media
                .trim()
                .eq_ignore_ascii_case(raftq_client::api::RECORDS_CONTENT_TYPE)
        })
}

/// The schema of the binary form of records, for the OpenAPI document.
pub struct RecordsBody;

impl utoipa::PartialSchema for RecordsBody {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
            .description(Some(
                "A 4-byte big-endian length, that many bytes of JSON (the answer without its \
                 records' contents), then the records as Kafka record batches",
            ))
            .into()
    }
}

impl utoipa::ToSchema for RecordsBody {}

pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("malformed JSON body: {e}")))
}

/// The SDK checks limits and names before it sends; the state machine enforces its own copies
/// when it applies. Two copies that disagree would let the SDK send what apply refuses (or
/// refuse what it would take), so this test keeps them equal.
#[cfg(test)]
mod sdk_agrees_with_state {
    use raftq_client::api as sdk;

    use crate::state;

    #[test]
    fn limits_and_header_names_are_the_same() {
        assert_eq!(sdk::MAX_NAME_LEN, state::MAX_NAME_LEN);
        assert_eq!(sdk::MAX_PULL, state::MAX_PULL);
        assert_eq!(sdk::MAX_ACK_TIMEOUT_MS, state::MAX_ACK_TIMEOUT_MS);
        assert_eq!(sdk::MAX_NACK_DELAY_MS, state::MAX_NACK_DELAY_MS);
        assert_eq!(sdk::HEADER_COMMIT_INDEX, state::HEADER_COMMIT_INDEX);
        assert_eq!(
            sdk::HEADER_COMMIT_TIMESTAMP_MS,
            state::HEADER_COMMIT_TIMESTAMP_MS
        );
    }

    #[test]
    fn name_rules_are_the_same() {
        let long = "n".repeat(state::MAX_NAME_LEN);
        let too_long = "n".repeat(state::MAX_NAME_LEN + 1);
        let names = [
            "",
            "a",
            "A.b_c-9",
            "with space",
            "slash/y",
            "ünicode",
            "dot.",
            "-",
            &long,
            &too_long,
        ];
        for name in names {
            assert_eq!(
                sdk::is_valid_name(name),
                state::is_valid_name(name),
                "the SDK and the state machine disagree about {name:?}"
            );
        }
        // Byte by byte: every single-byte name is judged the same.
        for b in 0u8..=127 {
            let name = (b as char).to_string();
            assert_eq!(
                sdk::is_valid_name(&name),
                state::is_valid_name(&name),
                "{name:?}"
            );
        }
    }
}
