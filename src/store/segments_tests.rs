use super::*;

fn payload(index: u64) -> Vec<u8> {
    let len = 10 + (index as usize * 37) % 300;
    (0..len).map(|i| (index as usize + i) as u8).collect()
}

fn open(dir: &Path, durable: u64) -> Result<(SegmentLog, Recovery), SegmentError> {
    // Small segments: a few entries each, so every test crosses segment boundaries.
    SegmentLog::open(dir, durable, 1_000)
}

fn fill(log: &mut SegmentLog, range: std::ops::RangeInclusive<u64>) {
    for i in range {
        log.append(i, &payload(i)).expect("append");
    }
    log.sync().expect("sync");
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    files.sort();
    files
}

fn assert_holds(log: &SegmentLog, range: std::ops::RangeInclusive<u64>) {
    assert_eq!(log.first_index(), Some(*range.start()));
    assert_eq!(log.last_index(), Some(*range.end()));
    for i in range.clone() {
        assert_eq!(log.read(i).expect("read"), Some(payload(i)), "entry {i}");
    }
    assert_eq!(log.read(range.end() + 1).expect("read"), None);
    assert_eq!(
        log.read(range.start().saturating_sub(1)).expect("read"),
        None
    );
}

#[test]
fn entries_read_back_across_segments_and_after_reopening() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut log, recovery) = open(dir.path(), 0).expect("open");
    assert_eq!(recovery, Recovery::default());
    fill(&mut log, 5..=60);
    assert_holds(&log, 5..=60);
    assert!(segment_files(dir.path()).len() > 5, "small segments roll");
    drop(log);
    let (mut log, recovery) = open(dir.path(), 60).expect("reopen");
    assert_eq!(recovery.entries, 56);
    assert_eq!(recovery.cut_bytes, 0);
    assert_holds(&log, 5..=60);
    assert!(matches!(
        log.append(62, b"gap"),
        Err(SegmentError::OutOfOrder { last: 60, got: 62 })
    ));
    fill(&mut log, 61..=70);
    assert_holds(&log, 5..=70);
}

/// Where the frames of the log's last segment end (the rest of the file is preallocated).
fn frames_end(log: &SegmentLog) -> u64 {
    log.segments.last().expect("a segment").len
}

/// Writes that were never synced may be lost or half written by a crash: cut off at open,
/// whatever state the tail is in, and the log goes on from the last whole entry.
#[test]
fn a_torn_tail_above_what_was_synced_is_cut_off() {
    type Damage = fn(&Path, u64);
    let cases: Vec<(&str, Damage)> = vec![
        ("half a frame", |p, end| trim(p, end - 9)),
        ("half a header", |p, end| {
            let last_frame = 16 + payload(40).len() as u64;
            trim(p, end - last_frame + 7);
        }),
        ("a flipped byte in the last frame", |p, end| {
            flip_at(p, end - 3)
        }),
        ("a frame's header, its payload never written", |p, end| {
            let mut header = [0u8; FRAME_HEADER];
            header[0..4].copy_from_slice(&100u32.to_le_bytes());
            header[8..16].copy_from_slice(&41u64.to_le_bytes());
            write_at(p, end, &header);
        }),
        ("a frame's header cut off the file's end", |p, end| {
            trim(p, end + 4);
            write_at(p, end, &[7, 0, 0, 0]);
        }),
    ];
    for (what, damage) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut log, _) = open(dir.path(), 0).expect("open");
        fill(&mut log, 1..=40);
        let end = frames_end(&log);
        drop(log);
        let last = segment_files(dir.path()).pop().expect("a segment");
        damage(&last, end);
        let (mut log, recovery) = open(dir.path(), 30).expect(what);
        assert!(recovery.cut_bytes > 0, "{what}: nothing cut");
        let kept = log.last_index().expect("entries");
        assert!((30..=40).contains(&kept), "{what}: kept up to {kept}");
        assert_holds(&log, 1..=kept);
        fill(&mut log, kept + 1..=45);
        drop(log);
        let (log, recovery) = open(dir.path(), 45).expect("reopen");
        assert_eq!(recovery.cut_bytes, 0, "{what}");
        assert_holds(&log, 1..=45);
    }
}

