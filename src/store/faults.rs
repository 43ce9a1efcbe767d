//! Fault injection points for tests: named places in the snapshot write and install paths
//! where a test can make the next pass fail, as a crash there would stop it.
//!
//! In a build without tests, [`point`] is `Ok(())` and compiles away. In unit tests a point is
//! armed per thread (so tests running side by side never trip each other), for the calls the
//! test makes on its own thread.

use std::io;

/// After the snapshot's temp file is written, before it is fsynced.
pub const BUILD_WRITTEN: &str = "snapshot.build.written";
/// A linked snapshot: after its segment files are linked, before their directory is fsynced.
pub const BUILD_LINKED: &str = "snapshot.build.linked";
/// After the temp file is fsynced, before the rename.
pub const BUILD_SYNCED: &str = "snapshot.build.synced";
/// After the rename, before the directory is fsynced.
pub const BUILD_RENAMED: &str = "snapshot.build.renamed";
/// A received snapshot: after its temp file is written, before it is fsynced.
pub const RECEIVE_WRITTEN: &str = "snapshot.receive.written";
/// A received snapshot: after the fsync, before the rename.
pub const RECEIVE_SYNCED: &str = "snapshot.receive.synced";
/// A received snapshot: after the rename, before the directory is fsynced.
pub const RECEIVE_RENAMED: &str = "snapshot.receive.renamed";
/// A received snapshot is stored durably; the state machine is not replaced yet.
pub const INSTALL_STORED: &str = "snapshot.install.stored";
/// Loading a snapshot into the state machine: the first of several batches of its pairs is
/// written (the snapshot's applied log id among them), the rest are not.
pub const INSTALL_LOADING: &str = "snapshot.install.loading";
/// The state machine was replaced; older snapshot files are not removed yet.
pub const INSTALL_LOADED: &str = "snapshot.install.loaded";

/// Every point of the snapshot build, in order.
pub const BUILD: [&str; 4] = [BUILD_WRITTEN, BUILD_LINKED, BUILD_SYNCED, BUILD_RENAMED];
/// Every point of receiving and installing a snapshot, in order.
pub const INSTALL: [&str; 6] = [
    RECEIVE_WRITTEN,
    RECEIVE_SYNCED,
    RECEIVE_RENAMED,
    INSTALL_STORED,
    INSTALL_LOADING,
    INSTALL_LOADED,
];

#[cfg(test)]
thread_local! {
    static ARMED: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
}

/// Fails with an I/O error when a test armed `name` on this thread; otherwise does nothing.
#[inline]
pub fn point(name: &'static str) -> io::Result<()> {
    #[cfg(test)]
    if ARMED.with(|armed| armed.get()) == Some(name) {
        return Err(io::Error::other(format!("injected fault at {name}")));
    }
    let _ = name;
    Ok(())
}

/// Arms `name` on this thread until the guard drops.
#[cfg(test)]
pub fn arm(name: &'static str) -> Armed {
    ARMED.with(|armed| armed.set(Some(name)));
    Armed
}

/// Disarms on drop.
#[cfg(test)]
pub struct Armed;

#[cfg(test)]
impl Drop for Armed {
    fn drop(&mut self) {
        ARMED.with(|armed| armed.set(None));
    }
}
