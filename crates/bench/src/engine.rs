//! Which load engine drives a target: fio's nbd engine for NBD, fio's
//! libiscsi engine for iSCSI when a fio with it is found, else the
//! built-in iSCSI initiator of this crate.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::probe::BlockReader;
use crate::spec::{Measured, Point};
use crate::url::Target;
use crate::{fio, nbd_client};

#[derive(Clone, Debug)]
pub enum Engine {
    Fio { fio: PathBuf, engine: &'static str },
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
                None => bail!(
                    "no fio with the libiscsi engine: build one with bench/fio-libiscsi.sh or set OPENARRAY_FIO"
                ),
            },
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
        }
    }

    pub fn run(&self, point: Point, runtime: u64, size: Option<u64>) -> Result<Measured> {
        match &self.engine {
            Engine::Fio { fio, engine } => {
                fio::run(fio, &fio::args(&self.target, engine, point, runtime, size))
            }
        }
    }

    /// A reader of the target's blocks for the guard rail.
    pub fn reader(&self) -> Result<Box<dyn BlockReader>> {
        match &self.target {
            Target::Nbd { .. } | Target::NbdUnix { .. } => {
                Ok(Box::new(nbd_client::NbdClient::connect(&self.target)?))
            }
            Target::Iscsi { .. } => bail!("reading an iSCSI LUN's blocks is not supported yet"),
        }
    }
}