/// A segment has its full size from the start: appends write into it and never change its
/// size (so an fdatasync need not write the inode), and the zeros after the last frame are
/// where the frames end, in the last segment as in the earlier ones (which end where the next
/// frame did not fit), down to a rest too short for a frame's header.
#[test]
fn segments_are_preallocated_and_their_zeros_are_the_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut log, _) = open(dir.path(), 0).expect("open");
    fill(&mut log, 1..=3);
    let sizes = |dir: &Path| -> Vec<u64> {
        segment_files(dir)
            .iter()
            .map(|f| fs::metadata(f).expect("meta").len())
            .collect()
    };
    assert_eq!(sizes(dir.path()), vec![1_000], "preallocated whole");
    fill(&mut log, 4..=40);
    assert!(
        sizes(dir.path()).iter().all(|s| *s == 1_000),
        "{:?}",
        sizes(dir.path())
    );
    assert!(frames_end(&log) < 1_000);
    drop(log);
    let (log, recovery) = open(dir.path(), 40).expect("reopen");
    assert_eq!(recovery.cut_bytes, 0, "the zeros are not a torn tail");
    assert_holds(&log, 1..=40);
    drop(log);

    // A segment whose frames end less than a header before its end.
    let files = segment_files(dir.path());
    let first = &files[0];
    let end = {
        let (log, _) = open(dir.path(), 40).expect("open");
        log.segments[0].len
    };
    trim(first, end + 5);
    let (log, _) = open(dir.path(), 40).expect("a short zero rest");
    assert_holds(&log, 1..=40);
    drop(log);

    // Zeros where an earlier segment's last frame was: its entries stop short of the next
    // segment's first, which is damage.
    trim(first, end);
    let (log, _) = open(dir.path(), 40).expect("open");
    let last_frame = log.segments[0].positions.last().copied().expect("a frame");
    drop(log);
    trim(first, last_frame);
    trim(first, 1_000);
    let err = open(dir.path(), 40)
        .map(|r| r.1)
        .expect_err("a zeroed frame in an earlier segment");
    assert!(err.to_string().contains("the segment before ends"), "{err}");
}

/// What was synced (at or below `durable`) and every segment before the last were fsynced:
/// a frame there that does not read is damage, and the open fails naming it, never cutting
/// acknowledged entries.
#[test]
fn damage_to_what_was_synced_fails_the_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut log, _) = open(dir.path(), 0).expect("open");
    fill(&mut log, 1..=40);
    let end = frames_end(&log);
    drop(log);
    let files = segment_files(dir.path());

    // In the last segment, below `durable`.
    let last = files.last().expect("segment");
    let saved = fs::read(last).expect("read");
    flip_at(last, end - 3);
    match open(dir.path(), 40) {
        Err(SegmentError::Damaged { index, .. }) => assert_eq!(index, 40),
        other => panic!(
            "opened a log that lost synced entry 40: {:?}",
            other.map(|r| r.1)
        ),
    }
    fs::write(last, &saved).expect("restore");

    // In an earlier segment, whatever `durable` says.
    let first = &files[0];
    let bytes = fs::read(first).expect("read");
    let mut flipped = bytes.clone();
    flipped[MAGIC.len() + FRAME_HEADER + 2] ^= 0x40;
    fs::write(first, &flipped).expect("write");
    let err = open(dir.path(), 0)
        .map(|r| r.1)
        .expect_err("damage in an earlier segment");
    assert!(
        matches!(&err, SegmentError::Damaged { index: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("checksum"), "{err}");
    fs::write(first, &bytes).expect("restore");

    // A missing segment in the middle: a gap in the entries.
    fs::remove_file(&files[1]).expect("remove");
    let err = open(dir.path(), 0).map(|r| r.1).expect_err("a gap");
    assert!(err.to_string().contains("the segment before ends"), "{err}");
}

/// A byte flipped after the open is caught by the read, not returned.
#[test]
fn a_read_checks_the_entry_it_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut log, _) = open(dir.path(), 0).expect("open");
    fill(&mut log, 1..=3);
    let file = &segment_files(dir.path())[0];
    let mut bytes = fs::read(file).expect("read");
    bytes[MAGIC.len() + FRAME_HEADER] ^= 1;
    fs::write(file, &bytes).expect("write");
    assert!(matches!(
        log.read(1),
        Err(SegmentError::Damaged { index: 1, .. })
    ));
    assert_eq!(log.read(2).expect("read"), Some(payload(2)));
}

