//! Which initiators may use which targets, what they see there, and which
//! CHAP they must pass.
//!
//! A target without an entry in the [`AccessList`] is open to every
//! initiator. A target with an entry has initiator groups: an initiator
//! belongs to the first group naming it exactly, else to the first group
//! with a matching wildcard pattern, else to the default group; without a
//! default group it is refused (login status 0x0202) and SendTargets does
//! not show it the target. Each group brings its own SCSI view (its LUN
//! map) and may bring its own CHAP credentials.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use scsi_api::ScsiTarget;

use crate::auth_chap::{ChapPolicy, ChapRequirement};

/// The answer to "may this initiator use this target?".
#[derive(Clone)]
pub enum Admission {
    Refused,
    /// Admitted with the target's own SCSI device server.
    Open,
    /// Admitted with the SCSI view of the initiator's group.
    View(Arc<dyn ScsiTarget>),
}

impl Admission {
    pub fn is_refused(&self) -> bool {
        matches!(self, Admission::Refused)
    }
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Admission::Refused => "Refused",
            Admission::Open => "Open",
            Admission::View(_) => "View",
        })
    }
}

/// Decides admission to normal sessions; discovery follows it too.
pub trait AccessPolicy: Send + Sync {
    fn admit(&self, initiator: &str, target: &str) -> Admission;
}

/// Every initiator may use every target.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenAccess;

impl AccessPolicy for OpenAccess {
    fn admit(&self, _initiator: &str, _target: &str) -> Admission {
        Admission::Open
    }
}

/// An initiator name or a pattern with `*` (any run of characters) and
/// `?` (one character). iSCSI names compare without regard to ASCII case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitiatorPattern(String);

impl InitiatorPattern {
    pub fn new(text: &str) -> InitiatorPattern {
        InitiatorPattern(text.to_ascii_lowercase())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_wildcard(&self) -> bool {
        self.0.contains(['*', '?'])
    }

    pub fn matches(&self, name: &str) -> bool {
        glob(self.0.as_bytes(), name.to_ascii_lowercase().as_bytes())
    }
}

/// Glob match without recursion: on a mismatch, retry from just after
/// the position the last `*` matched (at worst pattern × name steps).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}

/// One initiator group of a target.
#[derive(Clone)]
pub struct Group {
    pub name: String,
    pub members: Vec<InitiatorPattern>,
    /// The group's LUN map as a SCSI device server.
    pub view: Arc<dyn ScsiTarget>,
    /// Overrides the target's CHAP for this group's members.
    pub chap: Option<ChapRequirement>,
}

/// Access rules of one target.
#[derive(Clone, Default)]
pub struct TargetAccess {
    pub groups: Vec<Group>,
    /// The view of initiators no group names; `None` refuses them.
    pub default_view: Option<Arc<dyn ScsiTarget>>,
    /// CHAP for every login to the target unless the group has its own.
    pub chap: Option<ChapRequirement>,
}

/// Where an initiator falls in a target's rules.
enum Membership<'a> {
    Group(&'a Group),
    Default,
}

impl TargetAccess {
    fn membership(&self, initiator: &str) -> Membership<'_> {
        let exact = self.groups.iter().find(|g| {
            g.members
                .iter()
                .any(|m| !m.is_wildcard() && m.matches(initiator))
        });
        let pattern = || {
            self.groups.iter().find(|g| {
                g.members
                    .iter()
                    .any(|m| m.is_wildcard() && m.matches(initiator))
            })
        };
        match exact.or_else(pattern) {
            Some(g) => Membership::Group(g),
            None => Membership::Default,
        }
    }

    /// The group an initiator belongs to, `None` for the default group.
    pub fn group_of(&self, initiator: &str) -> Option<&str> {
        match self.membership(initiator) {
            Membership::Group(g) => Some(&g.name),
            Membership::Default => None,
        }
    }
}

