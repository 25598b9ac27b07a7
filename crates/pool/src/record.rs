//! What the pool remembers about each volume, and its encoding in the
//! metadata store.

use std::io;

/// Whether a volume takes writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeKind {
    /// A writable volume (possibly a clone of a snapshot).
    Volume,
    /// A read-only, point-in-time image of a volume.
    Snapshot,
}

/// One volume as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRecord {
    pub name: String,
    pub kind: VolumeKind,
    /// Virtual size in bytes.
    pub size: u64,
    /// For a snapshot, the volume it was taken of; for a clone, the snapshot
    /// it was cloned from. Lineage only: shared units are reference counted,
    /// so no volume depends on another for its data.
    pub parent: Option<u64>,
}

/// A volume as reported to users.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeInfo {
    pub id: u64,
    pub name: String,
    pub kind: VolumeKind,
    pub size: u64,
    /// Name of the parent (see [`VolumeRecord::parent`]).
    pub parent: Option<String>,
    /// Units this volume maps.
    pub mapped_units: u64,
    /// Units mapped by this volume only (freed if it is deleted).
    pub exclusive_units: u64,
}

const KIND_VOLUME: u8 = 1;
const KIND_SNAPSHOT: u8 = 2;
/// Kind byte, size, parent (0 = none; ids start at 1), then the name.
const HEADER: usize = 1 + 8 + 8;

impl VolumeRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.name.len());
        out.push(match self.kind {
            VolumeKind::Volume => KIND_VOLUME,
            VolumeKind::Snapshot => KIND_SNAPSHOT,
        });
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.parent.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> io::Result<VolumeRecord> {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed volume record");
        if bytes.len() < HEADER {
            return Err(bad());
        }
        let kind = match bytes[0] {
            KIND_VOLUME => VolumeKind::Volume,
            KIND_SNAPSHOT => VolumeKind::Snapshot,
            _ => return Err(bad()),
        };
        let size = u64::from_le_bytes(bytes[1..9].try_into().map_err(|_| bad())?);
        let parent = u64::from_le_bytes(bytes[9..17].try_into().map_err(|_| bad())?);
        let name = String::from_utf8(bytes[HEADER..].to_vec()).map_err(|_| bad())?;
        Ok(VolumeRecord {
            name,
            kind,
            size,
            parent: (parent != 0).then_some(parent),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for rec in [
            VolumeRecord {
                name: "vol-a".into(),
                kind: VolumeKind::Volume,
                size: 1 << 30,
                parent: None,
            },
            VolumeRecord {
                name: "snap".into(),
                kind: VolumeKind::Snapshot,
                size: 4096,
                parent: Some(7),
            },
        ] {
            assert_eq!(VolumeRecord::decode(&rec.encode()).unwrap(), rec);
        }
    }

    #[test]
    fn rejects_garbage() {
        assert!(VolumeRecord::decode(&[1, 2, 3]).is_err());
        let mut bytes = VolumeRecord {
            name: "x".into(),
            kind: VolumeKind::Volume,
            size: 1,
            parent: None,
        }
        .encode();
        bytes[0] = 9;
        assert!(VolumeRecord::decode(&bytes).is_err());
    }
}
