//! Persistent reservation state that survives a restart (APTPL).
//!
//! A small line-oriented text file; names are hex encoded so no character
//! of an initiator or target name can break the format. It is replaced
//! atomically: written to a temporary file, synced, renamed over the old
//! one, and the directory synced.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use crate::reservations::{PortPair, PrState, PrType, Registration, Reservation};

const MAGIC: &str = "openarray-pr 1";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn port_fields(p: &PortPair) -> String {
    format!(
        "{} {} {} {}",
        hex(p.initiator.as_bytes()),
        hex(&p.isid),
        hex(p.target.as_bytes()),
        p.relative_port
    )
}

fn parse_port<'a>(f: &mut impl Iterator<Item = &'a str>) -> Option<PortPair> {
    let initiator = String::from_utf8(unhex(f.next()?)?).ok()?;
    let isid: [u8; 6] = unhex(f.next()?)?.try_into().ok()?;
    let target = String::from_utf8(unhex(f.next()?)?).ok()?;
    let relative_port = f.next()?.parse().ok()?;
    Some(PortPair {
        initiator: initiator.into(),
        isid,
        target: target.into(),
        relative_port,
    })
}

pub fn render(st: &PrState) -> String {
    let mut s = format!("{MAGIC}\ngeneration {}\n", st.generation);
    for r in &st.registrations {
        s.push_str(&format!(
            "reg {:016x} {} {}\n",
            r.key,
            u8::from(r.all_tg_pt),
            port_fields(&r.port)
        ));
    }
    if let Some(res) = &st.reservation {
        match &res.holder {
            Some(h) => s.push_str(&format!("res {} {}\n", res.kind as u8, port_fields(h))),
            None => s.push_str(&format!("res {} all\n", res.kind as u8)),
        }
    }
    s
}

pub fn parse(text: &str) -> io::Result<PrState> {
    let bad = |line: &str| io::Error::new(io::ErrorKind::InvalidData, format!("bad line `{line}`"));
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a persistent reservation file",
        ));
    }
    let mut st = PrState {
        aptpl: true,
        ..PrState::default()
    };
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("generation") => {
                st.generation = f
                    .next()
                    .and_then(|g| g.parse().ok())
                    .ok_or_else(|| bad(line))?;
            }
            Some("reg") => {
                let key = f
                    .next()
                    .and_then(|k| u64::from_str_radix(k, 16).ok())
                    .ok_or_else(|| bad(line))?;
                let all_tg_pt = f.next() == Some("1");
                let port = parse_port(&mut f).ok_or_else(|| bad(line))?;
                st.registrations.push(Registration {
                    port,
                    key,
                    all_tg_pt,
                });
            }
            Some("res") => {
                let kind = f
                    .next()
                    .and_then(|k| k.parse().ok())
                    .and_then(PrType::from_code)
                    .ok_or_else(|| bad(line))?;
                let mut rest = f.clone();
                let holder = if rest.next() == Some("all") {
                    None
                } else {
                    Some(parse_port(&mut f).ok_or_else(|| bad(line))?)
                };
                st.reservation = Some(Reservation { kind, holder });
            }
            _ => return Err(bad(line)),
        }
    }
    Ok(st)
}

/// Loads the state, or `None` when the file does not exist.
pub fn load(path: &Path) -> io::Result<Option<PrState>> {
    match fs::read_to_string(path) {
        Ok(text) => parse(&text).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Stores the state when APTPL is active, removes the file otherwise.
pub fn store(path: &Path, st: &PrState) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !st.aptpl {
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        return File::open(dir)?.sync_all();
    }
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(render(st).as_bytes())?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PrState {
        let port = |n: &str, p| PortPair {
            initiator: n.into(),
            isid: [0x80, 1, 2, 3, 4, 5],
            target: "iqn.2026-11.org.openarray:t 1".into(),
            relative_port: p,
        };
        PrState {
            generation: 42,
            registrations: vec![
                Registration {
                    port: port("iqn.a", 1),
                    key: 0xDEAD,
                    all_tg_pt: false,
                },
                Registration {
                    port: port("iqn.b", 2),
                    key: 7,
                    all_tg_pt: true,
                },
            ],
            reservation: Some(Reservation {
                kind: PrType::ExclusiveAccess,
                holder: Some(port("iqn.a", 1)),
            }),
            aptpl: true,
        }
    }

    #[test]
    fn round_trips() {
        let st = sample();
        assert_eq!(parse(&render(&st)).unwrap(), st);
        let mut ar = st.clone();
        ar.reservation = Some(Reservation {
            kind: PrType::WriteExclusiveAllRegistrants,
            holder: None,
        });
        assert_eq!(parse(&render(&ar)).unwrap(), ar);
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse("hello").is_err());
        assert!(parse(&format!("{MAGIC}\nreg zz 0 00 00 00 1\n")).is_err());
        assert!(parse(&format!("{MAGIC}\nres 2 all\n")).is_err());
    }

    #[test]
    fn store_and_load_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lu0.pr");
        assert_eq!(load(&path).unwrap(), None);
        let st = sample();
        store(&path, &st).unwrap();
        assert_eq!(load(&path).unwrap(), Some(st.clone()));
        assert!(!dir.path().join("lu0.pr.tmp").exists());
        let off = PrState { aptpl: false, ..st };
        store(&path, &off).unwrap();
        assert!(!path.exists());
    }
}