/// Access rules of every target, and CHAP for discovery sessions.
#[derive(Clone, Default)]
pub struct AccessList {
    /// By target name in lower case.
    targets: HashMap<String, TargetAccess>,
    pub discovery_chap: Option<ChapRequirement>,
}

impl AccessList {
    pub fn new() -> AccessList {
        AccessList::default()
    }

    /// Sets the rules of `target`, replacing earlier ones.
    pub fn set_target(&mut self, target: &str, access: TargetAccess) {
        self.targets.insert(target.to_ascii_lowercase(), access);
    }

    pub fn target(&self, target: &str) -> Option<&TargetAccess> {
        self.targets.get(&target.to_ascii_lowercase())
    }
}

impl AccessPolicy for AccessList {
    fn admit(&self, initiator: &str, target: &str) -> Admission {
        let Some(access) = self.target(target) else {
            return Admission::Open;
        };
        match access.membership(initiator) {
            Membership::Group(g) => Admission::View(g.view.clone()),
            Membership::Default => match &access.default_view {
                Some(v) => Admission::View(v.clone()),
                None => Admission::Refused,
            },
        }
    }
}

impl ChapPolicy for AccessList {
    fn chap_for(&self, initiator: &str, target: Option<&str>) -> Option<ChapRequirement> {
        let Some(target) = target else {
            return self.discovery_chap.clone();
        };
        let access = self.target(target)?;
        match access.membership(initiator) {
            Membership::Group(g) => g.chap.clone().or_else(|| access.chap.clone()),
            Membership::Default => access.chap.clone(),
        }
    }
}

/// An [`AccessList`] that can be replaced while the server runs: logins
/// already past their checks keep what they were given.
#[derive(Default)]
pub struct SharedAccess(RwLock<Arc<AccessList>>);

impl SharedAccess {
    pub fn new(list: AccessList) -> Arc<SharedAccess> {
        Arc::new(SharedAccess(RwLock::new(Arc::new(list))))
    }

    pub fn replace(&self, list: AccessList) {
        *self.0.write() = Arc::new(list);
    }

    pub fn current(&self) -> Arc<AccessList> {
        self.0.read().clone()
    }
}

impl AccessPolicy for SharedAccess {
    fn admit(&self, initiator: &str, target: &str) -> Admission {
        self.current().admit(initiator, target)
    }
}

