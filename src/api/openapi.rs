//! The OpenAPI 3 description of the API, served at `GET /v1/openapi.json` without a token.
//!
//! Nothing here is written by hand about an endpoint: every path, parameter, body and answer
//! comes from the handler's own `#[utoipa::path]` and the API types' `ToSchema` derives (in
//! `raftq_client::api`, behind its `openapi` feature), collected by [`super::operations`], the
//! same list the router is built from. What this module adds is the document's frame: its
//! title and version, the bearer token scheme, the problem answers shared by the handlers
//! ([`responses`]), two rules the derives cannot state (an optional body is never `null`; a
//! record carries exactly one of `value` and `value_b64`), and the tests that hold the
//! description to API.md and to the code's limits.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::IntoResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

/// The name of the bearer token scheme that every secured operation requires.
pub const BEARER: &str = "bearer";
/// The content type of every error answer.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The document's frame; [`document`] adds the operations.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "raftq",
        version = env!("CARGO_PKG_VERSION"),
        description = "A replicated message queue on Raft. Every error is an RFC 9457 problem \
            (`application/problem+json`) whose `code` is one of the documented codes. Writes sent \
            to a follower answer 307 to the leader. With API tokens configured, every `/v1` \
            operation but this description needs `Authorization: Bearer <token>`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    components(schemas(raftq_client::api::Problem)),
    modifiers(&BearerScheme),
    tags(
        (name = "topics", description = "Topics: replicated, append-only logs of records"),
        (name = "records", description = "Publish and read records"),
        (name = "subscriptions", description = "Durable consumer state: pull, ack, nack, extend, cursor"),
        (name = "reports", description = "Commit points, cumulative counters and broadcast markers"),
        (name = "cluster", description = "Membership, leadership, snapshots and probes"),
        (name = "meta", description = "This description"),
    )
)]
struct ApiDoc;

/// Adds the bearer token scheme (API tokens; see `raftq token create`).
struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API token of the node's tokens file, granted what the operation needs",
                    ))
                    .build(),
            ),
        );
    }
}

/// The whole description: the frame plus every operation [`super::operations`] registers.
pub fn document() -> &'static utoipa::openapi::OpenApi {
    static DOCUMENT: OnceLock<utoipa::openapi::OpenApi> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let (v1, probes) = super::operations();
        let mut document = OpenApiRouter::with_openapi(ApiDoc::openapi())
            .merge(v1)
            .merge(probes)
            .into_openapi();
        optional_bodies_are_never_null(&mut document);
        a_record_has_exactly_one_value(&mut document);
        document
    })
}

/// A record as published carries exactly one of `value` and `value_b64` (as a string; a
/// `null` is as good as leaving the field out), which `RecordIn`'s fields alone cannot say:
/// its schema is theirs and that rule (`records::convert` enforces it).
fn a_record_has_exactly_one_value(document: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, OneOfBuilder, Type};
    let Some(schemas) = document.components.as_mut().map(|c| &mut c.schemas) else {
        return;
    };
    let Some(record) = schemas.remove("RecordIn") else {
        return;
    };
    let given = |field: &str| {
        ObjectBuilder::new()
            .required(field)
            .property(field, ObjectBuilder::new().schema_type(Type::String))
    };
    let rule = OneOfBuilder::new()
        .item(given("value"))
        .item(given("value_b64"));
    let schema = AllOfBuilder::new()
        .item(record)
        .item(rule)
        .description(Some(
            "A record as a producer sends it: exactly one of `value` (UTF-8 text) or \
             `value_b64` (standard base64)",
        ));
    schemas.insert("RecordIn".to_string(), schema.into());
}

/// utoipa describes an optional body (`request_body(content = Option<T>)`) as
/// `oneOf: [null, T]`. An optional body of this API is one that may be left out (or sent
/// empty), never a JSON `null`, which the handlers refuse: its schema is `T`, and the body is
/// not required.
fn optional_bodies_are_never_null(document: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::schema::{Schema, SchemaType, Type};
    use utoipa::openapi::{RefOr, Required};
    let is_null = |schema: &RefOr<Schema>| matches!(schema, RefOr::T(Schema::Object(o)) if o.schema_type == SchemaType::Type(Type::Null));
    for item in document.paths.paths.values_mut() {
        let operations = [
            &mut item.put,
            &mut item.post,
            &mut item.patch,
            &mut item.delete,
        ];
        for operation in operations.into_iter().flatten() {
            let Some(body) = operation.request_body.as_mut() else {
                continue;
            };
            if body.required == Some(Required::True) {
                continue;
            }
            for content in body.content.values_mut() {
                let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema else {
                    continue;
                };
                let mut rest: Vec<_> = one_of.items.iter().filter(|s| !is_null(s)).collect();
                if rest.len() == 1 && one_of.items.len() == 2 {
                    content.schema = Some(rest.remove(0).clone());
                }
            }
        }
    }
}

