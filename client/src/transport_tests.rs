use super::*;

#[test]
fn query_values_are_percent_encoded() {
    assert_eq!(encode_query_value("order-17_a.b~c"), "order-17_a.b~c");
    assert_eq!(encode_query_value("a b&c=d+e/f"), "a%20b%26c%3Dd%2Be%2Ff");
    assert_eq!(encode_query_value("é?#%"), "%C3%A9%3F%23%25");
    assert_eq!(encode_query_value(""), "");
}

#[test]
fn redirects_never_go_from_https_to_http() {
    let url = |s: &str| Url::parse(s).unwrap();
    assert!(may_follow(&url("http://a:1/"), &url("http://b:1/v1")));
    assert!(may_follow(&url("http://a:1/"), &url("https://b:1/v1")));
    assert!(may_follow(&url("https://a:1/"), &url("https://b:1/v1")));
    assert!(!may_follow(&url("https://a:1/"), &url("http://b:1/v1")));
    assert!(!may_follow(&url("http://a:1/"), &url("ftp://b:1/v1")));
}

#[test]
fn base_urls_are_normalized_and_checked() {
    let check = |raw: &str, expected: Option<&str>| {
        let got = base_url(raw).ok().map(|url| url.to_string());
        assert_eq!(got.as_deref(), expected, "{raw}");
    };
    check("http://127.0.0.1:7001", Some("http://127.0.0.1:7001/"));
    check("http://Node-1:7001/", Some("http://node-1:7001/"));
    check("http://lb/raftq", Some("http://lb/raftq/"));
    check(" http://h:1 ", Some("http://h:1/"));
    check("https://h:1", Some("https://h:1/"));
    check("ftp://h", None);
    check("h:7001", None);
    check("http://h/?x=1", None);
    check("not a url", None);
}

#[test]
fn redirect_base_is_derived_from_location() {
    let target = "v1/topics/t/records?key=a%20b";
    let location = Url::parse("http://b:7002/v1/topics/t/records?key=a%20b").unwrap();
    assert_eq!(
        base_of(&location, target).unwrap().as_str(),
        "http://b:7002/"
    );
    let prefixed = Url::parse("http://lb/raftq/v1/topics/t/records?key=a%20b").unwrap();
    assert_eq!(
        base_of(&prefixed, target).unwrap().as_str(),
        "http://lb/raftq/"
    );
    let rewritten = Url::parse("http://b:7002/v1/topics/t/records?key=a+b").unwrap();
    assert_eq!(
        base_of(&rewritten, target).unwrap().as_str(),
        "http://b:7002/"
    );
}

#[test]
fn backoff_jitter_stays_in_range() {
    for _ in 0..1000 {
        let pause = jittered(Duration::from_millis(100));
        assert!(pause >= Duration::from_millis(50) && pause <= Duration::from_millis(100));
    }
}

#[test]
fn partial_problems_keep_their_code() {
    let body = br#"{"code": "no_leader", "leader_url": "http://b:1"}"#;
    let problem = parse_problem(StatusCode::SERVICE_UNAVAILABLE, body).unwrap();
    assert_eq!((problem.code, problem.status), (ErrorCode::NoLeader, 503));
    assert_eq!(problem.leader_url.as_deref(), Some("http://b:1"));
    assert!(parse_problem(StatusCode::SERVICE_UNAVAILABLE, b"{}").is_none());
    assert!(parse_problem(StatusCode::SERVICE_UNAVAILABLE, b"busy").is_none());
}

#[test]
fn unknown_bodies_are_quoted_not_parsed() {
    let problem = synthesized_problem(StatusCode::NOT_FOUND, b"no route");
    assert_eq!(problem.status, 404);
    assert_eq!(problem.code, ErrorCode::Unknown);
    assert_eq!(problem.detail, "no route");
    let long = "x".repeat(500);
    assert_eq!(
        snippet(long.as_bytes()).chars().count(),
        BODY_SNIPPET_CHARS + 1
    );
    assert_eq!(snippet(&[0xff, 0xfe]), "\u{fffd}\u{fffd}");
    assert_eq!(
        synthesized_problem(StatusCode::PAYLOAD_TOO_LARGE, b"").code,
        ErrorCode::PayloadTooLarge
    );
}

#[test]
fn node_list_tracks_leader_and_failures() {
    let url = |port: u16| base_url(&format!("http://h:{port}")).unwrap();
    let mut nodes = Nodes {
        urls: vec![url(1), url(2), url(3)],
        leader: None,
        next: 0,
    };
    assert_eq!(nodes.pick().0, 0);
    nodes.failed(0);
    assert_eq!(nodes.pick().0, 1);
    // A stale failure report for a node no longer first does not skip a healthy one.
    nodes.failed(0);
    assert_eq!(nodes.pick().0, 1);
    assert_eq!(nodes.remember_leader(&url(3)), Some(2));
    assert_eq!(nodes.pick().0, 2);
    nodes.failed(2);
    assert_eq!(nodes.leader, None);
    assert_eq!(nodes.remember_leader(&url(4)), Some(3));
    assert_eq!(nodes.urls.len(), 4);
    for port in 5..200 {
        nodes.remember_leader(&url(port));
    }
    assert_eq!(nodes.urls.len(), MAX_NODES);
}
