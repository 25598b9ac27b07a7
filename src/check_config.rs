//! `openarray check-config`: everything `serve` would refuse in a file,
//! in one run. Beyond validation it checks the places the daemon writes
//! (state directory, file devices, pool devices and metadata), which
//! validation alone cannot see and `serve` would only find one at a time.

use std::ffi::CString;
use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::ExitCode;

use control::kinds::FileUse;
use control::{ConfigError, Issue, Location};
use serde::Deserialize;
use toml::Spanned;

use crate::output::{EXIT_PROBLEM, EXIT_USAGE};

type Field = Option<Spanned<toml::Value>>;

/// The path keys of a configuration, read on their own so they are checked
/// even when validation fails elsewhere; any other key is ignored here.
#[derive(Deserialize, Default)]
struct Paths {
    daemon: Option<DaemonPaths>,
    #[serde(default)]
    pool: Vec<PoolPaths>,
}

#[derive(Deserialize)]
struct DaemonPaths {
    state_dir: Field,
}

#[derive(Deserialize)]
struct PoolPaths {
    #[serde(default)]
    devices: Vec<Spanned<toml::Value>>,
    metadata: Field,
}

/// What the daemon does at a path.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Use {
    /// Creates the directory and its parents if missing, writes in it.
    Directory,
    /// Opens the file for writing, creating it if missing.
    WritableFile,
    /// Opens an existing file for reading.
    ReadFile,
}

fn access(path: &Path, mode: libc::c_int) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path; access() only reads it.
    unsafe { libc::access(c.as_ptr(), mode) == 0 }
}

/// Why the daemon could not use `path` as `how`, if it could not.
/// `created` is the state directory, which `serve` creates (with its
/// parents) before it opens any device.
fn path_problem(path: &Path, how: Use, created: Option<&Path>) -> Option<String> {
    let shown = path.display();
    if path.as_os_str().is_empty() {
        return None; // validation reports empty paths
    }
    match std::fs::metadata(path) {
        Ok(meta) => {
            let (wanted, mode) = match how {
                Use::Directory if !meta.is_dir() => {
                    return Some(format!("{shown} is not a directory"))
                }
                Use::WritableFile | Use::ReadFile if meta.is_dir() => {
                    return Some(format!("{shown} is a directory"))
                }
                Use::Directory | Use::WritableFile => ("writable", libc::W_OK),
                Use::ReadFile => ("readable", libc::R_OK),
            };
            (!access(path, mode)).then(|| format!("{shown} is not {wanted} by this user"))
        }
        Err(e) if !matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            Some(format!("cannot look at {shown}: {e}"))
        }
        Err(_) if how == Use::ReadFile => Some(format!("{shown} does not exist")),
        Err(_) => {
            // A directory is created with its parents: the nearest one that
            // exists must take it. A file needs its own directory.
            let mut parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            let made = |p: &Path| created.is_some_and(|c| c.starts_with(p));
            if how == Use::Directory || parent.is_some_and(made) {
                while let Some(p) = parent.filter(|p| !p.exists()) {
                    parent = p.parent().filter(|p| !p.as_os_str().is_empty());
                }
            }
            let dir = parent.unwrap_or(Path::new("."));
            match std::fs::metadata(dir) {
                Err(_) => Some(format!(
                    "the directory {} of {shown} does not exist",
                    dir.display()
                )),
                Ok(m) if !m.is_dir() => Some(format!(
                    "{} (in the path {shown}) is not a directory",
                    dir.display()
                )),
                Ok(_) if !access(dir, libc::W_OK) => Some(format!(
                    "cannot create {shown}: {} is not writable by this user",
                    dir.display()
                )),
                Ok(_) => None,
            }
        }
    }
}

/// The problems with the paths of `text`; none when it does not parse (the
/// syntax error is reported by validation).
fn path_issues(text: &str) -> Vec<Issue> {
    let Ok(paths) = toml::from_str::<Paths>(text) else {
        return Vec::new();
    };
    let state_dir = paths
        .daemon
        .as_ref()
        .and_then(|d| d.state_dir.as_ref())
        .and_then(|d| d.get_ref().as_str())
        .map(Path::new);
    let issue = |path: &str, span: std::ops::Range<usize>, field: String, how: Use| {
        let created = state_dir.filter(|_| how != Use::Directory);
        path_problem(Path::new(path), how, created).map(|reason| Issue {
            location: Some(Location::of_span(text, &span)),
            field,
            reason,
        })
    };
    let spanned = |value: &Spanned<toml::Value>, field: String, how: Use| {
        let path = value.get_ref().as_str()?;
        issue(path, value.span(), field, how)
    };
    let mut issues = Vec::new();
    if let Some(dir) = paths.daemon.as_ref().and_then(|d| d.state_dir.as_ref()) {
        issues.extend(spanned(dir, "daemon.state_dir".into(), Use::Directory));
    }
    // Each kind says which of its settings name files it opens.
    for f in control::kinds::device_files(text) {
        let how = match f.how {
            FileUse::Data if !f.read_only => Use::WritableFile,
            FileUse::Data | FileUse::Reads => Use::ReadFile,
        };
        issues.extend(issue(&f.path, f.span, f.field, how));
    }
    for (i, p) in paths.pool.iter().enumerate() {
        for (j, device) in p.devices.iter().enumerate() {
            let field = format!("pool[{i}].devices[{j}]");
            issues.extend(spanned(device, field, Use::WritableFile));
        }
        if let Some(meta) = &p.metadata {
            issues.extend(spanned(
                meta,
                format!("pool[{i}].metadata"),
                Use::WritableFile,
            ));
        }
    }
    issues
}

