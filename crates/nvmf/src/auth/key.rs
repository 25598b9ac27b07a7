//! DH-HMAC-CHAP secrets in the form Linux and nvme-cli write them,
//! `DHHC-1:XX:<base64 of the key and its CRC-32>:`, where XX names the
//! hash that turns the key into the one used (00: the key as it is),
//! and the files that hold them.

use std::fmt;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Sha256, Sha384, Sha512};

/// The hash functions of DH-HMAC-CHAP (Base 2.0, figure 605).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hash {
    Sha256,
    Sha384,
    Sha512,
}

impl Hash {
    pub fn from_id(id: u8) -> Option<Hash> {
        match id {
            1 => Some(Hash::Sha256),
            2 => Some(Hash::Sha384),
            3 => Some(Hash::Sha512),
            _ => None,
        }
    }

    pub fn id(self) -> u8 {
        match self {
            Hash::Sha256 => 1,
            Hash::Sha384 => 2,
            Hash::Sha512 => 3,
        }
    }

    /// Output length in bytes.
    pub fn size(self) -> usize {
        match self {
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }

    /// HMAC of the concatenation of `parts` under `key`.
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            let mut m = <M as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
            for p in parts {
                m.update(p);
            }
            m.finalize().into_bytes().to_vec()
        }
        match self {
            Hash::Sha256 => run::<Hmac<Sha256>>(key, parts),
            Hash::Sha384 => run::<Hmac<Sha384>>(key, parts),
            Hash::Sha512 => run::<Hmac<Sha512>>(key, parts),
        }
    }
}

/// A secret. Its `Debug` form hides the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: Vec<u8>,
    /// The hash that transforms the key, or none.
    transform: Option<Hash>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes, {:?})", self.key.len(), self.transform)
    }
}

impl Secret {
    /// A secret of 32, 48 or 64 bytes; a transforming hash needs a key
    /// of its own length.
    pub fn new(key: Vec<u8>, transform: Option<Hash>) -> Result<Secret, String> {
        if ![32, 48, 64].contains(&key.len()) {
            return Err(format!(
                "a DH-HMAC-CHAP key is 32, 48 or 64 bytes, not {}",
                key.len()
            ));
        }
        if let Some(h) = transform {
            if h.size() != key.len() {
                return Err(format!(
                    "a key transformed with {h:?} is {} bytes, not {}",
                    h.size(),
                    key.len()
                ));
            }
        }
        Ok(Secret { key, transform })
    }

    /// Parses `DHHC-1:XX:base64:`.
    pub fn parse(s: &str) -> Result<Secret, String> {
        let bad = |why: &str| Err(format!("not a DHHC-1 secret: {why}"));
        let Some(rest) = s.strip_prefix("DHHC-1:") else {
            return bad("it starts with `DHHC-1:`");
        };
        let Some((xx, rest)) = rest.split_once(':') else {
            return bad("`DHHC-1:XX:` names the key's hash");
        };
        let transform = match xx {
            "00" => None,
            "01" | "02" | "03" => Hash::from_id(xx.as_bytes()[1] - b'0'),
            _ => return bad("the hash is 00, 01, 02 or 03"),
        };
        let Some(b64) = rest.strip_suffix(':') else {
            return bad("it ends with `:`");
        };
        let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(b64) else {
            return bad("the key is not base64");
        };
        if raw.len() < 4 {
            return bad("the key is too short");
        }
        let (key, crc) = raw.split_at(raw.len() - 4);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return bad("the key's CRC-32 does not match");
        }
        Secret::new(key.to_vec(), transform)
    }

    /// The `DHHC-1` form.
    pub fn encode(&self) -> String {
        let mut raw = self.key.clone();
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        let xx = self.transform.map_or(0, Hash::id);
        let b64 = base64::engine::general_purpose::STANDARD.encode(raw);
        format!("DHHC-1:{xx:02}:{b64}:")
    }

    /// The key the responses are computed with: transformed with the
    /// NQN of whoever owns it (Base 2.0, 8.13.5.7).
    pub fn transformed(&self, nqn: &str) -> Vec<u8> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => h.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

/// The secret in file `path`. Refused when anyone but its owner may
/// read or write the file, or it holds no `DHHC-1` secret.
pub fn read_secret(path: impl AsRef<Path>) -> Result<Secret, String> {
    let path = path.as_ref();
    let shown = path.display();
    let meta = fs::metadata(path).map_err(|e| format!("{shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{shown} is not a regular file"));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{shown} has mode {mode:04o}: group and others must have no access \
             (chmod 600 {shown})"
        ));
    }
    let text = fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
    Secret::parse(text.trim_end()).map_err(|e| format!("{shown}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_round_trip_and_bad_ones_are_refused() {
        for (len, t) in [
            (32, None),
            (32, Some(Hash::Sha256)),
            (48, Some(Hash::Sha384)),
            (64, Some(Hash::Sha512)),
        ] {
            let s = Secret::new((0..len as u8).collect(), t).unwrap();
            let text = s.encode();
            assert!(text.starts_with("DHHC-1:0"), "{text}");
            assert_eq!(Secret::parse(&text).unwrap(), s);
        }
        let good = Secret::new(vec![7; 32], None).unwrap().encode();
        let mut flipped = good.clone().into_bytes();
        flipped[12] = if flipped[12] == b'A' { b'B' } else { b'A' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert!(Secret::parse(&flipped).unwrap_err().contains("CRC"));
        assert!(Secret::parse(good.trim_end_matches(':')).is_err());
        assert!(Secret::parse(&good.replace(":00:", ":04:")).is_err());
        assert!(Secret::parse(&good.replace(":00:", ":02:"))
            .unwrap_err()
            .contains("48"));
        assert!(Secret::new(vec![1; 16], None).is_err());
    }

    #[test]
    fn a_transformed_key_is_the_hmac_of_the_nqn() {
        let s = Secret::new(vec![1; 32], Some(Hash::Sha256)).unwrap();
        let k = s.transformed("nqn.2014-08.org.example:h");
        assert_eq!(k.len(), 32);
        assert_ne!(k, vec![1; 32]);
        assert_ne!(k, s.transformed("nqn.2014-08.org.example:other"));
        let plain = Secret::new(vec![1; 32], None).unwrap();
        assert_eq!(plain.transformed("x"), vec![1; 32]);
    }

    #[test]
    fn only_owner_only_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("key");
        let text = Secret::new(vec![9; 48], Some(Hash::Sha384))
            .unwrap()
            .encode();
        fs::write(&p, format!("{text}\n")).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_secret(&p).is_ok());
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        assert!(read_secret(&p).unwrap_err().contains("mode 0640"));
        assert!(read_secret(dir.path().join("none")).is_err());
    }
}
