//! Drive the login state machine and the key negotiator with arbitrary
//! requests. Input: chunks separated by 0xff; in each chunk the first byte
//! holds the T, C, CSG and NSG bits (as in the Login Request) and the rest
//! is the text data.

#![no_main]

use std::sync::Arc;

use iscsi::auth::NoAuthentication;
use iscsi::login::{LoginMachine, LoginStep, TargetDirectory, TargetInfo};
use iscsi::negotiation::{Negotiator, Stage, TargetLimits};
use libfuzzer_sys::fuzz_target;
use openarray_fuzz::login_requests;

struct Targets;

impl TargetDirectory for Targets {
    fn target_info(&self, name: &str) -> Option<TargetInfo> {
        name.starts_with("iqn.").then_some(TargetInfo {
            portal_group: 1,
            alias: None,
        })
    }
}

fuzz_target!(|data: &[u8]| {
    // The negotiator alone, on the whole input as one batch of keys.
    if let Ok(keys) = iscsi::text::parse(data) {
        let mut n = Negotiator::new(TargetLimits::default());
        for stage in [Stage::Security, Stage::Operational, Stage::FullFeature] {
            if let Ok(answers) = n.negotiate(stage, &keys) {
                assert!(answers.len() <= keys.len() + 1);
            }
        }
        let p = &n.params;
        assert!(p.first_burst_length <= p.max_burst_length);
        assert!(p.initiator_mrdsl >= 512 && p.initiator_mrdsl < 1 << 24);
    }

    // The login state machine over a sequence of requests.
    let mut machine =
        LoginMachine::new(TargetLimits::default(), Arc::new(NoAuthentication), 1, 128);
    for req in login_requests(data) {
        match machine.step(&req, &Targets) {
            LoginStep::Reply(_) => {}
            LoginStep::Complete(reply, result) => {
                assert!(reply.response.transit && reply.response.nsg == 3);
                assert!(result.params.first_burst_length <= result.params.max_burst_length);
                break;
            }
            LoginStep::Fail(reply, status) => {
                assert_eq!(reply.response.status_class, status.class);
                assert_ne!(status.class, 0);
                break;
            }
        }
    }
});
