//! The replica facade's pure decisions.

use std::collections::BTreeMap;

use super::all_apply_batches;
use crate::raft::Formats;

/// Batch publishes go into the log only once every other member has said it applies them: a
/// member not heard from, or one that says an older format (or none, as an older release),
/// keeps publishes one record at a time; this node's own word is not needed.
#[test]
fn batch_publishes_wait_for_every_member() {
    let formats = |pairs: &[(u64, u32)]| {
        pairs
            .iter()
            .map(|&(id, commands)| {
                let formats = Formats {
                    commands,
                    snapshots: 0,
                };
                (id, formats)
            })
            .collect::<BTreeMap<_, _>>()
    };
    struct Case {
        what: &'static str,
        members: &'static [u64],
        formats: &'static [(u64, u32)],
        accepted: bool,
    }
    let cases = [
        Case {
            what: "a single node",
            members: &[1],
            formats: &[],
            accepted: true,
        },
        Case {
            what: "every other member at format 2",
            members: &[1, 2, 3],
            formats: &[(2, 2), (3, 2)],
            accepted: true,
        },
        Case {
            what: "a newer member",
            members: &[1, 2, 3],
            formats: &[(2, 2), (3, 3)],
            accepted: true,
        },
        Case {
            what: "a member not heard from",
            members: &[1, 2, 3],
            formats: &[(2, 2)],
            accepted: false,
        },
        Case {
            what: "a member at format 1",
            members: &[1, 2, 3],
            formats: &[(2, 2), (3, 1)],
            accepted: false,
        },
        Case {
            what: "a learner not heard from",
            members: &[1, 2, 3, 4],
            formats: &[(2, 2), (3, 2)],
            accepted: false,
        },
        Case {
            what: "a former member still recorded",
            members: &[1, 2],
            formats: &[(2, 2), (3, 1)],
            accepted: true,
        },
    ];
    for case in cases {
        assert_eq!(
            all_apply_batches(1, case.members.iter().copied(), &formats(case.formats)),
            case.accepted,
            "{}",
            case.what
        );
    }
}

/// What a node takes is read from its `/raft/status` answer; a release before a field says
/// nothing of it and gets what it took then: records one at a time, snapshots whole. Only a
/// follower that said it takes linked transfers with runs of records (5) gets one; one that
/// takes them with single records only (4, a release before format 9) gets the whole format.
#[test]
fn formats_are_read_from_a_status_answer() {
    use crate::raft::network::takes_linked;
    let cases: [(serde_json::Value, Formats, bool); 5] = [
        (
            serde_json::json!({"command_format": 2, "snapshot_format": 5}),
            Formats {
                commands: 2,
                snapshots: 5,
            },
            true,
        ),
        (
            serde_json::json!({"command_format": 2, "snapshot_format": 4}),
            Formats {
                commands: 2,
                snapshots: 4,
            },
            false,
        ),
        (
            serde_json::json!({"command_format": 2}),
            Formats {
                commands: 2,
                snapshots: 0,
            },
            false,
        ),
        (
            serde_json::json!({"snapshot_format": 2}),
            Formats {
                commands: 0,
                snapshots: 2,
            },
            false,
        ),
        (serde_json::Value::Null, Formats::default(), false),
    ];
    for (status, want, linked) in cases {
        let got = Formats::from_status(&status);
        assert_eq!(got, want, "{status}");
        assert_eq!(takes_linked(Some(got)), linked, "{status}");
    }
    assert!(!takes_linked(None), "a follower not heard from");
}
