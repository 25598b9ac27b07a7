//! Serves one device over NBD, for trying clients and measuring:
//! `serve ADDR (FILE | mem:BYTES) [NAME]`, e.g.
//! `serve 127.0.0.1:10809 /dev/shm/disk.img vm`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use block::{BlockDevice, FileDevice, FileOptions, MemDevice};
use nbd::{Export, Limits, Server};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: serve ADDR (FILE | mem:BYTES) [NAME]".into());
    }
    let addr = nbd::parse_listen(&args[1])?;
    let device: Arc<dyn BlockDevice> = match args[2].strip_prefix("mem:") {
        Some(size) => Arc::new(MemDevice::new(size.parse()?)),
        None => Arc::new(FileDevice::open(
            Path::new(&args[2]),
            FileOptions::default(),
        )?),
    };
    let name = args
        .get(3)
        .cloned()
        .unwrap_or_else(|| nbd::DEFAULT_EXPORT.to_string());
    let server = Server::new(
        BTreeMap::from([(name, Export::new(device))]),
        Limits::default(),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let serving = server.listen(&addr).await?;
        eprintln!("serving on {addr}");
        tokio::signal::ctrl_c().await?;
        server.shutdown();
        serving.await??;
        Ok(())
    })
}