#[test]
fn truncation_and_purge_remove_entries_durably() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut log, _) = open(dir.path(), 0).expect("open");
    fill(&mut log, 1..=50);
    log.truncate_from(33).expect("truncate");
    assert_holds(&log, 1..=32);
    fill(&mut log, 33..=40);
    let first = log.purge_to(20).expect("purge");
    let first = first.expect("entries left");
    assert!(
        first <= 21 && first > 1,
        "whole segments only: first is {first}"
    );
    assert_holds(&log, first..=40);
    drop(log);
    let (mut log, _) = open(dir.path(), 40).expect("reopen");
    assert_holds(&log, first..=40);

    // Everything truncated: the log starts again wherever the next entry says.
    log.truncate_from(first).expect("truncate all");
    assert_eq!(log.last_index(), None);
    fill(&mut log, 500..=510);
    assert_holds(&log, 500..=510);
    drop(log);
    let (log, _) = open(dir.path(), 510).expect("reopen");
    assert_holds(&log, 500..=510);
    assert!(segment_files(dir.path()).iter().all(|p| p
        .file_name()
        .is_some_and(|n| n.to_string_lossy().as_ref() >= "00000000000000000500.seg")));
}

/// Raft purges past its last entry when a snapshot replaces a follower's whole log: every
/// segment goes, the one being appended to included, and the next entry may have any index.
#[test]
fn a_purge_past_the_last_entry_empties_the_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut log, _) = open(dir.path(), 0).expect("open");
    fill(&mut log, 1..=30);
    assert!(segment_files(dir.path()).len() > 1);
    assert_eq!(log.purge_to(100).expect("purge"), None);
    assert_eq!(log.last_index(), None);
    assert!(segment_files(dir.path()).is_empty());
    assert!(log.spare_count() > 0, "their files kept for reuse");
    fill(&mut log, 101..=105);
    drop(log);
    let (log, _) = open(dir.path(), 105).expect("reopen");
    assert_holds(&log, 101..=105);
}

/// A caller syncing outside its lock gets the segment to sync once per batch of appends, and
/// again only after another append.
#[test]
fn unsynced_hands_out_the_segment_once_per_batch_of_appends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut log, _) = open(dir.path(), 0).expect("open");
    assert!(log.unsynced().is_none());
    for i in 1..=2 {
        log.append(i, &payload(i)).expect("append");
    }
    let (file, path) = log.unsynced().expect("appended since the last sync");
    assert_eq!(path, *segment_files(dir.path()).last().expect("a segment"));
    file.sync_data().expect("sync");
    assert!(log.unsynced().is_none());
    log.append(3, &payload(3)).expect("append");
    assert!(log.unsynced().is_some());
}

#[test]
fn an_entry_too_large_for_a_frame_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut log, _) = open(dir.path(), 0).expect("open");
    let big = vec![0u8; MAX_PAYLOAD as usize + 1];
    assert!(matches!(
        log.append(1, &big),
        Err(SegmentError::TooLarge(_))
    ));
    assert_eq!(log.last_index(), None);
}

fn trim(path: &Path, len: u64) {
    let file = OpenOptions::new().write(true).open(path).expect("open");
    file.set_len(len).expect("set_len");
}

/// Flips the byte at `at`.
fn flip_at(path: &Path, at: u64) {
    let mut bytes = fs::read(path).expect("read");
    bytes[at as usize] ^= 0x10;
    fs::write(path, bytes).expect("write");
}

