//! A minimal blocking NBD client speaking raw bytes: for extended headers
//! (which the installed libnbd predates), exact replies, and hostile input.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use nbd::proto::*;

pub struct Raw {
    pub s: TcpStream,
    pub structured: bool,
    pub extended: bool,
    pub size: u64,
    pub flags: u16,
}

/// One reply message: a simple reply, or one structured/extended chunk.
#[derive(Debug)]
pub enum Reply {
    Simple {
        error: u32,
        cookie: u64,
        data: Vec<u8>,
    },
    Chunk {
        flags: u16,
        kind: u16,
        cookie: u64,
        offset: u64,
        payload: Vec<u8>,
    },
}

impl Reply {
    pub fn cookie(&self) -> u64 {
        match self {
            Reply::Simple { cookie, .. } | Reply::Chunk { cookie, .. } => *cookie,
        }
    }

    pub fn done(&self) -> bool {
        match self {
            Reply::Simple { .. } => true,
            Reply::Chunk { flags, .. } => flags & REPLY_FLAG_DONE != 0,
        }
    }

    /// The error of a simple reply or an error chunk, 0 otherwise.
    pub fn error(&self) -> u32 {
        match self {
            Reply::Simple { error, .. } => *error,
            Reply::Chunk { kind, payload, .. } if kind & 0x8000 != 0 => {
                u32::from_be_bytes(payload[..4].try_into().unwrap())
            }
            _ => 0,
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

pub fn string(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

impl Raw {
    /// Connects and reads the greeting.
    pub fn connect(addr: SocketAddr) -> std::io::Result<Raw> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut greeting = [0; 18];
        s.read_exact(&mut greeting)?;
        assert_eq!(u64_at(&greeting, 0), NBDMAGIC);
        assert_eq!(u64_at(&greeting, 8), IHAVEOPT);
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())?;
        Ok(Raw {
            s,
            structured: false,
            extended: false,
            size: 0,
            flags: 0,
        })
    }

    pub fn send_option(&mut self, opt: u32, data: &[u8]) -> std::io::Result<()> {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b)
    }

    /// One option reply: its type and data.
    pub fn option_reply(&mut self) -> std::io::Result<(u32, Vec<u8>)> {
        let mut h = [0; 20];
        self.s.read_exact(&mut h)?;
        assert_eq!(u64_at(&h, 0), OPTION_REPLY_MAGIC);
        let mut data = vec![0; u32_at(&h, 16) as usize];
        self.s.read_exact(&mut data)?;
        Ok((u32_at(&h, 12), data))
    }

    /// Sends an option and collects its replies up to the final one.
    pub fn option(&mut self, opt: u32, data: &[u8]) -> std::io::Result<Vec<(u32, Vec<u8>)>> {
        self.send_option(opt, data)?;
        let mut all = Vec::new();
        loop {
            let r = self.option_reply()?;
            let last = r.0 == REP_ACK || r.0 & (1 << 31) != 0;
            all.push(r);
            if last {
                return Ok(all);
            }
        }
    }

    /// Negotiates what is asked and enters transmission on `export`;
    /// `Err` is the error reply type of NBD_OPT_GO.
    pub fn go(
        &mut self,
        export: &str,
        structured: bool,
        extended: bool,
        meta: bool,
    ) -> Result<(), u32> {
        if extended {
            let r = self.option(OPT_EXTENDED_HEADERS, &[]).unwrap();
            assert_eq!(r.last().unwrap().0, REP_ACK);
            self.extended = true;
            self.structured = true;
        } else if structured {
            let r = self.option(OPT_STRUCTURED_REPLY, &[]).unwrap();
            assert_eq!(r.last().unwrap().0, REP_ACK);
            self.structured = true;
        }
        if meta {
            let mut d = string(export);
            d.extend_from_slice(&1u32.to_be_bytes());
            d.extend_from_slice(&string(BASE_ALLOCATION));
            let r = self.option(OPT_SET_META_CONTEXT, &d).unwrap();
            assert_eq!(r.len(), 2, "{r:?}");
            assert_eq!(r[0].0, REP_META_CONTEXT);
        }
        let mut d = string(export);
        d.extend_from_slice(&1u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        for (kind, data) in self.option(OPT_GO, &d).unwrap() {
            if kind & (1 << 31) != 0 {
                return Err(kind);
            }
            if kind == REP_INFO && u16_at(&data, 0) == INFO_EXPORT {
                self.size = u64_at(&data, 2);
                self.flags = u16_at(&data, 10);
            }
        }
        Ok(())
    }

    pub fn request(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        len: u64,
        payload: &[u8],
    ) {
        let mut b = Vec::with_capacity(32 + payload.len());
        if self.extended {
            b.extend_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
        } else {
            b.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        }
        let flags = if self.extended && !payload.is_empty() {
            flags | CMD_FLAG_PAYLOAD_LEN
        } else {
            flags
        };
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        if self.extended {
            b.extend_from_slice(&len.to_be_bytes());
        } else {
            b.extend_from_slice(&(len as u32).to_be_bytes());
        }
        b.extend_from_slice(payload);
        self.s.write_all(&b).unwrap();
    }

    /// Reads one reply message; `simple_data` is the data a successful
    /// simple reply carries (a read's length).
    pub fn reply(&mut self, simple_data: usize) -> std::io::Result<Reply> {
        let mut magic = [0; 4];
        self.s.read_exact(&mut magic)?;
        let magic = u32::from_be_bytes(magic);
        match magic {
            SIMPLE_REPLY_MAGIC => {
                let mut h = [0; 12];
                self.s.read_exact(&mut h)?;
                let error = u32_at(&h, 0);
                let mut data = vec![0; if error == 0 { simple_data } else { 0 }];
                self.s.read_exact(&mut data)?;
                Ok(Reply::Simple {
                    error,
                    cookie: u64_at(&h, 4),
                    data,
                })
            }
            STRUCTURED_REPLY_MAGIC | EXTENDED_REPLY_MAGIC => {
                let ext = magic == EXTENDED_REPLY_MAGIC;
                assert_eq!(
                    ext, self.extended,
                    "reply framing differs from the negotiated one"
                );
                let mut h = vec![0; if ext { 28 } else { 16 }];
                self.s.read_exact(&mut h)?;
                let (offset, len) = if ext {
                    (u64_at(&h, 12), u64_at(&h, 20))
                } else {
                    (0, u32_at(&h, 12) as u64)
                };
                let mut payload = vec![0; len as usize];
                self.s.read_exact(&mut payload)?;
                Ok(Reply::Chunk {
                    flags: u16_at(&h, 0),
                    kind: u16_at(&h, 2),
                    cookie: u64_at(&h, 4),
                    offset,
                    payload,
                })
            }
            m => panic!("bad reply magic {m:#x}"),
        }
    }

    /// Reads the chunks of one reply until its final one.
    pub fn whole_reply(&mut self) -> Vec<Reply> {
        let mut all = Vec::new();
        loop {
            let r = self.reply(0).unwrap();
            let done = r.done();
            all.push(r);
            if done {
                return all;
            }
        }
    }

    /// Reads `len` bytes at `offset` through a structured read, holes
    /// filled with zeros; errors as the error value.
    pub fn read(&mut self, cookie: u64, offset: u64, len: usize) -> Result<Vec<u8>, u32> {
        self.request(CMD_READ, 0, cookie, offset, len as u64, &[]);
        if !self.structured {
            let r = self.reply(len).unwrap();
            return match r {
                Reply::Simple { error: 0, data, .. } => Ok(data),
                r => Err(r.error()),
            };
        }
        let mut out = vec![0xEE; len];
        for r in self.whole_reply() {
            let Reply::Chunk {
                kind,
                payload,
                cookie: c,
                ..
            } = &r
            else {
                panic!("simple reply to a structured read")
            };
            assert_eq!(*c, cookie);
            match *kind {
                REPLY_TYPE_OFFSET_DATA => {
                    let at = (u64_at(payload, 0) - offset) as usize;
                    out[at..at + payload.len() - 8].copy_from_slice(&payload[8..]);
                }
                REPLY_TYPE_OFFSET_HOLE => {
                    let at = (u64_at(payload, 0) - offset) as usize;
                    let n = u32_at(payload, 8) as usize;
                    out[at..at + n].fill(0);
                }
                REPLY_TYPE_NONE => {}
                _ => return Err(r.error()),
            }
        }
        Ok(out)
    }

    /// A command answered by one reply without data: its error value.
    pub fn command(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        len: u64,
        payload: &[u8],
    ) -> u32 {
        self.request(kind, flags, cookie, offset, len, payload);
        let r = if self.structured {
            self.whole_reply().pop().unwrap()
        } else {
            self.reply(0).unwrap()
        };
        assert_eq!(r.cookie(), cookie);
        r.error()
    }

    /// `base:allocation` extents as (length, flags).
    pub fn block_status(&mut self, cookie: u64, offset: u64, len: u64) -> Vec<(u64, u32)> {
        self.request(CMD_BLOCK_STATUS, 0, cookie, offset, len, &[]);
        let replies = self.whole_reply();
        let Reply::Chunk { kind, payload, .. } = &replies[0] else {
            panic!()
        };
        let mut out = Vec::new();
        if self.extended {
            assert_eq!(*kind, REPLY_TYPE_BLOCK_STATUS_EXT);
            let count = u32_at(payload, 4) as usize;
            assert_eq!(payload.len(), 8 + count * 16);
            for i in 0..count {
                let at = 8 + i * 16;
                let status = u64_at(payload, at + 8);
                assert!(status >> 32 == 0);
                out.push((u64_at(payload, at), status as u32));
            }
        } else {
            assert_eq!(*kind, REPLY_TYPE_BLOCK_STATUS, "{replies:?}");
            for d in payload[4..].chunks(8) {
                out.push((u32_at(d, 0) as u64, u32_at(d, 4)));
            }
        }
        out
    }
}