impl ChapPolicy for SharedAccess {
    fn chap_for(&self, initiator: &str, target: Option<&str>) -> Option<ChapRequirement> {
        self.current().chap_for(initiator, target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth_chap::{ChapCredentials, Secret};
    use scsi_api::testing::NoLuns;

    fn chap(user: &str) -> ChapRequirement {
        ChapRequirement {
            initiator: ChapCredentials {
                user: user.into(),
                secret: Secret::new("a-long-secret").unwrap(),
            },
            mutual: None,
        }
    }

    thread_local! {
        /// Views made by `registered`, by name, to tell which one came back.
        static VIEWS: std::cell::RefCell<Vec<(&'static str, Arc<dyn ScsiTarget>)>> =
            Default::default();
    }

    fn registered(name: &'static str) -> Arc<dyn ScsiTarget> {
        // Each Arc is its own allocation, so views compare by pointer.
        let v: Arc<dyn ScsiTarget> = Arc::new(NoLuns);
        VIEWS.with(|vs| vs.borrow_mut().push((name, v.clone())));
        v
    }

    fn which(a: Admission) -> &'static str {
        match a {
            Admission::Refused => "refused",
            Admission::Open => "open",
            Admission::View(v) => VIEWS.with(|vs| {
                vs.borrow()
                    .iter()
                    .find(|(_, known)| Arc::ptr_eq(known, &v))
                    .map_or("?", |(n, _)| *n)
            }),
        }
    }

    fn list(default: bool) -> AccessList {
        let mut l = AccessList::new();
        l.set_target(
            "iqn.t",
            TargetAccess {
                groups: vec![
                    Group {
                        name: "esx".into(),
                        members: vec![InitiatorPattern::new("iqn.1998-01.com.vmware:*")],
                        view: registered("esx"),
                        chap: Some(chap("esx-user")),
                    },
                    Group {
                        name: "db".into(),
                        members: vec![
                            InitiatorPattern::new("iqn.2000-01.org.db:one"),
                            InitiatorPattern::new("IQN.1998-01.com.vmware:DB-HOST"),
                        ],
                        view: registered("db"),
                        chap: None,
                    },
                ],
                default_view: default.then(|| registered("default")),
                chap: Some(chap("target-user")),
            },
        );
        l.discovery_chap = Some(chap("discovery-user"));
        l
    }

    #[test]
    fn groups_exact_before_pattern_then_default() {
        let l = list(false);
        let admitted = |i: &str| which(l.admit(i, "iqn.t"));
        assert_eq!(admitted("iqn.1998-01.com.vmware:esx1"), "esx");
        // The exact name wins over the earlier wildcard group.
        assert_eq!(admitted("iqn.1998-01.com.vmware:db-host"), "db");
        assert_eq!(admitted("iqn.2000-01.ORG.db:one"), "db");
        assert_eq!(admitted("iqn.2000-01.org.db:two"), "refused");
        // Targets without rules are open; names compare without case.
        assert_eq!(which(l.admit("iqn.x", "iqn.other")), "open");
        assert_eq!(which(l.admit("iqn.2000-01.org.db:two", "IQN.T")), "refused");
        let l = list(true);
        assert_eq!(which(l.admit("iqn.2000-01.org.db:two", "iqn.t")), "default");
        assert_eq!(
            l.target("iqn.t")
                .unwrap()
                .group_of("iqn.2000-01.org.db:one"),
            Some("db")
        );
    }

    #[test]
    fn chap_by_group_target_and_discovery() {
        let l = list(true);
        let user = |i: &str, t: Option<&str>| l.chap_for(i, t).map(|c| c.initiator.user);
        assert_eq!(
            user("iqn.1998-01.com.vmware:esx1", Some("iqn.t")).as_deref(),
            Some("esx-user")
        );
        assert_eq!(
            user("iqn.2000-01.org.db:one", Some("iqn.t")).as_deref(),
            Some("target-user")
        );
        assert_eq!(
            user("iqn.nobody", Some("iqn.t")).as_deref(),
            Some("target-user")
        );
        assert_eq!(user("iqn.nobody", Some("iqn.open")), None);
        assert_eq!(user("iqn.nobody", None).as_deref(), Some("discovery-user"));
    }

    #[test]
    fn shared_access_is_replaced_whole() {
        let s = SharedAccess::new(list(false));
        assert!(s.admit("iqn.nobody", "iqn.t").is_refused());
        s.replace(AccessList::new());
        assert!(!s.admit("iqn.nobody", "iqn.t").is_refused());
        assert!(s.chap_for("iqn.nobody", None).is_none());
    }

    #[test]
    fn glob_patterns() {
        let m = |p: &str, t: &str| InitiatorPattern::new(p).matches(t);
        assert!(m("*", ""));
        assert!(m("*", "iqn.a"));
        assert!(m("iqn.*:host?", "iqn.2000-01.x:host1"));
        assert!(!m("iqn.*:host?", "iqn.2000-01.x:host12"));
        assert!(m("iqn.*.x*y", "iqn.a.xb.xcy"));
        assert!(!m("iqn.a", "iqn.ab"));
        assert!(!m("iqn.ab", "iqn.a"));
        assert!(m("a**b", "ab"));
        assert!(!InitiatorPattern::new("iqn.a").is_wildcard());
        // Long adversarial input stays fast.
        let long = "a".repeat(10_000);
        assert!(!m(&format!("{}b", "*a".repeat(50)), &long));
    }
}
