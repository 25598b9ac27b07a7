//! Which load engine drives a target: fio's nbd engine for NBD, fio's
//! libiscsi engine for iSCSI when a fio with it is found, else the
//! built-in iSCSI initiator of this crate; the built-in NVMe/TCP host
//! (nvmf_load) for NVMe/TCP.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::iscsi_session::Session;
use crate::probe::BlockReader;
use crate::spec::{Measured, Point};
use crate::url::Target;
use crate::{fio, iscsi_load, nbd_client, nvmf_load};

#[derive(Clone, Debug)]
pub enum Engine {
    Fio {
        fio: PathBuf,
        engine: &'static str,
    },
    /// The initiator of this crate (iscsi_load), for iSCSI without fio's
    /// libiscsi engine.
    Builtin,
    /// The NVMe/TCP load generator of this crate (nvmf_load).
    Nvmf,
}

/// How one target is driven, with what it needs to know.
#[derive(Clone, Debug)]
pub struct Driver {
    pub target: Target,
    pub engine: Engine,
}

impl Driver {
    pub fn choose(target: &Target) -> Result<Driver> {
        let engine = match target {
            Target::Nbd { .. } | Target::NbdUnix { .. } => Engine::Fio {
                fio: fio::find_with_engine("nbd")
                    .context("no fio with the nbd engine (scripts/install-deps.sh installs fio)")?,
                engine: "nbd",
            },
            Target::Iscsi { .. } => match fio::find_with_engine("libiscsi") {
                Some(fio) => Engine::Fio {
                    fio,
                    engine: "libiscsi",
                },
                None => Engine::Builtin,
            },
            Target::Nvmf { .. } => Engine::Nvmf,
        };
        Ok(Driver {
            target: target.clone(),
            engine,
        })
    }

    /// As the output and the report name the engine.
    pub fn describe(&self) -> String {
        match &self.engine {
            Engine::Fio { fio, engine } => format!("fio {engine} engine ({})", fio.display()),
            Engine::Builtin => "built-in iSCSI initiator (no fio with the libiscsi engine found; \
                 bench/fio-libiscsi.sh builds one)"
                .into(),
            Engine::Nvmf => "built-in NVMe/TCP initiator (I/O queues: the jobs, or the cores \
                 when more, sharing the depth)"
                .into(),
        }
    }

    pub fn run(&self, point: Point, runtime: u64, size: Option<u64>) -> Result<Measured> {
        match &self.engine {
            Engine::Fio { fio, engine } => {
                fio::run(fio, &fio::args(&self.target, engine, point, runtime, size))
            }
            Engine::Builtin => iscsi_load::run(&self.target, point, runtime, size),
            Engine::Nvmf => nvmf_load::run(&self.target, point, runtime, size),
        }
    }

    /// A reader of the target's blocks for the guard rail.
    pub fn reader(&self) -> Result<Box<dyn BlockReader>> {
        match &self.target {
            Target::Nbd { .. } | Target::NbdUnix { .. } => {
                Ok(Box::new(nbd_client::NbdClient::connect(&self.target)?))
            }
            Target::Iscsi { .. } => Ok(Box::new(ProbeSession(Session::login(
                &self.target,
                0x7fff,
            )?))),
            Target::Nvmf { .. } => Ok(Box::new(nvmf_load::Session::connect(&self.target, 1)?)),
        }
    }
}

/// A session that logs out when the sample is read.
struct ProbeSession(Session);

impl BlockReader for ProbeSession {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>> {
        self.0.read(offset, len)
    }
}

impl Drop for ProbeSession {
    fn drop(&mut self) {
        let _ = self.0.logout();
    }
}
