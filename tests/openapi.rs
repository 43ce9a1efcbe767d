//! The OpenAPI description against a real node that requires tokens: `GET /v1/openapi.json`
//! answers without a token, is the document the server generates from its handlers, names
//! every endpoint, and real answers (successes and problems) match the schemas it declares.

mod common;

use std::collections::BTreeSet;

use base64::Engine as _;
use common::{Cluster, PROBLEM_JSON, SECRET};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use reqwest::Method;
use serde_json::{json, Value};

const ADMIN: &str = "rq_test_openapi_admin_5d2c81";

fn tokens_file() -> String {
    common::tokens_toml(&[("admin", ADMIN, "admin:*")])
}

/// Resolves a `#/components/schemas/...` reference.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("unexpected reference {r}"));
            resolve(doc, &doc["components"]["schemas"][name])
        }
        None => schema,
    }
}

fn type_matches(ty: &str, value: &Value) -> bool {
    match ty {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        other => panic!("unknown schema type {other}"),
    }
}

/// Checks `value` against `schema` structurally: types, required properties, no unknown
/// properties where the schema forbids them, enums, items, maps, `allOf` and `oneOf`. Returns
/// every mismatch, each with where it is.
fn validate(doc: &Value, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    let schema = resolve(doc, schema);
    if let Some(all) = schema["allOf"].as_array() {
        for part in all {
            validate(doc, part, value, at, errors);
        }
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(choices) = schema[key].as_array() {
            let fits = choices
                .iter()
                .filter(|c| {
                    let mut e = Vec::new();
                    validate(doc, c, value, at, &mut e);
                    e.is_empty()
                })
                .count();
            let ok = if key == "oneOf" { fits == 1 } else { fits >= 1 };
            if !ok {
                errors.push(format!("{at}: {value} fits {fits} of the {key} choices"));
            }
        }
    }
    match &schema["type"] {
        Value::String(ty) if !type_matches(ty, value) => {
            errors.push(format!("{at}: {value} is not of type {ty}"));
            return;
        }
        Value::Array(types)
            if !types
                .iter()
                .any(|t| type_matches(t.as_str().unwrap(), value)) =>
        {
            errors.push(format!("{at}: {value} is not of types {types:?}"));
            return;
        }
        _ => {}
    }
    if let Some(options) = schema["enum"].as_array() {
        if !options.contains(value) {
            errors.push(format!("{at}: {value} is not one of {options:?}"));
        }
    }
    if let Some(min) = schema["minimum"].as_f64() {
        if value.as_f64().is_some_and(|v| v < min) {
            errors.push(format!("{at}: {value} is below the minimum {min}"));
        }
    }
    match value {
        Value::Object(fields) => {
            let properties = schema["properties"].as_object();
            for name in schema["required"].as_array().into_iter().flatten() {
                let name = name.as_str().unwrap();
                if !fields.contains_key(name) {
                    errors.push(format!("{at}: required field {name:?} is missing"));
                }
            }
            for (name, field) in fields {
                let field_at = format!("{at}.{name}");
                match properties.and_then(|p| p.get(name)) {
                    Some(s) => validate(doc, s, field, &field_at, errors),
                    None => match &schema["additionalProperties"] {
                        Value::Bool(false) => {
                            errors.push(format!("{field_at}: not a declared field"))
                        }
                        s @ Value::Object(_) => validate(doc, s, field, &field_at, errors),
                        _ => {}
                    },
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate(doc, s, item, &format!("{at}[{i}]"), errors);
                }
            }
        }
        _ => {}
    }
}

/// The schema the description declares for `method path` answering `status` with
/// `content_type`; fails the test when there is none.
fn declared<'a>(
    doc: &'a Value,
    method: &Method,
    path: &str,
    status: u16,
    content_type: &str,
) -> &'a Value {
    let op = &doc["paths"][path][method.as_str().to_lowercase()];
    assert!(op.is_object(), "{method} {path} is not described");
    let response = &op["responses"][status.to_string()];
    assert!(
        response.is_object(),
        "{method} {path} answered {status}, which its description does not list"
    );
    let media = &response["content"][content_type];
    assert!(
        media.is_object(),
        "{method} {path} {status}: {content_type} is not a declared content type: {}",
        response["content"]
    );
    &media["schema"]
}

/// The described path template that `path` (without its query) is an instance of.
fn template_of(doc: &Value, path: &str) -> String {
    let path = path.split('?').next().unwrap();
    let segments: Vec<&str> = path.split('/').collect();
    let matches = |template: &str| {
        let parts: Vec<&str> = template.split('/').collect();
        parts.len() == segments.len()
            && parts
                .iter()
                .zip(&segments)
                .all(|(t, s)| t == s || (t.starts_with('{') && t.ends_with('}')))
    };
    let mut found: Vec<&String> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|t| matches(t))
        .collect();
    // A literal segment beats a parameter (`/v1/cluster/nodes` before `/v1/cluster/{...}`).
    found.sort_by_key(|t| t.matches('{').count());
    found
        .first()
        .unwrap_or_else(|| panic!("{path} is an instance of no described path"))
        .to_string()
}

