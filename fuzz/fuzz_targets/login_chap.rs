//! Drive the login state machine with CHAP and initiator groups from
//! arbitrary requests (chunks separated by 0xff; the first byte of each
//! holds the T, C, CSG and NSG bits, the rest is text). Every target and
//! discovery need CHAP, and a fixed input cannot answer a random
//! challenge, so no input may reach the full feature phase.

#![no_main]

use std::sync::Arc;

use bytes::Bytes;
use iscsi::access::{AccessList, AccessPolicy, Admission, Group, InitiatorPattern, TargetAccess};
use iscsi::auth_chap::{ChapAuthenticator, ChapCredentials, ChapPolicy, ChapRequirement, Secret};
use iscsi::login::{LoginMachine, LoginStep, TargetDirectory, TargetInfo};
use iscsi::negotiation::TargetLimits;
use iscsi::pdu::initiator::LoginRequest;
use libfuzzer_sys::fuzz_target;
use scsi_api::{Nexus, ScsiCommand, ScsiResponse, ScsiTarget, TaskManagement, TmfResult};

struct NoLuns;
impl ScsiTarget for NoLuns {
    fn execute(&self, _: &Nexus, _: &ScsiCommand<'_>) -> ScsiResponse {
        ScsiResponse::default()
    }
    fn may_block(&self, _: u64) -> bool {
        false
    }
    fn lun_exists(&self, _: &Nexus, _: u64) -> bool {
        false
    }
    fn task_management(&self, _: &Nexus, _: TaskManagement) -> TmfResult {
        TmfResult::Complete
    }
    fn nexus_lost(&self, _: &Nexus) {}
    fn nexus_added(&self, _: &Nexus) {}
}

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
    for chunk in data.split(|&b| b == 0xff) {
        let Some((&flags, text)) = chunk.split_first() else {
            continue;
        };
        let req = LoginRequest {
            transit: flags & 0x80 != 0,
            continue_: flags & 0x40 != 0,
            csg: (flags >> 2) & 3,
            nsg: flags & 3,
            version_max: 0,
            version_min: 0,
            isid: [0x80, 0, 0, 0, 0, 1],
            tsih: 0,
            itt: 1,
            cid: 0,
            cmdsn: 1,
            exp_statsn: 0,
            data: Bytes::copy_from_slice(text),
        };
        match machine.step(&req, &directory) {
            LoginStep::Reply(_) => {}
            LoginStep::Complete(_, result) => {
                panic!("logged in without a secret: {result:?}");
            }
            LoginStep::Fail(..) => break,
        }
    }
});
