//! The link's shared secret, read from a file only its owner may read.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Fewer bytes than this would let a captured handshake be guessed
/// offline.
pub const MIN_SECRET_BYTES: usize = 16;

/// The secret in `path`, its trailing line ending dropped. Refused when
/// the file can be read or written by anyone but its owner, or holds
/// too short a secret.
pub fn read_secret(path: &Path) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let meta = fs::metadata(path).map_err(|e| format!("secret_file {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("secret_file {shown} is not a regular file"));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "secret_file {shown} has mode {mode:04o}: group and others must have no access \
             (chmod 600 {shown})"
        ));
    }
    let mut secret = fs::read(path).map_err(|e: io::Error| format!("secret_file {shown}: {e}"))?;
    while secret.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        secret.pop();
    }
    if secret.len() < MIN_SECRET_BYTES {
        return Err(format!(
            "secret_file {shown} holds {} bytes; the secret needs at least {MIN_SECRET_BYTES}",
            secret.len()
        ));
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, mode: u32, text: &str) -> std::path::PathBuf {
        let p = dir.join("secret");
        fs::write(&p, text).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn only_an_owner_only_file_with_a_long_secret_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), 0o600, "0123456789abcdef-pair\n");
        assert_eq!(read_secret(&p).unwrap(), b"0123456789abcdef-pair");
        let p = write(dir.path(), 0o644, "0123456789abcdef-pair\n");
        let e = read_secret(&p).unwrap_err();
        assert!(
            e.contains("mode 0644") && e.contains(&p.display().to_string()),
            "{e}"
        );
        let p = write(dir.path(), 0o400, "short\n");
        let e = read_secret(&p).unwrap_err();
        assert!(e.contains("at least 16"), "{e}");
        let e = read_secret(&dir.path().join("none")).unwrap_err();
        assert!(e.contains("none"), "{e}");
    }
}
