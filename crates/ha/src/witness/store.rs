//! The witness's records on disk: one file, replaced whole (written to a
//! temporary file, synced, renamed over, the directory synced) before a
//! grant that changed a record is answered, so a crash leaves the old
//! file or the new one and never a grant the disk does not know of.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::lease::{Key, Record, MAX_RECORDS};
use super::wire::{name_ok, MAX_MIRROR_NAME};
use crate::link::handshake::MAX_NAME;
use crate::mirror::generations::Generations;

const HEADER: &str = "openarray-witness 1";
const FILE: &str = "leases";

pub struct Store {
    dir: PathBuf,
}

fn bad(path: &Path, line: usize, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{} line {line}: {why}", path.display()),
    )
}

fn parse_line(text: &str) -> Option<(Key, Record)> {
    let f: Vec<&str> = text.split(' ').collect();
    let [a, b, mirror, holder, lease, cur, bm, h0, h1] = f[..] else {
        return None;
    };
    let names = [a, b, holder].iter().all(|n| name_ok(n, MAX_NAME))
        && name_ok(mirror, MAX_MIRROR_NAME)
        && (holder == a || holder == b)
        && a < b;
    if !names {
        return None;
    }
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    let generations = Generations {
        current: hex(cur)?,
        bitmap: hex(bm)?,
        history: [hex(h0)?, hex(h1)?],
    };
    let key = Key {
        pair: (a.to_string(), b.to_string()),
        mirror: mirror.to_string(),
    };
    let rec = Record {
        holder: holder.to_string(),
        generations,
        lease: Duration::from_millis(lease.parse().ok()?),
        until: None,
    };
    Some((key, rec))
}

impl Store {
    /// The store in `dir` (created if missing).
    pub fn open(dir: &Path) -> io::Result<Store> {
        fs::create_dir_all(dir)?;
        Ok(Store {
            dir: dir.to_path_buf(),
        })
    }

    /// The records written last; none for a new store. A file that is
    /// not entirely ours is an error, never read as empty: a witness
    /// that forgot a newer generation could grant a stale node.
    pub fn load(&self) -> io::Result<Vec<(Key, Record)>> {
        let path = self.dir.join(FILE);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(bad(&path, 1, "not a witness's lease file"));
        }
        let mut out = Vec::new();
        for (i, line) in lines.enumerate() {
            let rec = parse_line(line).ok_or_else(|| bad(&path, i + 2, "malformed record"))?;
            out.push(rec);
            if out.len() > MAX_RECORDS {
                return Err(bad(&path, i + 2, "more records than a witness keeps"));
            }
        }
        Ok(out)
    }

    /// Replaces the file with `records`.
    pub fn save<'a>(&self, records: impl Iterator<Item = (&'a Key, &'a Record)>) -> io::Result<()> {
        let mut text = format!("{HEADER}\n");
        for (k, r) in records {
            let g = &r.generations;
            text.push_str(&format!(
                "{} {} {} {} {} {:x} {:x} {:x} {:x}\n",
                k.pair.0,
                k.pair.1,
                k.mirror,
                r.holder,
                r.lease.as_millis(),
                g.current,
                g.bitmap,
                g.history[0],
                g.history[1]
            ));
        }
        let tmp = self.dir.join(format!("{FILE}.tmp"));
        let mut f = File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, self.dir.join(FILE))?;
        File::open(&self.dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_a_reopen_and_a_damaged_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.load().unwrap().is_empty());
        let key = Key::new("b", "a", "vm");
        let rec = Record {
            holder: "b".into(),
            generations: Generations {
                current: 0xabc,
                bitmap: 1,
                history: [2, 3],
            },
            lease: Duration::from_millis(3000),
            until: None,
        };
        store.save([(&key, &rec)].into_iter()).unwrap();
        let again = Store::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(again, vec![(key, rec)]);
        let path = dir.path().join(FILE);
        let text = fs::read_to_string(&path).unwrap();
        fs::write(&path, text.replace(" b 3000", " c 3000")).unwrap();
        let e = store.load().unwrap_err().to_string();
        assert!(e.contains("line 2: malformed record"), "{e}");
        fs::write(&path, "something else\n").unwrap();
        assert!(store.load().is_err());
    }
}