/// The description as JSON, rendered once.
fn document_json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| {
        document()
            .to_pretty_json()
            .unwrap_or_else(|e| format!("{{\"error\": \"cannot render the description: {e}\"}}"))
    })
}

/// This description of the API (OpenAPI 3.1, JSON). Needs no token.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "get_openapi",
    tag = "meta",
    responses(
        (status = 200, description = "The OpenAPI description of this API",
            body = inline(Object), content_type = "application/json"),
        responses::Overloaded,
        responses::Unavailable,
    )
)]
pub async fn description() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        document_json(),
    )
}

/// The problem answers the handlers share, one type per status, each described once. Never
/// built: they exist for their descriptions (`responses(...)` in `#[utoipa::path]`).
#[allow(dead_code)]
pub mod responses {
    use raftq_client::api::Problem;
    use utoipa::IntoResponses;

    /// `not_leader`: a write reached a follower. `Location` is the same request on the leader
    /// (`curl -L` follows it); the body names `leader_id` and `leader_url`. Nothing was done.
    #[derive(IntoResponses)]
    #[response(status = 307, content_type = "application/problem+json",
        headers(("Location" = String, description = "The same path and query on the leader")))]
    pub struct NotLeader(Problem);

    /// `invalid_argument`: a malformed name, query, or body, or a value out of range.
    #[derive(IntoResponses)]
    #[response(status = 400, content_type = "application/problem+json")]
    pub struct InvalidArgument(Problem);

    /// `unauthorized`: the node requires an API token and none, or a wrong one, was sent.
    #[derive(IntoResponses)]
    #[response(status = 401, content_type = "application/problem+json",
        headers(("WWW-Authenticate" = String, description = "`Bearer realm=\"raftq\"`")))]
    pub struct Unauthorized(Problem);

    /// `forbidden`: the token is valid but not granted what this operation needs.
    #[derive(IntoResponses)]
    #[response(status = 403, content_type = "application/problem+json")]
    pub struct Forbidden(Problem);

    /// `topic_not_found`: no such topic.
    #[derive(IntoResponses)]
    #[response(status = 404, content_type = "application/problem+json")]
    pub struct TopicNotFound(Problem);

    /// `topic_not_found` or `subscription_not_found`.
    #[derive(IntoResponses)]
    #[response(status = 404, content_type = "application/problem+json")]
    pub struct SubscriptionNotFound(Problem);

    /// `invalid_argument`: no member has this id.
    #[derive(IntoResponses)]
    #[response(status = 404, content_type = "application/problem+json")]
    pub struct MemberNotFound(Problem);

    /// `already_exists`: it exists with a different configuration; nothing changed.
    #[derive(IntoResponses)]
    #[response(status = 409, content_type = "application/problem+json")]
    pub struct AlreadyExists(Problem);

    /// `sequence_gap`: the batch's `sequence` skips ahead of the next one expected from this
    /// producer (`expected_sequence`); nothing was appended.
    #[derive(IntoResponses)]
    #[response(status = 409, content_type = "application/problem+json")]
    pub struct SequenceGap(Problem);

    /// `already_exists` (the node id is a member at another URL), or `invalid_argument` while
    /// another membership change is still in progress.
    #[derive(IntoResponses)]
    #[response(status = 409, content_type = "application/problem+json")]
    pub struct MembershipConflict(Problem);

    /// `payload_too_large`: the body exceeds the node's limit, or a record exceeds its
    /// topic's `max_record_bytes`.
    #[derive(IntoResponses)]
    #[response(status = 413, content_type = "application/problem+json")]
    pub struct PayloadTooLarge(Problem);

    /// `overloaded`: the node holds as many requests, body bytes or long-polls as it may;
    /// nothing was done. Retry after `Retry-After`.
    #[derive(IntoResponses)]
    #[response(status = 429, content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds to wait before retrying")))]
    pub struct Overloaded(Problem);

    /// `internal`: the node failed to answer (see its log).
    #[derive(IntoResponses)]
    #[response(status = 500, content_type = "application/problem+json")]
    pub struct Internal(Problem);

    /// `shutting_down` (with the leader's `leader_id` and `leader_url` when known) or
    /// `no_leader`: answered before anything was proposed, so nothing was done. Retry after
    /// `Retry-After`.
    #[derive(IntoResponses)]
    #[response(status = 503, content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds to wait before retrying")))]
    pub struct Unavailable(Problem);

    /// `shutting_down` or `no_leader` (with `Retry-After`), or `internal` when the operation
    /// did not finish in time on this node.
    #[derive(IntoResponses)]
    #[response(status = 503, content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds to wait before retrying")))]
    pub struct UnavailableOrUnfinished(Problem);

    /// `internal`: the outcome is unknown (the write was proposed but its answer did not come
    /// in time); it may or may not take effect. Retry with the same idempotency data.
    #[derive(IntoResponses)]
    #[response(status = 504, content_type = "application/problem+json")]
    pub struct Indeterminate(Problem);
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use raftq_client::api::ErrorCode;
    use serde_json::Value;

    use super::*;

    /// The endpoints of API.md, plus the extra ones this server has (`GET /v1/report`, the
    /// subscription list, this description), as `METHOD PATH`.
    const ENDPOINTS: &[&str] = &[
        "PUT /v1/topics/{topic}",
        "GET /v1/topics",
        "GET /v1/topics/{topic}",
        "DELETE /v1/topics/{topic}",
        "POST /v1/topics/{topic}/records",
        "GET /v1/topics/{topic}/records",
        "PUT /v1/topics/{topic}/subscriptions/{sub}",
        "GET /v1/topics/{topic}/subscriptions/{sub}",
        "DELETE /v1/topics/{topic}/subscriptions/{sub}",
        "POST /v1/topics/{topic}/subscriptions/{sub}/pull",
        "POST /v1/topics/{topic}/subscriptions/{sub}/ack",
        "POST /v1/topics/{topic}/subscriptions/{sub}/nack",
        "POST /v1/topics/{topic}/subscriptions/{sub}/extend",
        "PUT /v1/topics/{topic}/subscriptions/{sub}/cursor",
        "GET /v1/topics/{topic}/report",
        "POST /v1/broadcast",
        "GET /v1/cluster",
        "POST /v1/cluster/nodes",
        "POST /v1/cluster/voters",
        "DELETE /v1/cluster/nodes/{id}",
        "POST /v1/cluster/transfer-leader",
        "POST /v1/cluster/snapshot",
        "GET /healthz",
        "GET /readyz",
        // Not in API.md's tables: extras of this server.
        "GET /v1/report",
        "GET /v1/topics/{topic}/subscriptions",
        "GET /v1/openapi.json",
    ];

    /// Operations that need no token.
    const OPEN: &[&str] = &["GET /healthz", "GET /readyz", "GET /v1/openapi.json"];

    fn json() -> Value {
        serde_json::from_str(document_json()).expect("the description is JSON")
    }

    /// Every operation of the description: `METHOD PATH` to its object.
    fn operations(doc: &Value) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("path item") {
                out.insert(format!("{} {path}", method.to_uppercase()), op.clone());
            }
        }
        out
    }

    #[test]
    fn it_is_openapi_3_with_title_and_version() {
        let doc = json();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        assert_eq!(doc["info"]["title"], "raftq");
        assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn it_describes_exactly_the_endpoints() {
        let described: BTreeSet<String> = operations(&json()).into_keys().collect();
        let expected: BTreeSet<String> = ENDPOINTS.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            described.difference(&expected).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "described but not an endpoint"
        );
        assert_eq!(
            expected.difference(&described).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "an endpoint without a description"
        );
    }

    #[test]
    fn the_router_takes_every_operation_once() {
        // axum refuses (panics on) a path and method registered twice; the description is
        // merged from the same registrations.
        let (v1, probes) = super::super::operations();
        let (_routes, doc) = v1.merge(probes).split_for_parts();
        let described = operations(&serde_json::to_value(&doc).unwrap());
        assert_eq!(described.len(), ENDPOINTS.len());
    }

    #[test]
    fn operation_ids_are_unique() {
        let ops = operations(&json());
        let ids: BTreeSet<&str> = ops
            .values()
            .map(|op| op["operationId"].as_str().expect("operationId"))
            .collect();
        assert_eq!(ids.len(), ops.len());
    }

    #[test]
    fn every_operation_but_the_open_ones_needs_the_bearer_token() {
        for (name, op) in operations(&json()) {
            let security = &op["security"];
            if OPEN.contains(&name.as_str()) {
                assert!(security.is_null(), "{name} must need no token");
                assert!(
                    crate::api::auth::is_public_route(name.split(' ').nth(1).unwrap())
                        || !name.contains(" /v1/"),
                    "{name} is described as open but auth does not treat it so"
                );
            } else {
                assert_eq!(
                    security,
                    &serde_json::json!([{ BEARER: [] }]),
                    "{name} must need the bearer token"
                );
                let responses = &op["responses"];
                assert!(responses["401"].is_object(), "{name} must document 401");
            }
        }
        assert!(json()["components"]["securitySchemes"][BEARER]["scheme"] == "bearer");
    }

    #[test]
    fn every_error_is_a_problem_and_every_v1_operation_may_be_overloaded() {
        for (name, op) in operations(&json()) {
            for (status, response) in op["responses"].as_object().unwrap() {
                let status: u16 = status.parse().unwrap();
                let content = response["content"].as_object();
                if status >= 300 && status != 304 {
                    let content = content.unwrap_or_else(|| panic!("{name} {status} has no body"));
                    assert_eq!(
                        content.keys().collect::<Vec<_>>(),
                        vec![PROBLEM_JSON],
                        "{name} {status}"
                    );
                    assert_eq!(
                        content[PROBLEM_JSON]["schema"]["$ref"], "#/components/schemas/Problem",
                        "{name} {status}"
                    );
                }
            }
            if name.contains(" /v1/") {
                assert!(
                    op["responses"]["429"].is_object(),
                    "{name} must document 429"
                );
                assert!(
                    op["responses"]["503"].is_object(),
                    "{name} must document 503"
                );
            }
        }
    }

    #[test]
    fn the_problem_code_is_every_documented_code() {
        let doc = json();
        let problem = &doc["components"]["schemas"]["Problem"];
        let required: BTreeSet<&str> = problem["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for field in ["type", "title", "status", "detail", "code"] {
            assert!(required.contains(field), "Problem.{field} must be required");
        }
        let code = &problem["properties"]["code"];
        let code = match code.get("$ref").and_then(Value::as_str) {
            Some(r) => &doc["components"]["schemas"][r.rsplit('/').next().unwrap()],
            None => code,
        };
        let described: Vec<&str> = code["enum"]
            .as_array()
            .expect("code is an enum")
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let documented: Vec<&str> = ErrorCode::DOCUMENTED.iter().map(|c| c.as_str()).collect();
        assert_eq!(described, documented);
        // Every code the server can answer is documented: each one of API.md is listed.
        for code in [
            "invalid_argument",
            "unauthorized",
            "forbidden",
            "topic_not_found",
            "subscription_not_found",
            "already_exists",
            "payload_too_large",
            "not_leader",
            "no_leader",
            "shutting_down",
            "sequence_gap",
            "overloaded",
            "internal",
        ] {
            assert!(documented.contains(&code), "{code}");
        }
    }

    /// Every `$ref` in `value`.
    fn refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("$ref", Value::String(r)) => out.push(r),
                        _ => refs(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    #[test]
    fn every_reference_resolves() {
        let doc = json();
        let mut all = Vec::new();
        refs(&doc, &mut all);
        assert!(!all.is_empty());
        for r in all {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("unexpected reference {r}"));
            assert!(
                doc["components"]["schemas"][name].is_object(),
                "{r} does not resolve"
            );
        }
    }

    #[test]
    fn optional_bodies_may_be_left_out_but_are_never_null() {
        let doc = json();
        let ops = operations(&doc);
        for name in [
            "PUT /v1/topics/{topic}",
            "PUT /v1/topics/{topic}/subscriptions/{sub}",
            "POST /v1/topics/{topic}/subscriptions/{sub}/pull",
            "POST /v1/broadcast",
            "POST /v1/cluster/transfer-leader",
        ] {
            let body = &ops[name]["requestBody"];
            assert!(body["required"] != true, "{name}: the body is optional");
            let schema = &body["content"]["application/json"]["schema"];
            assert!(schema["$ref"].is_string(), "{name}: {schema}");
        }
        for name in [
            "POST /v1/topics/{topic}/records",
            "POST /v1/topics/{topic}/subscriptions/{sub}/ack",
            "POST /v1/topics/{topic}/subscriptions/{sub}/nack",
            "POST /v1/topics/{topic}/subscriptions/{sub}/extend",
            "PUT /v1/topics/{topic}/subscriptions/{sub}/cursor",
            "POST /v1/cluster/nodes",
            "POST /v1/cluster/voters",
        ] {
            assert_eq!(ops[name]["requestBody"]["required"], true, "{name}");
        }
        let raw = &ops["POST /v1/topics/{topic}/records"]["requestBody"]["content"]
            ["application/octet-stream"]["schema"];
        assert_eq!(raw["type"], "string");
        assert_eq!(raw["format"], "binary");
    }

    #[test]
    fn a_record_as_published_has_exactly_one_value() {
        let doc = json();
        let record = &doc["components"]["schemas"]["RecordIn"];
        let choices = record["allOf"][1]["oneOf"]
            .as_array()
            .expect("the value rule");
        let required: Vec<&Value> = choices.iter().map(|c| &c["required"][0]).collect();
        assert_eq!(required, [&Value::from("value"), &Value::from("value_b64")]);
        let fields = &record["allOf"][0]["properties"];
        for field in ["value", "value_b64", "key", "headers"] {
            assert!(fields[field].is_object(), "RecordIn.{field}");
        }
    }

    #[test]
    fn the_read_query_described_is_the_one_parsed() {
        let doc = json();
        let params = doc["paths"]["/v1/topics/{topic}/records"]["get"]["parameters"]
            .as_array()
            .unwrap()
            .clone();
        let query: Vec<&str> = params
            .iter()
            .filter(|p| p["in"] == "query")
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            query,
            ["from", "subscription", "max", "max_bytes", "wait_ms"],
            "the read's query parameters"
        );
        let sample = |name: &str| match name {
            "from" => "first",
            "subscription" => "workers",
            _ => "1",
        };
        let all: Vec<String> = query.iter().map(|n| format!("{n}={}", sample(n))).collect();
        assert!(super::super::records::read_params(&Some(all.join("&"))).is_ok());
        assert!(super::super::records::read_params(&Some("nope=1".into())).is_err());
        let max = params.iter().find(|p| p["name"] == "max").unwrap();
        assert_eq!(
            max["schema"]["maximum"],
            raftq_client::api::MAX_READ_RECORDS
        );
        let wait = params.iter().find(|p| p["name"] == "wait_ms").unwrap();
        assert_eq!(wait["schema"]["maximum"], raftq_client::api::MAX_WAIT_MS);
    }

    #[test]
    fn the_limits_described_are_the_code_s() {
        use raftq_client::api::*;
        let doc = json();
        // A schema's own fields, also when it is `allOf` its fields and a rule.
        let schema = |name: &str, field: &str| {
            let schema = &doc["components"]["schemas"][name];
            let fields = match schema["allOf"].as_array() {
                Some(parts) => &parts[0]["properties"],
                None => &schema["properties"],
            };
            fields[field].clone()
        };
        let pull_max = schema("PullRequest", "max");
        assert_eq!(pull_max["maximum"], MAX_PULL);
        assert_eq!(schema("PullRequest", "wait_ms")["maximum"], MAX_WAIT_MS);
        for (name, field) in [
            ("PullRequest", "ack_timeout_ms"),
            ("ExtendRequest", "ack_timeout_ms"),
            ("SubscriptionConfig", "ack_timeout_ms"),
        ] {
            assert_eq!(
                schema(name, field)["maximum"],
                MAX_ACK_TIMEOUT_MS,
                "{name}.{field}"
            );
        }
        assert_eq!(
            schema("NackRequest", "delay_ms")["maximum"],
            MAX_NACK_DELAY_MS
        );
        for name in ["AckRequest", "NackRequest", "ExtendRequest"] {
            assert_eq!(schema(name, "receipts")["maxItems"], MAX_RECEIPTS, "{name}");
        }
        assert_eq!(
            schema("PublishRequest", "records")["maxItems"],
            MAX_BATCH_RECORDS
        );
        assert_eq!(schema("RecordIn", "key")["maxLength"], MAX_KEY_BYTES);
        assert_eq!(schema("PullRequest", "consumer")["maxLength"], MAX_NAME_LEN);
        assert_eq!(
            schema("TopicConfig", "max_record_bytes")["maximum"],
            crate::state::MAX_RECORD_BYTES_LIMIT
        );
        for (name, field) in [
            ("PublishRequest", "producer_id"),
            ("SubscriptionConfig", "dead_letter_topic"),
        ] {
            assert_eq!(
                schema(name, field)["pattern"],
                NAME_PATTERN,
                "{name}.{field}"
            );
        }
    }
}
