//! `kind = "delay"`: its `over` device made slower, like dm-delay with
//! caps: a latency added to every call, and most operations and bytes a
//! second. For rehearsing a slow disk under a pool, a RAID or a cache.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use block::{BlockDevice, DelayDevice, DelayLimits};

use super::{Change, DeviceSpec, Fields, Kind, OpenContext};
use crate::render;

pub const KIND: Kind = Kind {
    name: "delay",
    fields: &["over", "latency", "iops", "bandwidth"],
    parse,
    api: None,
    files: &[],
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelaySpec {
    pub over: String,
    pub limits: DelayLimits,
}

fn parse(f: &mut Fields<'_>) -> Option<Arc<dyn DeviceSpec>> {
    f.needs("over", "the device it slows down");
    let over = f.device("over");
    let latency = f.duration("latency").unwrap_or(Duration::ZERO);
    let iops = f.count("iops").map(|n| n.min(u64::from(u32::MAX)) as u32);
    let bandwidth = f.bytes("bandwidth");
    Some(Arc::new(DelaySpec {
        over: over?,
        limits: DelayLimits {
            latency,
            iops,
            bandwidth,
        },
    }))
}

impl DeviceSpec for DelaySpec {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn children(&self) -> Vec<&str> {
        vec![&self.over]
    }

    fn open(&self, ctx: &OpenContext<'_>) -> io::Result<Arc<dyn BlockDevice>> {
        Ok(Arc::new(DelayDevice::new(ctx.child()?, self.limits)))
    }

    fn settings(&self) -> Vec<(&'static str, String)> {
        let l = &self.limits;
        vec![
            ("over", self.over.clone()),
            ("latency", render::duration(l.latency)),
            ("iops", l.iops.map_or("(no cap)".into(), |n| n.to_string())),
            (
                "bandwidth",
                l.bandwidth
                    .map_or("(no cap)".into(), |n| format!("{}/s", render::size(n))),
            ),
        ]
    }

    fn replaces_data(&self, change: &Change<'_>) -> Option<(&'static str, String)> {
        let new = change.new_as::<DelaySpec>()?;
        super::over_changed(change.name, &self.over, &new.over)
    }

    fn holds(&self) -> String {
        super::over_holds(&self.over)
    }
}
