//! Just enough of an NBD client to learn an export's size and read a few
//! blocks of it: the fixed-newstyle handshake, NBD_OPT_GO and simple
//! replies (structured replies are never asked for).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::url::Target;

const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const FLAG_FIXED_NEWSTYLE: u32 = 1;
const FLAG_NO_ZEROES: u32 = 2;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const INFO_EXPORT: u16 = 0;
const CMD_READ: u16 = 0;
const CMD_DISC: u16 = 2;

trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

pub struct NbdClient {
    stream: Box<dyn Stream>,
    size: u64,
    handle: u64,
}

impl NbdClient {
    pub fn connect(target: &Target) -> Result<NbdClient> {
        let timeout = Some(Duration::from_secs(30));
        let (stream, export): (Box<dyn Stream>, &str) = match target {
            Target::Nbd { export, .. } => {
                let addr = target.addr().expect("TCP target");
                let s = TcpStream::connect(&addr).with_context(|| format!("connect {addr}"))?;
                s.set_read_timeout(timeout)?;
                (Box::new(s), export)
            }
            Target::NbdUnix { socket, export } => {
                let s = UnixStream::connect(socket).with_context(|| format!("connect {socket}"))?;
                s.set_read_timeout(timeout)?;
                (Box::new(s), export)
            }
            Target::Iscsi { .. } | Target::Nvmf { .. } => bail!("{target} is not an NBD URL"),
        };
        let mut client = NbdClient {
            stream,
            size: 0,
            handle: 0,
        };
        client
            .handshake(export)
            .with_context(|| format!("NBD handshake with {target}"))?;
        Ok(client)
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    fn handshake(&mut self, export: &str) -> Result<()> {
        let mut hello = [0u8; 18];
        self.stream.read_exact(&mut hello)?;
        if &hello[..8] != b"NBDMAGIC" || u64::from_be_bytes(hello[8..16].try_into()?) != IHAVEOPT {
            bail!("not a newstyle NBD server");
        }
        let server_flags = u16::from_be_bytes([hello[16], hello[17]]);
        if server_flags as u32 & FLAG_FIXED_NEWSTYLE == 0 {
            bail!("the server does not speak fixed newstyle");
        }
        let flags = FLAG_FIXED_NEWSTYLE | (server_flags as u32 & FLAG_NO_ZEROES);
        let mut msg = flags.to_be_bytes().to_vec();
        let mut data = (export.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(export.as_bytes());
        data.extend_from_slice(&0u16.to_be_bytes());
        msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
        msg.extend_from_slice(&OPT_GO.to_be_bytes());
        msg.extend_from_slice(&(data.len() as u32).to_be_bytes());
        msg.extend_from_slice(&data);
        self.stream.write_all(&msg)?;
        loop {
            let mut head = [0u8; 20];
            self.stream.read_exact(&mut head)?;
            let magic = u64::from_be_bytes(head[..8].try_into()?);
            let kind = u32::from_be_bytes(head[12..16].try_into()?);
            let len = u32::from_be_bytes(head[16..20].try_into()?) as usize;
            if magic != OPT_REPLY_MAGIC || len > 1 << 20 {
                bail!("bad option reply");
            }
            let mut body = vec![0u8; len];
            self.stream.read_exact(&mut body)?;
            match kind {
                REP_ACK => break,
                REP_INFO
                    if body.len() >= 10
                        && u16::from_be_bytes([body[0], body[1]]) == INFO_EXPORT =>
                {
                    self.size = u64::from_be_bytes(body[2..10].try_into()?);
                }
                REP_INFO => {}
                err if err & 0x8000_0000 != 0 => bail!(
                    "the server refused export `{export}`: {}",
                    String::from_utf8_lossy(&body)
                ),
                _ => {}
            }
        }
        if self.size == 0 {
            bail!("export `{export}` has no size");
        }
        Ok(())
    }

    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>> {
        self.handle += 1;
        self.request(CMD_READ, offset, len)?;
        let mut head = [0u8; 16];
        self.stream.read_exact(&mut head)?;
        let magic = u32::from_be_bytes(head[..4].try_into()?);
        let error = u32::from_be_bytes(head[4..8].try_into()?);
        if magic != SIMPLE_REPLY_MAGIC || u64::from_be_bytes(head[8..].try_into()?) != self.handle {
            bail!("bad NBD reply");
        }
        if error != 0 {
            bail!("NBD read at {offset} failed with error {error}");
        }
        let mut data = vec![0u8; len as usize];
        self.stream.read_exact(&mut data)?;
        Ok(data)
    }

    fn request(&mut self, kind: u16, offset: u64, len: u32) -> Result<()> {
        let mut req = Vec::with_capacity(28);
        req.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        req.extend_from_slice(&0u16.to_be_bytes());
        req.extend_from_slice(&kind.to_be_bytes());
        req.extend_from_slice(&self.handle.to_be_bytes());
        req.extend_from_slice(&offset.to_be_bytes());
        req.extend_from_slice(&len.to_be_bytes());
        self.stream.write_all(&req)?;
        Ok(())
    }
}

impl Drop for NbdClient {
    fn drop(&mut self) {
        let _ = self.request(CMD_DISC, 0, 0);
    }
}