fn write_at(path: &Path, at: u64, bytes: &[u8]) {
    let file = OpenOptions::new().write(true).open(path).expect("open");
    file.write_all_at(bytes, at).expect("write");
}

/// A fault disk (a FUSE file system of our own that drops every write not fsynced when told)
/// mounted in a temp dir: the dir (which must outlive the disk), the disk and its mount point.
/// Needs root and `/dev/fuse`.
pub(in crate::store) fn fault_disk() -> (tempfile::TempDir, raftq_faultfs::FaultFs, PathBuf) {
    let root = tempfile::tempdir().expect("tempdir");
    let (backing, mount) = (root.path().join("backing"), root.path().join("mount"));
    for dir in [&backing, &mount] {
        fs::create_dir_all(dir).expect("mkdir");
    }
    let disk = raftq_faultfs::FaultFs::mount(&backing, &mount)
        .unwrap_or_else(|e| panic!("a fault disk cannot be mounted here: {e}"));
    (root, disk, mount)
}

/// A real power loss: the log lives on a fault disk (a FUSE file system of our own that drops
/// every write not fsynced when told). Each round appends entries, syncs some of them, appends
/// more without a sync, loses power and opens the log again with the synced index as `durable`:
/// every synced entry is there and reads back, and whatever of the rest survived reads back
/// whole or was cut, never garbled. Needs root and `/dev/fuse`.
#[test]
fn a_power_loss_keeps_every_synced_entry() {
    let (_root, disk, mount) = fault_disk();
    let dir = mount.join("log");
    let mut synced = 0u64;
    for round in 0..6u64 {
        let (mut log, _) = open(&dir, synced).expect("open after a power loss");
        let held = log.last_index().unwrap_or(0);
        assert!(
            held >= synced,
            "round {round}: synced entry {synced}, log ends at {held}"
        );
        if held > 0 {
            assert_holds(&log, 1..=held);
        }
        // Synced: a few segments' worth, then an unsynced tail of several more.
        fill(&mut log, held + 1..=held + 10);
        synced = held + 10;
        for i in synced + 1..=synced + 7 + round * 3 {
            log.append(i, &payload(i)).expect("append");
        }
        drop(log);
        let report = disk.control().drop_unsynced().expect("power loss");
        assert!(report.bytes > 0, "round {round}: nothing was unsynced");
    }
    let (log, _) = open(&dir, synced).expect("open");
    assert_holds(&log, 1..=log.last_index().expect("entries"));
    disk.unmount().expect("unmount");
}

/// Linking up to an entry in the middle of a segment copies that segment's entries up to it
/// into a file of its own (and links the ones before), so that another log's files from the
/// next entry on follow without overlap: the directory reads as one contiguous log. Up to the
/// end of a segment, nothing is copied.
#[test]
fn link_or_copy_ends_exactly_where_asked() {
    let (a, b, into) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let (mut first, _) = open(a.path(), 0).expect("open");
    fill(&mut first, 1..=30);
    let firsts = segment_firsts(a.path()).expect("firsts");
    assert!(firsts.len() >= 3, "{firsts:?}");
    // An entry inside the second segment.
    let cut = firsts[1] + 1;
    assert!(cut < firsts[2] - 1, "{firsts:?}");
    let (mut second, _) = open(b.path(), 0).expect("open");
    fill(&mut second, cut + 1..=40);
    first
        .link_or_copy(2, cut, into.path())
        .expect("link or copy");
    second
        .link_range(cut + 1, 40, into.path())
        .expect("link the rest");
    let linked = SegmentLog::open_read_only(into.path(), 40).expect("contiguous");
    assert_holds(&linked, 1..=40);
    // The first segment is the log's own file; the second a copy, cut at `cut`.
    use std::os::unix::fs::MetadataExt;
    let ino = |p: PathBuf| fs::metadata(p).expect("metadata").ino();
    let name = |first: u64| PathBuf::from(file_name(first));
    assert_eq!(
        ino(into.path().join(name(firsts[0]))),
        ino(a.path().join(name(firsts[0])))
    );
    assert_ne!(
        ino(into.path().join(name(firsts[1]))),
        ino(a.path().join(name(firsts[1])))
    );
    // Up to a segment's last entry: links only.
    let whole = tempfile::tempdir().expect("tempdir");
    let linked = first
        .link_or_copy(1, firsts[2] - 1, whole.path())
        .expect("link");
    assert_eq!(linked, 2);
    let inodes: Vec<u64> = segment_files(whole.path()).into_iter().map(ino).collect();
    let own: Vec<u64> = firsts[..2]
        .iter()
        .map(|f| ino(a.path().join(name(*f))))
        .collect();
    assert_eq!(inodes, own);
}

fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).expect("meta").ino()
}

/// A segment the log purged is kept as a spare, and the next segment starts in its file; none
/// of the file's older frames is ever read as an entry: not while it is the segment appended
/// to, nor once it is finished: the zeros each append writes after its frame end the frames.
#[test]
fn a_purged_segment_is_reused_and_its_old_frames_never_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut log, _) = open(dir.path(), 0).expect("open");
    fill(&mut log, 1..=60);
    let before: Vec<(PathBuf, u64)> = segment_files(dir.path())
        .into_iter()
        .map(|p| (p.clone(), inode(&p)))
        .collect();
    let first = log.purge_to(40).expect("purge").expect("entries left");
    let purged: Vec<u64> = before
        .iter()
        .filter(|(p, _)| !p.exists())
        .map(|(_, ino)| *ino)
        .collect();
    assert!(purged.len() >= 3, "purged {} segments", purged.len());
    assert_eq!(log.spare_count(), purged.len(), "every purged file kept");
    let reused = |dir: &Path| {
        segment_files(dir)
            .iter()
            .filter(|p| purged.contains(&inode(p)))
            .count()
    };

    // Into the first spare, and stop there: the segment appended to holds older frames after
    // the new ones.
    let mut last = 60;
    while log.spare_count() == purged.len() {
        last += 1;
        fill(&mut log, last..=last);
    }
    assert_eq!(reused(dir.path()), 1);
    assert_holds(&log, first..=last);
    drop(log);
    let (mut log, recovery) = open(dir.path(), last).expect("reopen");
    assert_eq!(
        recovery.cut_bytes, 0,
        "older frames are the end, not a torn tail"
    );
    assert_holds(&log, first..=last);

    // Through every spare and past them: the finished reused segments read back after an open.
    fill(&mut log, last + 1..=last + 80);
    assert_eq!(log.spare_count(), 0);
    assert_eq!(reused(dir.path()), purged.len());
    drop(log);
    let (log, recovery) = open(dir.path(), last + 80).expect("reopen");
    assert_eq!(recovery.cut_bytes, 0);
    assert_holds(&log, first..=last + 80);
}

