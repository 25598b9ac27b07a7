//! The device graph: which setting names which device, gathered from every
//! table as it is read (valid or not), so its problems are found in the
//! same run as all others: a device named but not configured, one with two
//! users, a loop, a device under another also served.

use std::collections::{HashMap, HashSet};

use crate::error::{Issue, Location};

/// A setting naming a device.
pub(super) struct Edge {
    /// The device whose setting it is; none for a pool.
    pub from: Option<String>,
    /// Who uses the device, for messages: "device `r1`", "pool `tank`".
    pub user: String,
    pub child: String,
    pub at: Location,
    /// The setting, e.g. `device[3].members`.
    pub field: String,
}

/// A LUN or NBD export serving a device.
pub(super) struct Served {
    pub device: String,
    /// "a LUN", "an NBD export".
    pub what: &'static str,
    pub at: Location,
    pub field: String,
}

#[derive(Default)]
pub(super) struct Graph {
    /// Every device name declared, valid device or not.
    pub declared: Vec<String>,
    pub edges: Vec<Edge>,
    pub served: Vec<Served>,
}

impl Graph {
    pub(super) fn issues(&self) -> Vec<Issue> {
        let issue = |at: Location, field: &str, reason: String| Issue {
            location: Some(at),
            field: field.to_string(),
            reason,
        };
        let mut issues = Vec::new();
        // The first user of each device.
        let mut user: HashMap<&str, &str> = HashMap::new();
        for e in &self.edges {
            if !self.declared.contains(&e.child) {
                let hint = if e.from.is_none() {
                    " (give a data file as a path with a `/`)"
                } else {
                    ""
                };
                let reason = format!("no [[device]] is named `{}`{hint}", e.child);
                issues.push(issue(e.at, &e.field, reason));
                continue;
            }
            match user.get(e.child.as_str()) {
                None => {
                    user.insert(&e.child, &e.user);
                }
                // A device naming one twice: its kind says so.
                Some(first) if *first == e.user => {}
                Some(first) => {
                    let reason = format!(
                        "`{}` is already used by {first}; a device has one user",
                        e.child
                    );
                    issues.push(issue(e.at, &e.field, reason));
                }
            }
        }
        issues.extend(self.loops());
        for s in &self.served {
            if let Some(by) = user.get(s.device.as_str()) {
                let reason = format!(
                    "`{}` is under {by} and cannot also be {}: I/O to it would bypass {by}",
                    s.device, s.what
                );
                issues.push(issue(s.at, &s.field, reason));
            }
        }
        issues
    }

    /// A device reached again from itself through the devices it is built
    /// on, reported once for each device in the loop, at its setting that
    /// leads into it.
    fn loops(&self) -> Vec<Issue> {
        let mut under: HashMap<&str, Vec<&Edge>> = HashMap::new();
        for e in &self.edges {
            if let Some(from) = &e.from {
                under.entry(from).or_default().push(e);
            }
        }
        let mut starts: Vec<&str> = Vec::new();
        for e in &self.edges {
            if let Some(from) = e.from.as_deref().filter(|f| !starts.contains(f)) {
                starts.push(from);
            }
        }
        let mut issues = Vec::new();
        for d in starts {
            for first in under.get(d).into_iter().flatten() {
                if let Some(path) = path_back(&under, &first.child, d) {
                    issues.push(Issue {
                        location: Some(first.at),
                        field: first.field.clone(),
                        reason: format!("devices form a loop: {d} → {}", path.join(" → ")),
                    });
                    break;
                }
            }
        }
        issues
    }
}

/// The names from `start` down to `end`, when `end` is under `start` or is
/// `start`.
fn path_back<'a>(
    under: &HashMap<&str, Vec<&'a Edge>>,
    start: &'a str,
    end: &str,
) -> Option<Vec<&'a str>> {
    let mut stack: Vec<Vec<&str>> = vec![vec![start]];
    let mut seen = HashSet::new();
    while let Some(path) = stack.pop() {
        let name = *path.last()?;
        if name == end {
            return Some(path);
        }
        if !seen.insert(name) {
            continue;
        }
        for e in under.get(name).into_iter().flatten() {
            let mut next = path.clone();
            next.push(&e.child);
            stack.push(next);
        }
    }
    None
}