/// Sends requests to one node and checks every answer against the description.
struct Checker<'a> {
    cluster: &'a Cluster,
    doc: &'a Value,
    client: &'a reqwest::Client,
}

impl Checker<'_> {
    /// Sends `method path` (with a JSON body, if any), expects status `want`, and checks the
    /// answer's content type and body against what the description declares for that
    /// operation and status; returns the body.
    async fn call(&self, method: Method, path: &str, body: Option<Value>, want: u16) -> Value {
        let (c, doc) = (self.cluster, self.doc);
        let mut request = self
            .client
            .request(method.clone(), format!("{}{path}", c.url(1)));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let resp = c.send(request, &format!("{method} {path}")).await;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().to_string());
        let text = resp.text().await.unwrap_or_default();
        assert_eq!(status, want, "{method} {path}: {text}");
        if status == 204 {
            assert!(text.is_empty(), "{method} {path}: 204 with a body");
            return Value::Null;
        }
        let content_type = content_type.unwrap_or_default();
        if status >= 400 {
            assert_eq!(content_type, PROBLEM_JSON, "{method} {path}");
        }
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
        let template = template_of(doc, path);
        let schema = declared(doc, &method, &template, status, &content_type);
        let mut errors = Vec::new();
        validate(doc, schema, &value, "$", &mut errors);
        assert!(
            errors.is_empty(),
            "{method} {path} {status} does not match its declared schema:\n{}\nanswer: {text}",
            errors.join("\n")
        );
        value
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_description_is_public_complete_and_matches_real_answers() {
    let c = Cluster::start_with_tokens(1, &tokens_file(), ADMIN).await;
    let bare = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let url = format!("{}/v1/openapi.json", c.url(1));

    // Served without a token, and also with a wrong one or the cluster secret: it is public.
    let mut served = Vec::new();
    for token in [None, Some("rq_not_a_token"), Some(SECRET)] {
        let mut request = bare.get(&url);
        if let Some(t) = token {
            request = request.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        let resp = c.send(request, "GET /v1/openapi.json").await;
        assert_eq!(resp.status().as_u16(), 200, "with token {token:?}");
        let ct = resp.headers()[CONTENT_TYPE].to_str().unwrap().to_string();
        assert!(ct.starts_with("application/json"), "{ct}");
        served.push(resp.json::<Value>().await.expect("the description is JSON"));
    }
    let doc = served.pop().unwrap();
    assert!(served.iter().all(|d| *d == doc));

    // It is the document the server generates, an OpenAPI 3 document of this version.
    assert_eq!(
        doc,
        serde_json::to_value(raftq::api::openapi::document()).unwrap()
    );
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    assert_eq!(doc["info"]["title"], "raftq");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    let paths: BTreeSet<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for path in [
        "/v1/topics",
        "/v1/topics/{topic}",
        "/v1/topics/{topic}/records",
        "/v1/topics/{topic}/report",
        "/v1/topics/{topic}/subscriptions",
        "/v1/topics/{topic}/subscriptions/{sub}",
        "/v1/topics/{topic}/subscriptions/{sub}/pull",
        "/v1/topics/{topic}/subscriptions/{sub}/ack",
        "/v1/topics/{topic}/subscriptions/{sub}/nack",
        "/v1/topics/{topic}/subscriptions/{sub}/extend",
        "/v1/topics/{topic}/subscriptions/{sub}/cursor",
        "/v1/report",
        "/v1/broadcast",
        "/v1/cluster",
        "/v1/cluster/nodes",
        "/v1/cluster/nodes/{id}",
        "/v1/cluster/voters",
        "/v1/cluster/transfer-leader",
        "/v1/cluster/snapshot",
        "/v1/openapi.json",
        "/healthz",
        "/readyz",
    ] {
        assert!(paths.contains(path), "{path} is not described");
    }
    assert_eq!(paths.len(), 22, "undescribed extras: {paths:?}");

    // Without a token, or with the cluster secret, nothing else opens; the refusal matches
    // its description.
    let anonymous = Checker {
        cluster: &c,
        doc: &doc,
        client: &bare,
    };
    anonymous.call(Method::GET, "/v1/topics", None, 401).await;
    let mut secret = reqwest::header::HeaderMap::new();
    secret.insert(AUTHORIZATION, format!("Bearer {SECRET}").parse().unwrap());
    let with_secret = reqwest::Client::builder()
        .default_headers(secret)
        .build()
        .unwrap();
    let secret_holder = Checker {
        cluster: &c,
        doc: &doc,
        client: &with_secret,
    };
    secret_holder
        .call(Method::GET, "/v1/topics", None, 401)
        .await;
    anonymous.call(Method::GET, "/healthz", None, 200).await;
    anonymous.call(Method::GET, "/readyz", None, 200).await;

    // Real answers, successes and problems, against their declared schemas.
    let api = Checker {
        cluster: &c,
        doc: &doc,
        client: c.http(),
    };
    let (get, put, post, delete) = (Method::GET, Method::PUT, Method::POST, Method::DELETE);
    let info = api.call(put.clone(), "/v1/topics/orders", None, 201).await;
    assert_eq!(info["name"], "orders");
    let config = json!({ "retention": { "max_records": 1000 }, "max_record_bytes": 4096 });
    let scratch = "/v1/topics/scratch";
    api.call(put.clone(), scratch, Some(config.clone()), 201)
        .await;
    api.call(put.clone(), scratch, Some(config), 200).await;
    let other = json!({ "retention": { "max_records": 5 } });
    api.call(put.clone(), scratch, Some(other), 409).await;
    api.call(get.clone(), "/v1/topics/orders", None, 200).await;
    api.call(get.clone(), "/v1/topics/missing", None, 404).await;
    api.call(get.clone(), "/v1/topics/bad%20name", None, 400)
        .await;
    api.call(get.clone(), "/v1/topics", None, 200).await;

    let records = "/v1/topics/orders/records";
    let binary = base64::engine::general_purpose::STANDARD.encode([0xff, 0x00, 0xfe]);
    let batch = json!({
        "records": [
            { "value": "hello", "key": "k1", "headers": { "h": "v" } },
            { "value_b64": binary },
        ],
        "producer_id": "p-1",
        "sequence": 0,
    });
    let published = api
        .call(post.clone(), records, Some(batch.clone()), 200)
        .await;
    assert_eq!(published["duplicate"], false);
    let again = api.call(post.clone(), records, Some(batch), 200).await;
    assert_eq!(again["duplicate"], true);
    let gap = json!({ "records": [{ "value": "x" }], "producer_id": "p-1", "sequence": 5 });
    api.call(post.clone(), records, Some(gap), 409).await;
    let neither = json!({ "records": [{ "key": "no value" }] });
    api.call(post.clone(), records, Some(neither), 400).await;
    let page = api
        .call(get.clone(), &format!("{records}?from=first"), None, 200)
        .await;
    assert_eq!(page["records"].as_array().unwrap().len(), 2);
    assert_eq!(page["records"][1]["value_b64"], binary);
    api.call(get.clone(), &format!("{records}?max=0"), None, 400)
        .await;

    let sub = "/v1/topics/orders/subscriptions/workers";
    let config = json!({ "start": "first", "ack_timeout_ms": 60000, "max_deliveries": 3 });
    api.call(put.clone(), sub, Some(config), 201).await;
    api.call(get.clone(), sub, None, 200).await;
    let nobody = "/v1/topics/orders/subscriptions/nobody";
    api.call(get.clone(), nobody, None, 404).await;
    let list = "/v1/topics/orders/subscriptions";
    api.call(get.clone(), list, None, 200).await;
    let pull = json!({ "max": 2 });
    let pulled = api
        .call(post.clone(), &format!("{sub}/pull"), Some(pull), 200)
        .await;
    let receipts: Vec<Value> = pulled["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["receipt"].clone())
        .collect();
    assert_eq!(receipts.len(), 2);
    let extend = json!({ "receipts": [receipts[1]], "ack_timeout_ms": 60000 });
    let extended = api
        .call(post.clone(), &format!("{sub}/extend"), Some(extend), 200)
        .await;
    assert_eq!(extended["results"][0]["status"], "extended");
    let ack = json!({ "receipts": [receipts[0]] });
    api.call(post.clone(), &format!("{sub}/ack"), Some(ack), 200)
        .await;
    let nack = json!({ "receipts": [receipts[1]] });
    api.call(post.clone(), &format!("{sub}/nack"), Some(nack), 200)
        .await;
    let cursor = json!({ "offset": 2 });
    api.call(put.clone(), &format!("{sub}/cursor"), Some(cursor), 200)
        .await;

    api.call(get.clone(), "/v1/topics/orders/report", None, 200)
        .await;
    api.call(get.clone(), "/v1/report", None, 200).await;
    let marker = json!({ "topics": ["orders"], "headers": { "why": "test" } });
    api.call(post.clone(), "/v1/broadcast", Some(marker), 200)
        .await;
    api.call(get.clone(), "/v1/cluster", None, 200).await;
    api.call(get.clone(), "/v1/cluster?digest=true", None, 200)
        .await;
    api.call(post.clone(), "/v1/cluster/snapshot", None, 200)
        .await;
    api.call(post.clone(), "/v1/cluster/transfer-leader", None, 400)
        .await;
    // A node id that is not a number, or not even UTF-8, is a problem like any other.
    api.call(delete.clone(), "/v1/cluster/nodes/abc", None, 400)
        .await;
    api.call(delete.clone(), "/v1/cluster/nodes/%FF", None, 400)
        .await;
    api.call(delete.clone(), "/v1/cluster/nodes/7", None, 404)
        .await;

    api.call(delete.clone(), sub, None, 204).await;
    api.call(delete.clone(), scratch, None, 204).await;
    api.call(delete, scratch, None, 404).await;
}
