//! The least an NBD server can do to serve a file: one thread per
//! connection, one `recv` for whatever requests have come, reads sent
//! straight from a shared mapping of the file, writes put in with one
//! `pwrite`, and one `writev` for the replies; no checks beyond the
//! framing, no locks, statistics or access control.
//! Nothing is flushed: the bench serves a file on tmpfs. What a client
//! does against it is about what that client, the kernel and the machine
//! allow any server, and bench/nbd.sh runs it beside the real servers as
//! that bound. It is no server to use: a bad request ends its connection.
//!
//! Between requests it polls the socket for POLL_US (a client that waits
//! for each reply is then answered by a thread that need not be woken
//! first), then sleeps in `recv`: 0 always sleeps.
//!
//! A client that asks for structured replies gets them, as it does from
//! qemu-nbd, nbdkit and openarray: a read is then answered with one data
//! chunk, whose header and offset a client such as libnbd takes in
//! receives of their own. `simple` refuses them, for what that framing
//! costs the client.
//!
//! Usage: nbd-minimal-server ADDR:PORT FILE [POLL_US [simple]]

use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
const REP_ERR_INVALID: u32 = (1 << 31) + 3;
const INFO_EXPORT: u16 = 0;

/// HAS_FLAGS, SEND_FLUSH, SEND_FUA, CAN_MULTI_CONN.
const TRANSMISSION_FLAGS: u16 = 1 | 4 | 8 | 256;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const REPLY_FLAG_DONE: u16 = 1;
const REPLY_TYPE_OFFSET_DATA: u16 = 1;
const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
const EINVAL: u32 = 22;
const EIO: u32 = 5;

const REQUEST_HEADER: usize = 28;
/// The longest reply header: a structured one and a data chunk's offset.
const REPLY_HEADER_MAX: usize = 28;
/// The largest write taken; a client is told nothing of it, so bench
/// clients stay below it (fio's 1M rows).
const MAX_PAYLOAD: usize = 32 << 20;
/// Longest option a client may send.
const MAX_OPTION: u32 = 64 << 10;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let structured = match args.get(4).map(String::as_str) {
        None => true,
        Some("simple") => false,
        Some(_) => usage(),
    };
    let (Some(addr), Some(path), None) = (args.get(1), args.get(2), args.get(5)) else {
        usage()
    };
    let poll: u64 = args
        .get(3)
        .map_or(Ok(0), |s| s.parse())
        .unwrap_or_else(|e| {
            eprintln!("nbd-minimal-server: POLL_US {:?}: {e}", args[3]);
            std::process::exit(2)
        });
    let file = File::options()
        .read(true)
        .write(true)
        .open(path)
        .and_then(|f| Mapped::new(f).map(|m| &*Box::leak(Box::new(m))));
    let file = file.unwrap_or_else(|e| {
        eprintln!("nbd-minimal-server: {path}: {e}");
        std::process::exit(1)
    });
    let listener = TcpListener::bind(addr).unwrap_or_else(|e| {
        eprintln!("nbd-minimal-server: {addr}: {e}");
        std::process::exit(1)
    });
    let poll = Duration::from_micros(poll);
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            // A client that leaves or misbehaves just ends its thread.
            let _ = serve(stream, file, poll, structured);
        });
    }
}

fn usage() -> ! {
    eprintln!("usage: nbd-minimal-server ADDR:PORT FILE [POLL_US [simple]]");
    std::process::exit(2);
}

/// The file and a shared mapping of all of it.
struct Mapped {
    file: File,
    at: *const u8,
    len: u64,
}

// SAFETY: the mapping lives as long as the process and is only read here;
// the kernel keeps it coherent with `pwrite`.
unsafe impl Sync for Mapped {}

impl Mapped {
    fn new(file: File) -> io::Result<Mapped> {
        let len = file.metadata()?.len();
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty file"));
        }
        // SAFETY: a new shared read-only mapping of the whole file.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapped {
            file,
            at: at.cast(),
            len,
        })
    }

    /// The bytes at `offset`, if all inside the file.
    fn bytes(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len as u64)?;
        // SAFETY: inside the mapping, which is never unmapped.
        (end <= self.len)
            .then(|| unsafe { std::slice::from_raw_parts(self.at.add(offset as usize), len) })
    }
}