/// A purged segment's file is reused only when nothing else holds it: not when a snapshot
/// links it (the snapshot would read the new entries written over its own), not while a
/// caller syncs it outside the lock, and no more of them than the bound.
#[test]
fn a_segment_linked_or_held_elsewhere_is_not_reused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (log_dir, snap_dir) = (dir.path().join("log"), dir.path().join("snap"));
    fs::create_dir_all(&snap_dir).expect("mkdir");
    let (mut log, _) = open(&log_dir, 0).expect("open");
    fill(&mut log, 1..=40);
    let linked = log.link_range(1, 20, &snap_dir).expect("link");
    assert!(linked >= 2);
    log.purge_to(20).expect("purge");
    assert_eq!(log.spare_count(), 0, "linked files are not reused");
    fill(&mut log, 41..=100);
    let snap = SegmentLog::open_read_only(&snap_dir, 20).expect("the snapshot's files");
    for i in 1..=20 {
        assert_eq!(snap.read(i).expect("read"), Some(payload(i)), "entry {i}");
    }
    drop(log);

    // The segment a caller is syncing outside the lock.
    let held_dir = dir.path().join("held");
    let (mut log, _) = open(&held_dir, 0).expect("open");
    fill(&mut log, 1..=10);
    log.append(11, &payload(11)).expect("append");
    let files = segment_files(&held_dir).len();
    let (held, _) = log.unsynced().expect("unsynced");
    assert_eq!(log.purge_to(100).expect("purge all"), None);
    assert_eq!(log.spare_count(), files - 1, "all but the held one kept");
    held.sync_data().expect("the held file is still its own");
    let held_ino = {
        use std::os::unix::fs::MetadataExt;
        held.metadata().expect("meta").ino()
    };
    fill(&mut log, 101..=200);
    assert!(
        segment_files(&held_dir)
            .iter()
            .all(|p| inode(p) != held_ino),
        "the held file was reused"
    );
    drop(log);

    // More spares on disk than the bound: the extra ones go at the next open.
    for n in 0..MAX_SPARE_SEGMENTS + 3 {
        fs::write(log_dir.join(spare_name(1_000 + n as u64)), b"x").expect("spare");
    }
    let (log, _) = open(&log_dir, 100).expect("reopen");
    assert_eq!(log.spare_count(), MAX_SPARE_SEGMENTS);
    let on_disk = fs::read_dir(&log_dir)
        .expect("dir")
        .filter(|e| {
            e.as_ref()
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .ends_with(SPARE_SUFFIX)
        })
        .count();
    assert_eq!(on_disk, MAX_SPARE_SEGMENTS);
    assert_holds(&log, log.first_index().expect("entries")..=100);
}

/// Power loss with reused segments: each round purges the front of the log (its files become
/// spares), appends synced entries and an unsynced tail that rolls into them, and loses power.
/// Every synced entry reads back after the open; nothing of a reused file's older content does.
/// Needs root and `/dev/fuse`.
#[test]
fn a_power_loss_with_reused_segments_keeps_every_synced_entry() {
    let (_root, disk, mount) = fault_disk();
    let dir = mount.join("log");
    let mut synced = 0u64;
    let mut reused = 0;
    for round in 0..8u64 {
        let (mut log, _) = open(&dir, synced).expect("open after a power loss");
        let held = log.last_index().unwrap_or(0);
        assert!(
            held >= synced,
            "round {round}: synced entry {synced}, log ends at {held}"
        );
        if let Some(first) = log.first_index() {
            assert_holds(&log, first..=held);
        }
        if held > 12 {
            log.purge_to(held - 12).expect("purge");
        }
        let spares = log.spare_count();
        fill(&mut log, held + 1..=held + 10);
        synced = held + 10;
        for i in synced + 1..=synced + 7 + round * 3 {
            log.append(i, &payload(i)).expect("append");
        }
        reused += spares - log.spare_count();
        drop(log);
        let report = disk.control().drop_unsynced().expect("power loss");
        assert!(report.bytes > 0, "round {round}: nothing was unsynced");
    }
    assert!(reused >= 8, "segments reused: {reused}");
    let (log, _) = open(&dir, synced).expect("open");
    assert_holds(
        &log,
        log.first_index().expect("entries")..=log.last_index().expect("entries"),
    );
    disk.unmount().expect("unmount");
}

/// A purge keeps at most [`MAX_SPARE_SEGMENTS`] files for reuse and removes the rest.
#[test]
fn a_purge_keeps_no_more_spares_than_the_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut log, _) = open(dir.path(), 0).expect("open");
    let mut last = 0;
    while segment_files(dir.path()).len() <= MAX_SPARE_SEGMENTS + 2 {
        last += 1;
        fill(&mut log, last..=last);
    }
    assert_eq!(log.purge_to(last + 1).expect("purge"), None);
    assert_eq!(log.spare_count(), MAX_SPARE_SEGMENTS);
    let files = fs::read_dir(dir.path()).expect("dir").count();
    assert_eq!(files, MAX_SPARE_SEGMENTS, "the rest removed");
}
