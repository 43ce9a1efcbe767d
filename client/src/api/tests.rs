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

/// Values that are text (with characters JSON escapes), binary, empty or long, with and
/// without a key and headers.
fn values_of_every_kind() -> Vec<(Bytes, Option<String>, BTreeMap<String, String>)> {
    let headers = BTreeMap::from([
        ("h".to_string(), "v\"\n".to_string()),
        ("é".to_string(), String::new()),
    ]);
    vec![
        (Bytes::from_static(b"plain text"), None, BTreeMap::new()),
        (
            Bytes::from_static(b"quote \" backslash \\ tab \t nul \0 \x1f"),
            Some("k\\".into()),
            headers.clone(),
        ),
        (
            Bytes::from("caf\u{e9} \u{1F600}"),
            Some(String::new()),
            BTreeMap::new(),
        ),
        (Bytes::new(), None, headers.clone()),
        (Bytes::from_static(&[0xff]), None, BTreeMap::new()),
        (
            Bytes::from_static(&[0xff, 0]),
            Some("k".into()),
            headers.clone(),
        ),
        (Bytes::from_static(&[0xc3, 0x28, 1]), None, BTreeMap::new()),
        (
            Bytes::from((0..=255u8).cycle().take(1_025).collect::<Vec<u8>>()),
            None,
            headers,
        ),
    ]
}

/// The pull and read answers' JSON, written without serde for speed, is byte for byte what
/// serde writes, and reads back as the same answer; empty answers too.
#[test]
fn answers_written_as_json_directly_are_what_serde_writes() {
    let values = values_of_every_kind();
    let messages: Vec<Message> = values
        .iter()
        .enumerate()
        .map(|(i, (value, key, headers))| Message {
            receipt: format!("r{i}"),
            offset: i as u64,
            delivery_count: 1 + i as u32,
            lease_expires_ms: 1_000 + i as u64,
            timestamp_ms: 2_000 + i as u64,
            key: key.clone(),
            headers: headers.clone(),
            value: value.clone(),
        })
        .collect();
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, (value, key, headers))| Record {
            offset: u64::MAX - i as u64,
            timestamp_ms: i as u64,
            key: key.clone(),
            headers: headers.clone(),
            value: value.clone(),
        })
        .collect();
    for n in [0, 1, messages.len()] {
        let pull = PullResponse {
            messages: messages[..n].to_vec(),
        };
        let fast = pull.to_json().expect("write");
        assert_eq!(
            String::from_utf8_lossy(&fast),
            String::from_utf8_lossy(&serde_json::to_vec(&pull).expect("serde")),
        );
        assert_eq!(
            serde_json::from_slice::<PullResponse>(&fast).expect("read"),
            pull
        );

        let read = ReadResponse {
            records: records[..n].to_vec(),
            next_offset: 7,
            high_watermark: u64::MAX,
            skipped: n as u64,
        };
        let fast = read.to_json().expect("write");
        assert_eq!(
            String::from_utf8_lossy(&fast),
            String::from_utf8_lossy(&serde_json::to_vec(&read).expect("serde")),
        );
        assert_eq!(
            serde_json::from_slice::<ReadResponse>(&fast).expect("read"),
            read
        );
    }
}