fn serve(mut s: TcpStream, file: &Mapped, poll: Duration, offer: bool) -> io::Result<()> {
    s.set_nodelay(true)?;
    if let Some(structured) = handshake(&mut s, file.len, offer)? {
        transmit(&mut s, file, poll, structured)?;
    }
    Ok(())
}

/// Fixed newstyle negotiation, offering structured replies or not; once
/// the client moved on to transmission, whether they are in use.
fn handshake(s: &mut TcpStream, size: u64, offer: bool) -> io::Result<Option<bool>> {
    let mut structured = false;
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&hello)?;
    let client_flags = u32::from_be_bytes(read_array(s)?);
    loop {
        let head: [u8; 16] = read_array(s)?;
        let option = u32::from_be_bytes(head[8..12].try_into().unwrap());
        let len = u32::from_be_bytes(head[12..16].try_into().unwrap());
        if u64::from_be_bytes(head[..8].try_into().unwrap()) != IHAVEOPT || len > MAX_OPTION {
            return Ok(None);
        }
        let mut data = vec![0; len as usize];
        s.read_exact(&mut data)?;
        match option {
            OPT_EXPORT_NAME => {
                let mut reply = size.to_be_bytes().to_vec();
                reply.extend_from_slice(&TRANSMISSION_FLAGS.to_be_bytes());
                if client_flags & u32::from(FLAG_NO_ZEROES) == 0 {
                    reply.extend_from_slice(&[0; 124]);
                }
                s.write_all(&reply)?;
                return Ok(Some(structured));
            }
            OPT_INFO | OPT_GO => {
                let mut info = INFO_EXPORT.to_be_bytes().to_vec();
                info.extend_from_slice(&size.to_be_bytes());
                info.extend_from_slice(&TRANSMISSION_FLAGS.to_be_bytes());
                option_reply(s, option, REP_INFO, &info)?;
                option_reply(s, option, REP_ACK, &[])?;
                if option == OPT_GO {
                    return Ok(Some(structured));
                }
            }
            OPT_STRUCTURED_REPLY if offer && data.is_empty() => {
                structured = true;
                option_reply(s, option, REP_ACK, &[])?;
            }
            OPT_STRUCTURED_REPLY if offer => option_reply(s, option, REP_ERR_INVALID, &[])?,
            OPT_ABORT => {
                option_reply(s, option, REP_ACK, &[])?;
                return Ok(None);
            }
            _ => option_reply(s, option, REP_ERR_UNSUP, &[])?,
        }
    }
}

fn option_reply(s: &mut TcpStream, option: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    let mut r = OPTION_REPLY_MAGIC.to_be_bytes().to_vec();
    r.extend_from_slice(&option.to_be_bytes());
    r.extend_from_slice(&kind.to_be_bytes());
    r.extend_from_slice(&(data.len() as u32).to_be_bytes());
    r.extend_from_slice(data);
    s.write_all(&r)
}

