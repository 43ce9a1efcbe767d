//! A small file of two fixed slots written in turn, each holding a few words with a sequence
//! number and a CRC-32: a torn write of one slot leaves the other, older one valid. The durable
//! watermark ([`super::watermark`], synced) and the commit hint ([`super::log`], not synced) are
//! kept in such files, outside RocksDB.
//!
//! A slot: magic (u32), format (u16), two bytes of zeros, sequence number (u64), `WORDS` words
//! (u64 each), the CRC-32 of everything before it (u32), zeros up to a multiple of eight bytes.
//! Every integer is little-endian. The slot with the higher sequence number is the newest.

use std::fs::{File, OpenOptions};
use std::io::{self, Read as _};
use std::os::unix::fs::FileExt as _;
use std::path::Path;

/// What a slot file is: its magic number and the format of its slots.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    pub magic: u32,
    pub format: u16,
}

/// One slot file with `WORDS` words in each slot, open for writing.
pub struct SlotFile<const WORDS: usize> {
    file: File,
    kind: Kind,
    /// The sequence number of the newest slot written (0: none).
    seq: u64,
}

impl<const WORDS: usize> SlotFile<WORDS> {
    /// Bytes of one slot.
    pub const SLOT_BYTES: usize = (16 + 8 * WORDS + 4).div_ceil(8) * 8;

    /// The slot with sequence number `seq` holding `words`.
    pub fn encode(kind: Kind, seq: u64, words: &[u64; WORDS]) -> Vec<u8> {
        let mut b = vec![0u8; Self::SLOT_BYTES];
        b[0..4].copy_from_slice(&kind.magic.to_le_bytes());
        b[4..6].copy_from_slice(&kind.format.to_le_bytes());
        b[8..16].copy_from_slice(&seq.to_le_bytes());
        for (i, w) in words.iter().enumerate() {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        let end = 16 + 8 * WORDS;
        let crc = crc32fast::hash(&b[..end]);
        b[end..end + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// A slot's sequence number and words, or `None` when it is torn, empty or not of `kind`.
    pub fn decode(kind: Kind, b: &[u8]) -> Option<(u64, [u64; WORDS])> {
        if b.len() != Self::SLOT_BYTES {
            return None;
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let end = 16 + 8 * WORDS;
        let crc = u32::from_le_bytes([b[end], b[end + 1], b[end + 2], b[end + 3]]);
        if u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != kind.magic
            || u16::from_le_bytes([b[4], b[5]]) != kind.format
            || crc != crc32fast::hash(&b[..end])
        {
            return None;
        }
        let mut words = [0u64; WORDS];
        for (i, w) in words.iter_mut().enumerate() {
            *w = word(16 + 8 * i);
        }
        Some((word(8), words))
    }

    /// The newest valid slot of a file's bytes.
    fn newest(kind: Kind, bytes: &[u8]) -> Option<(u64, [u64; WORDS])> {
        bytes
            .chunks(Self::SLOT_BYTES)
            .take(2)
            .filter_map(|b| Self::decode(kind, b))
            .max_by_key(|(seq, _)| *seq)
    }

    /// The newest valid slot of the file at `path`: `Ok(None)` when there is no file; an error
    /// when the file exists but holds no valid slot.
    pub fn read(path: &Path, kind: Kind) -> io::Result<Option<[u64; WORDS]>> {
        let mut bytes = Vec::new();
        match File::open(path) {
            Ok(mut f) => f.read_to_end(&mut bytes)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        Self::newest(kind, &bytes)
            .map(|(_, w)| Some(w))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} holds no valid slot", path.display()),
                )
            })
    }

    /// Opens the file at `path`, creating it if needed, and returns it with its newest valid
    /// slot (`None` for a new file, or one whose slots are all torn) and whether it existed.
    pub fn open(path: &Path, kind: Kind) -> io::Result<(Self, Option<[u64; WORDS]>, bool)> {
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let mut bytes = Vec::new();
        (&file).read_to_end(&mut bytes)?;
        let newest = Self::newest(kind, &bytes);
        let slots = SlotFile {
            file,
            kind,
            seq: newest.map_or(0, |(seq, _)| seq),
        };
        Ok((slots, newest.map(|(_, w)| w), existed))
    }

    /// Writes `words` over the older slot, fdatasyncing it when `sync`.
    pub fn write(&mut self, words: &[u64; WORDS], sync: bool) -> io::Result<()> {
        let seq = self.seq + 1;
        let offset = (seq % 2) * Self::SLOT_BYTES as u64;
        self.file
            .write_all_at(&Self::encode(self.kind, seq, words), offset)?;
        if sync {
            self.file.sync_data()?;
        }
        self.seq = seq;
        Ok(())
    }

    /// The sequence number of the newest slot, 0 when none was written.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIND: Kind = Kind {
        magic: 0x1234_5678,
        format: 3,
    };

    #[test]
    fn slots_alternate_and_a_torn_slot_leaves_the_older_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("SLOTS");
        assert_eq!(SlotFile::<3>::read(&path, KIND).expect("read"), None);
        let (mut f, found, existed) = SlotFile::<3>::open(&path, KIND).expect("open");
        assert_eq!((found, existed), (None, false));
        assert_eq!(SlotFile::<3>::SLOT_BYTES, 48);
        f.write(&[1, 2, 3], false).expect("write");
        f.write(&[4, 5, 6], true).expect("write");
        assert_eq!(
            SlotFile::<3>::read(&path, KIND).expect("read"),
            Some([4, 5, 6])
        );
        // Tear the newest slot (seq 2: the first one in the file): the older one is read.
        let mut bytes = std::fs::read(&path).expect("file");
        bytes[20] ^= 0xff;
        std::fs::write(&path, &bytes).expect("tear");
        assert_eq!(
            SlotFile::<3>::read(&path, KIND).expect("read"),
            Some([1, 2, 3])
        );
        // Reopened, the next write goes over the torn slot, not over the valid one.
        let (mut f, found, existed) = SlotFile::<3>::open(&path, KIND).expect("open");
        assert_eq!((found, existed, f.seq()), (Some([1, 2, 3]), true, 1));
        f.write(&[7, 8, 9], false).expect("write");
        assert_eq!(
            SlotFile::<3>::read(&path, KIND).expect("read"),
            Some([7, 8, 9])
        );
        // Both torn: an error, never made-up words; another kind's file is not read as ours.
        let mut bytes = std::fs::read(&path).expect("file");
        bytes[3] ^= 0xff;
        bytes[48 + 30] ^= 0xff;
        std::fs::write(&path, &bytes).expect("tear");
        assert!(SlotFile::<3>::read(&path, KIND).is_err());
        f.write(&[10, 11, 12], false).expect("write");
        let other = Kind { format: 4, ..KIND };
        assert!(SlotFile::<3>::read(&path, other).is_err());
        // A short file (a write cut short by a crash) holds no valid slot either.
        std::fs::write(&path, &bytes[..10]).expect("cut");
        assert!(SlotFile::<3>::read(&path, KIND).is_err());
    }
}
