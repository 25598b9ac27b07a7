//! `kind = "mirror"`: its `over` device replicated synchronously to the
//! peer's mirror of the same name, over the node's HA link (docs/ha.md).
//! Opening one needs the link, which the daemon starts from `[ha]`.

use std::io;
use std::sync::Arc;

use block::{BlockDevice, DeviceError, ErrorClass};
use ha::{Connection, Mirror, MirrorOptions, Role};

use super::{Change, DeviceSpec, Fields, Kind, OpenContext, Verdict};
use crate::render;

pub const KIND: Kind = Kind {
    name: "mirror",
    fields: &["over", "resync_rate"],
    parse,
    api: Some(&super::mirror_api::API),
    files: &[],
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorSpec {
    pub over: String,
    /// Bytes a second a resync copies at most.
    pub resync_rate: u64,
}

fn parse(f: &mut Fields<'_>) -> Option<Arc<dyn DeviceSpec>> {
    f.needs("over", "the local device it replicates");
    let over = f.device("over");
    let resync_rate = f
        .bytes("resync_rate")
        .unwrap_or(MirrorOptions::default().resync_rate);
    Some(Arc::new(MirrorSpec {
        over: over?,
        resync_rate,
    }))
}

pub fn as_mirror(device: &dyn BlockDevice) -> Option<&Mirror> {
    device.as_any()?.downcast_ref::<Mirror>()
}

impl DeviceSpec for MirrorSpec {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn children(&self) -> Vec<&str> {
        vec![&self.over]
    }

    fn open(&self, ctx: &OpenContext<'_>) -> io::Result<Arc<dyn BlockDevice>> {
        let link = ha::pair::link().ok_or_else(|| {
            io::Error::from(DeviceError::new(
                ErrorClass::NotReady,
                format!("mirror `{}` needs the HA link of an [ha] section", ctx.name),
            ))
        })?;
        let options = MirrorOptions {
            resync_rate: self.resync_rate,
            failover: ha::pair::failover(),
            ..MirrorOptions::default()
        };
        Ok(Arc::new(Mirror::open(
            ctx.name,
            ctx.child()?,
            link,
            options,
        )?))
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("over", self.over.clone()),
            ("resync_rate", render::size(self.resync_rate)),
        ]
    }

    fn replaces_data(&self, change: &Change<'_>) -> Option<(&'static str, String)> {
        let new = change.new_as::<MirrorSpec>()?;
        super::over_changed(change.name, &self.over, &new.over)
    }

    fn holds(&self) -> String {
        super::over_holds(&self.over)
    }

    fn applies_live(&self, new: &dyn DeviceSpec) -> bool {
        new.as_any()
            .downcast_ref::<MirrorSpec>()
            .is_some_and(|new| new.over == self.over)
    }

    fn apply_live(&self, device: &dyn BlockDevice, _gained: &[super::Named]) -> io::Result<()> {
        if let Some(m) = as_mirror(device) {
            m.set_resync_rate(self.resync_rate);
        }
        Ok(())
    }

    fn state(&self, device: &dyn BlockDevice) -> Vec<(&'static str, String)> {
        let Some(m) = as_mirror(device) else {
            return Vec::new();
        };
        let s = m.status();
        let mut state = vec![
            ("role", format!("{:?}", s.role).to_lowercase()),
            ("connection", format!("{:?}", s.connection).to_lowercase()),
            ("out_of_sync_bytes", s.out_of_sync_bytes.to_string()),
            ("generation", format!("{:016x}", s.generations.current)),
        ];
        if let Some(r) = s.resync {
            state.push((
                "resync",
                format!("{} of {} bytes", r.done_bytes, r.total_bytes),
            ));
        }
        if let Some(p) = s.problem {
            state.push(("problem", p));
        }
        state
    }

    fn health(&self, device: &dyn BlockDevice) -> Verdict {
        let Some(m) = as_mirror(device) else {
            return Verdict::Ok;
        };
        let s = m.status();
        if let Some(p) = s.problem {
            return Verdict::Degraded(p);
        }
        if s.inconsistent {
            return Verdict::Degraded("this replica is being resynced from the peer".into());
        }
        match (s.role, s.connection) {
            (_, Connection::Connected) => Verdict::Ok,
            (Role::Primary, _) if s.degraded => Verdict::Degraded(format!(
                "writing without the peer: {} bytes out of sync",
                s.out_of_sync_bytes
            )),
            (_, c) => Verdict::Degraded(format!("the pair is {c:?}").to_lowercase()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::MemDevice;
    use ha::link::{Link, LinkSettings, Timing};
    use std::time::Duration;

    #[test]
    fn a_mirror_opens_over_its_device_only_with_the_link_and_reports_its_state() {
        let spec = MirrorSpec {
            over: "vol0".into(),
            resync_rate: 1 << 20,
        };
        let local: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(8 << 20));
        let pools = |_: &str| -> io::Result<Arc<pool::Pool>> { Err(io::Error::other("none")) };
        let ctx = OpenContext::new("m0", false, vec![local.clone()], &pools);
        ha::pair::set_link(None);
        let Err(e) = spec.open(&ctx) else {
            panic!("opened without a link")
        };
        assert_eq!(block::classify(&e), ErrorClass::NotReady);
        assert!(e.to_string().contains("[ha]"), "{e}");

        let rt = tokio::runtime::Runtime::new().unwrap();
        let link = rt
            .block_on(Link::start(LinkSettings {
                node: "a".into(),
                peer: "b".into(),
                // Nobody listens there: the peer stays away.
                peer_address: "127.0.0.1:1".into(),
                listen: "127.0.0.1:0".parse().unwrap(),
                secret: b"0123456789abcdef".to_vec(),
                timing: Timing {
                    heartbeat_interval: Duration::from_millis(50),
                    heartbeat_timeout: Duration::from_millis(500),
                },
            }))
            .unwrap();
        ha::pair::set_link(Some(link));
        let dev = spec.open(&ctx).unwrap();
        let m = as_mirror(&*dev).unwrap();
        assert!(dev.size() < 8 << 20);
        let state = spec.state(&*dev);
        assert_eq!(state[0], ("role", "secondary".to_string()));
        assert_eq!(state[1], ("connection", "disconnected".to_string()));
        assert!(matches!(spec.health(&*dev), Verdict::Degraded(_)));
        m.promote().unwrap();
        dev.write_at(&[7; 4096], 0, false).unwrap();
        match spec.health(&*dev) {
            Verdict::Degraded(why) => assert!(why.contains("65536 bytes out of sync"), "{why}"),
            v => panic!("{v:?}"),
        }
        // Opened again over the same device (a changed setting), the
        // replica keeps what it wrote and what the peer lacks.
        drop(dev);
        let dev = spec.open(&ctx).unwrap();
        assert_eq!(as_mirror(&*dev).unwrap().status().out_of_sync_bytes, 65536);
        let mut back = [0u8; 4096];
        local.read_at(&mut back, 0).unwrap();
        assert_eq!(back, [7; 4096]);
        ha::pair::set_link(None);
    }
}
