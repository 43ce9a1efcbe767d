use super::*;

#[test]
fn names() {
    assert!(is_valid_name("orders.v1_eu-2"));
    assert!(is_valid_name(&"a".repeat(128)));
    assert!(!is_valid_name(&"a".repeat(129)));
    assert!(!is_valid_name(""));
    assert!(!is_valid_name("a/b"));
    assert!(!is_valid_name("é"));
    assert!(!is_valid_name("a b"));
}

#[test]
fn documented_codes_are_every_code_but_unknown() {
    // A new variant fails to compile here until it is sorted in or out of DOCUMENTED.
    let documented = |code: ErrorCode| match code {
        ErrorCode::InvalidArgument
        | ErrorCode::Unauthorized
        | ErrorCode::Forbidden
        | ErrorCode::TopicNotFound
        | ErrorCode::SubscriptionNotFound
        | ErrorCode::AlreadyExists
        | ErrorCode::PayloadTooLarge
        | ErrorCode::NotLeader
        | ErrorCode::NoLeader
        | ErrorCode::ShuttingDown
        | ErrorCode::SequenceGap
        | ErrorCode::Overloaded
        | ErrorCode::Internal => true,
        ErrorCode::Unknown => false,
    };
    assert!(ErrorCode::DOCUMENTED.iter().all(|c| documented(*c)));
    let mut names: Vec<&str> = ErrorCode::DOCUMENTED.iter().map(|c| c.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(
        names.len(),
        ErrorCode::DOCUMENTED.len(),
        "a code is listed twice"
    );
    for code in ErrorCode::DOCUMENTED {
        let json = serde_json::to_string(&code).unwrap();
        assert_eq!(json, format!("\"{}\"", code.as_str()));
    }
}

#[test]
fn name_pattern_says_what_is_valid_name_checks() {
    assert_eq!(
        NAME_PATTERN,
        format!("^[A-Za-z0-9._-]{{1,{MAX_NAME_LEN}}}$")
    );
}

#[test]
fn problem_round_trip_and_unknown_code() {
    let p = Problem::new(ErrorCode::TopicNotFound, "no topic t");
    let json = serde_json::to_string(&p).unwrap();
    assert!(json.contains("\"code\":\"topic_not_found\""));
    assert!(json.contains("\"status\":404"));
    let back: Problem = serde_json::from_str(&json).unwrap();
    assert_eq!(back, p);
    let newer: Problem = serde_json::from_str(
        r#"{"type":"x","title":"t","status":418,"detail":"d","code":"teapot"}"#,
    )
    .unwrap();
    assert_eq!(newer.code, ErrorCode::Unknown);
}

#[test]
fn subscription_start_forms() {
    let c: SubscriptionConfig = serde_json::from_str(r#"{"start": "next"}"#).unwrap();
    assert_eq!(c.start, SubscriptionStart::Next);
    let c: SubscriptionConfig = serde_json::from_str(r#"{"start": 42}"#).unwrap();
    assert_eq!(c.start, SubscriptionStart::Offset(42));
    let c: SubscriptionConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(c.start, SubscriptionStart::First);
    assert!(serde_json::from_str::<SubscriptionConfig>(r#"{"start": "latest"}"#).is_err());
    assert!(serde_json::from_str::<SubscriptionConfig>(r#"{"start": -1}"#).is_err());
    assert_eq!(
        serde_json::to_string(&SubscriptionStart::Offset(7)).unwrap(),
        "7"
    );
}

#[test]
fn read_from_parses() {
    assert_eq!("first".parse::<ReadFrom>(), Ok(ReadFrom::First));
    assert_eq!("17".parse::<ReadFrom>(), Ok(ReadFrom::Offset(17)));
    assert!("-1".parse::<ReadFrom>().is_err());
    assert!("latest".parse::<ReadFrom>().is_err());
}
