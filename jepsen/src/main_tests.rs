use std::time::Duration;

use super::cli::{parse_duration, parse_subnet};
use super::*;

#[test]
fn durations() {
    assert_eq!(parse_duration("20s"), Ok(Duration::from_secs(20)));
    assert_eq!(parse_duration("20"), Ok(Duration::from_secs(20)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
    assert!(parse_duration("soon").is_err());
    assert!(parse_duration("3 weeks").is_err());
}

#[test]
fn subnets() {
    assert_eq!(parse_subnet("10.231.0").unwrap(), [10, 231, 0]);
    assert!(parse_subnet("8.8.8").is_err());
    assert!(parse_subnet("10.1").is_err());
    assert!(parse_subnet("192.168.300").is_err());
}

#[test]
fn the_negative_control_passes_only_on_partial_loss() {
    let results = |valid: bool, failures: &[&str], lost: u64, acknowledged: u64| {
        serde_json::json!({
            "verdict": {"valid": valid, "failures": failures},
            "checker": {"lost": {"count": lost}, "acknowledged": acknowledged},
            "log_checker": {"lost": {"count": lost}, "acknowledged": acknowledged},
        })
    };
    let (passed, why) = expect_loss(&results(false, &["lost", "log.lost"], 12, 900));
    assert!(passed, "{why}");
    assert!(why.contains("lost 12 of 900 acknowledged"), "{why}");
    // Lost from the log only: acked by a consumer before the power loss, gone since.
    let log_only = serde_json::json!({
        "verdict": {"valid": false, "failures": ["log.lost", "delivery_after_ack"]},
        "checker": {"lost": {"count": 0}, "acknowledged": 900},
        "log_checker": {"lost": {"count": 95}, "acknowledged": 900},
    });
    let (passed, why) = expect_loss(&log_only);
    assert!(passed, "{why}");
    assert!(why.contains("log checker: lost 95 of 900"), "{why}");
    // Judged valid: the suite did not see the loss.
    assert!(!expect_loss(&results(true, &[], 0, 900)).0);
    // Everything lost: a wiped cluster, not unsynced writes lost.
    let (passed, why) = expect_loss(&results(false, &["lost"], 900, 900));
    assert!(
        !passed && why.contains("every acknowledged record was lost"),
        "{why}"
    );
    // Invalid for another reason.
    assert!(!expect_loss(&results(false, &["digest_mismatch"], 0, 900)).0);
    // The fault did not happen: proves nothing, even with loss.
    assert!(!expect_loss(&results(false, &["lost", "fault_not_applied"], 3, 900)).0);
    assert!(!expect_loss(&serde_json::json!({})).0);
}

#[test]
fn timestamps_look_right() {
    let t = timestamp();
    assert_eq!(t.len(), 15);
    assert!(t.starts_with("20"));
}