/// LUN mappings of the targets' own maps and of their groups.
fn mappings(config: &control::Config) -> (usize, usize, usize) {
    let own = config.targets.iter().map(|t| t.luns.len()).sum();
    let groups = config.targets.iter().map(|t| t.groups.len()).sum();
    let in_groups = config
        .targets
        .iter()
        .flat_map(|t| &t.groups)
        .map(|g| g.luns.len())
        .sum();
    (own, groups, in_groups)
}

/// Exit status 0 when `file` would serve, 1 with every problem printed, 2
/// when it cannot be read.
pub fn run(file: &Path) -> ExitCode {
    let origin = file.display().to_string();
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{origin}: cannot read the configuration: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // The token files are checked as `serve` would (mode, length).
    let checked = control::load_config(file)
        .and_then(|config| control::load_api_token(&config).map(|_| config))
        .and_then(|config| control::load_read_only_token(&config).map(|_| config));
    let mut issues = path_issues(&text);
    let config = match checked {
        Ok(config) => Some(config),
        Err(e) => {
            issues.extend(e.issues);
            None
        }
    };
    if !issues.is_empty() {
        issues.sort_by_key(|i| i.location.map(|l| (l.line, l.column)));
        eprintln!("{}", ConfigError::new(&origin, issues));
        return ExitCode::from(EXIT_PROBLEM);
    }
    let Some(config) = config else {
        return ExitCode::from(EXIT_PROBLEM);
    };
    let (own, groups, in_groups) = mappings(&config);
    println!(
        "{origin}: ok ({} portal(s), {} pool(s), {} device(s), {} target(s), {groups} group(s), {} LUN mapping(s): {own} in targets, {in_groups} in groups)",
        config.portals.len(),
        config.pools.len(),
        config.devices.len(),
        config.targets.len(),
        own + in_groups,
    );
    if config.portals.is_empty() {
        eprintln!("{origin}: warning: no [[portal]]; `serve` will need --listen");
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_directories_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none/disk.img");
        let why = path_problem(&missing, Use::WritableFile, None).unwrap();
        assert!(why.contains("does not exist"), "{why}");
        let here = dir.path().join("disk.img");
        assert_eq!(path_problem(&here, Use::WritableFile, None), None);
        // A state directory is created with its parents, before devices.
        let state = dir.path().join("a/b/c");
        assert_eq!(path_problem(&state, Use::Directory, None), None);
        let in_state = state.join("disk.img");
        assert_eq!(
            path_problem(&in_state, Use::WritableFile, Some(&state)),
            None
        );
        assert!(path_problem(&in_state, Use::WritableFile, None).is_some());
        assert!(path_problem(&missing, Use::ReadFile, None).is_some());
    }

    #[test]
    fn files_in_place_of_directories_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let why = path_problem(&file.join("disk.img"), Use::WritableFile, None).unwrap();
        assert!(why.contains("is not a directory"), "{why}");
        let why = path_problem(&file, Use::Directory, None).unwrap();
        assert!(why.contains("is not a directory"), "{why}");
        let why = path_problem(dir.path(), Use::WritableFile, None).unwrap();
        assert!(why.contains("is a directory"), "{why}");
    }

    #[test]
    fn unwritable_directories_are_named() {
        // Root may write anywhere but on a read-only file system.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            eprintln!("skipped: root writes to any directory");
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o500)).unwrap();
        let why = path_problem(&dir.path().join("disk.img"), Use::WritableFile, None).unwrap();
        assert!(why.contains("not writable"), "{why}");
    }

    #[test]
    fn every_path_key_is_checked_with_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let (d, f) = (dir.path().display(), file.display());
        let text = format!(
            "[daemon]\nstate_dir = \"{f}/state\"\n\n\
            [[device]]\nname = \"a\"\nkind = \"file\"\npath = \"{d}/none/a.img\"\n\n\
            [[device]]\nname = \"m\"\nkind = \"mem\"\npath = \"{d}/none/ignored\"\n\n\
            [[pool]]\nname = \"p\"\ndevices = [\"{d}/p0\", \"{d}/none/p1\"]\n\
            metadata = \"{d}/none/p.meta\"\n"
        );
        let issues = path_issues(&text);
        let fields: Vec<&str> = issues.iter().map(|i| i.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "daemon.state_dir",
                "device[0].path",
                "pool[0].devices[1]",
                "pool[0].metadata"
            ]
        );
        assert_eq!(issues[1].location, Some(Location { line: 7, column: 8 }));
        assert!(path_issues("not toml [").is_empty());
    }
}