fn read_array<const N: usize>(s: &mut TcpStream) -> io::Result<[u8; N]> {
    let mut b = [0; N];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// Answers requests until the client disconnects.
fn transmit(s: &mut TcpStream, file: &Mapped, poll: Duration, structured: bool) -> io::Result<()> {
    let mut input = vec![0u8; MAX_PAYLOAD + (1 << 20)];
    let mut have = 0;
    // Each reply's header, its length, and the file's bytes that follow it.
    let mut replies: Vec<([u8; REPLY_HEADER_MAX], usize, &[u8])> = Vec::new();
    let mut last_request = Instant::now();
    loop {
        let got = receive(s, &mut input[have..], last_request, poll)?;
        if got == 0 {
            return Ok(());
        }
        last_request = Instant::now();
        have += got;
        replies.clear();
        let mut at = 0;
        while have - at >= REQUEST_HEADER {
            let r = &input[at..at + REQUEST_HEADER];
            let kind = u16::from_be_bytes(r[6..8].try_into().unwrap());
            let offset = u64::from_be_bytes(r[16..24].try_into().unwrap());
            let len = u32::from_be_bytes(r[24..28].try_into().unwrap()) as usize;
            if u32::from_be_bytes(r[..4].try_into().unwrap()) != REQUEST_MAGIC || len > MAX_PAYLOAD
            {
                return Ok(());
            }
            let payload = if kind == CMD_WRITE { len } else { 0 };
            if have - at < REQUEST_HEADER + payload {
                break;
            }
            let cookie: [u8; 8] = r[8..16].try_into().unwrap();
            let mut data: &[u8] = &[];
            let error = match kind {
                CMD_DISC => return Ok(()),
                CMD_READ => match file.bytes(offset, len) {
                    Some(bytes) => {
                        data = bytes;
                        0
                    }
                    None => EINVAL,
                },
                CMD_WRITE => {
                    let from = &input[at + REQUEST_HEADER..at + REQUEST_HEADER + len];
                    match file.file.write_all_at(from, offset) {
                        Ok(()) => 0,
                        Err(_) => EIO,
                    }
                }
                CMD_FLUSH => 0,
                _ => EINVAL,
            };
            let (header, header_len) = if structured && kind == CMD_READ {
                read_chunk(cookie, offset, data.len(), error)
            } else {
                simple_reply(cookie, error)
            };
            replies.push((header, header_len, data));
            at += REQUEST_HEADER + payload;
        }
        input.copy_within(at..have, 0);
        have -= at;
        let mut slices = Vec::with_capacity(replies.len() * 2);
        for (header, len, data) in &replies {
            slices.push(IoSlice::new(&header[..*len]));
            if !data.is_empty() {
                slices.push(IoSlice::new(data));
            }
        }
        write_all_vectored(s, &mut slices)?;
    }
}

/// A simple reply's header, and its length.
fn simple_reply(cookie: [u8; 8], error: u32) -> ([u8; REPLY_HEADER_MAX], usize) {
    let mut h = [0u8; REPLY_HEADER_MAX];
    h[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&error.to_be_bytes());
    h[8..16].copy_from_slice(&cookie);
    (h, 16)
}

/// The structured reply to a read: one final data chunk's header and
/// offset, before its `len` bytes (none for none); or, failed, an error
/// chunk without a message. Returns the header and its length.
fn read_chunk(
    cookie: [u8; 8],
    offset: u64,
    len: usize,
    error: u32,
) -> ([u8; REPLY_HEADER_MAX], usize) {
    let mut h = [0u8; REPLY_HEADER_MAX];
    h[..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
    h[8..16].copy_from_slice(&cookie);
    if error == 0 && len == 0 {
        // (A data chunk holds at least one byte.)
        (h, 20)
    } else if error == 0 {
        h[6..8].copy_from_slice(&REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        h[16..20].copy_from_slice(&(8 + len as u32).to_be_bytes());
        h[20..28].copy_from_slice(&offset.to_be_bytes());
        (h, 28)
    } else {
        // The error, and a message of no bytes.
        h[6..8].copy_from_slice(&REPLY_TYPE_ERROR.to_be_bytes());
        h[16..20].copy_from_slice(&6u32.to_be_bytes());
        h[20..24].copy_from_slice(&error.to_be_bytes());
        (h, 26)
    }
}

/// One `recv` of what has come: polling without sleeping while the last
/// request is less than `poll` old, then sleeping in `recv`.
fn receive(s: &mut TcpStream, buf: &mut [u8], last: Instant, poll: Duration) -> io::Result<usize> {
    while last.elapsed() < poll {
        // SAFETY: `buf` is writable memory of `buf.len()` bytes.
        let got = unsafe {
            libc::recv(
                s.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if got >= 0 {
            return Ok(got as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::WouldBlock {
            return Err(e);
        }
        std::thread::yield_now();
    }
    s.read(buf)
}

fn write_all_vectored(s: &mut TcpStream, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !slices.is_empty() {
        let n = s.write_vectored(slices)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}
