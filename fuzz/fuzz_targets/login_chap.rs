//! Drive the login state machine with CHAP and initiator groups from
//! arbitrary requests (chunks separated by 0xff; the first byte of each
//! holds the T, C, CSG and NSG bits, the rest is text). Every target and
//! discovery need CHAP, and a fixed input cannot answer a random
//! challenge, so no input may reach the full feature phase.

#![no_main]

use std::sync::Arc;

use iscsi::access::{AccessList, AccessPolicy, Admission, Group, InitiatorPattern, TargetAccess};
use iscsi::auth_chap::{ChapAuthenticator, ChapCredentials, ChapPolicy, ChapRequirement, Secret};
use iscsi::login::{LoginMachine, LoginStep, TargetDirectory, TargetInfo};
use iscsi::negotiation::TargetLimits;
use libfuzzer_sys::fuzz_target;
use openarray_fuzz::{login_requests, NoLuns};

fn chap(user: &str, secret: &str, mutual: bool) -> ChapRequirement {
    ChapRequirement {
        initiator: ChapCredentials {
            user: user.into(),
            secret: Secret::new(secret).unwrap(),
        },
        mutual: mutual.then(|| ChapCredentials {
            user: "array".into(),
            secret: Secret::new("target-secret-xyz").unwrap(),
        }),
    }
}

/// The same rules for every target: CHAP for the default group, and a
/// group (matching names the input may well use) with CHAP of its own;
/// CHAP for discovery too.
struct Guarded {
    rules: TargetAccess,
    discovery: ChapRequirement,
}

impl Guarded {
    fn list(&self, target: &str) -> AccessList {
        let mut list = AccessList::new();
        list.set_target(target, self.rules.clone());
        list
    }
}

impl ChapPolicy for Guarded {
    fn chap_for(&self, initiator: &str, target: Option<&str>) -> Option<ChapRequirement> {
        match target {
            None => Some(self.discovery.clone()),
            Some(t) => self.list(t).chap_for(initiator, Some(t)),
        }
    }
}

impl AccessPolicy for Guarded {
    fn admit(&self, initiator: &str, target: &str) -> Admission {
        self.list(target).admit(initiator, target)
    }
}

struct Directory(Arc<Guarded>);
impl TargetDirectory for Directory {
    fn target_info(&self, name: &str) -> Option<TargetInfo> {
        name.starts_with("iqn.").then_some(TargetInfo {
            portal_group: 1,
            alias: None,
        })
    }
    fn admits(&self, initiator: &str, name: &str) -> bool {
        !self.0.admit(initiator, name).is_refused()
    }
}

fuzz_target!(|data: &[u8]| {
    let guarded = Arc::new(Guarded {
        rules: TargetAccess {
            groups: vec![Group {
                name: "members".into(),
                members: vec![InitiatorPattern::new("iqn.m*")],
                view: Arc::new(NoLuns),
                chap: Some(chap("member", "member-secret-1", true)),
            }],
            default_view: Some(Arc::new(NoLuns)),
            chap: Some(chap("alice", "alice-secret-12", false)),
        },
        discovery: chap("disc", "discovery-secret", false),
    });
    let directory = Directory(guarded.clone());
    let mut machine = LoginMachine::new(
        TargetLimits::default(),
        Arc::new(ChapAuthenticator::new(guarded)),
        1,
        128,
    );
    for req in login_requests(data) {
        match machine.step(&req, &directory) {
            LoginStep::Reply(_) => {}
            LoginStep::Complete(_, result) => {
                panic!("logged in without a secret: {result:?}");
            }
            LoginStep::Fail(..) => break,
        }
    }
});
