//! Just enough of an NBD client to be a hostile one: the fixed-newstyle
//! handshake up to NBD_OPT_GO, and simple requests.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};

use nbd::proto::{
    CMD_READ, CMD_WRITE, FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES, IHAVEOPT, OPTION_REPLY_MAGIC,
    OPT_GO, REP_ACK, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC,
};

use super::stall::connect_from;

/// NBD_OPT_GO for `export` on `s`: `Ok` once in transmission, `Err` with
/// the error reply's type, or 0 when the server closed the connection.
pub fn go(s: &mut TcpStream, export: &str) -> Result<(), u32> {
    let mut greeting = [0; 18];
    s.read_exact(&mut greeting).map_err(|_| 0u32)?;
    let flags = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;
    s.write_all(&flags.to_be_bytes()).map_err(|_| 0u32)?;
    let mut data = (export.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(export.as_bytes());
    data.extend_from_slice(&0u16.to_be_bytes());
    let mut opt = IHAVEOPT.to_be_bytes().to_vec();
    opt.extend_from_slice(&OPT_GO.to_be_bytes());
    opt.extend_from_slice(&(data.len() as u32).to_be_bytes());
    opt.extend_from_slice(&data);
    s.write_all(&opt).map_err(|_| 0u32)?;
    loop {
        let mut h = [0; 20];
        s.read_exact(&mut h).map_err(|_| 0u32)?;
        assert_eq!(
            u64::from_be_bytes(h[..8].try_into().unwrap()),
            OPTION_REPLY_MAGIC
        );
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        let mut body = vec![0; len as usize];
        s.read_exact(&mut body).map_err(|_| 0u32)?;
        if kind == REP_ACK {
            return Ok(());
        }
        if kind & (1 << 31) != 0 {
            return Err(kind);
        }
    }
}

/// A connection from `source` in transmission on `export`, or `None` if
/// the server would not have it.
pub fn connect_go(addr: SocketAddr, source: IpAddr, export: &str) -> Option<TcpStream> {
    let mut s = connect_from(addr, source, None);
    go(&mut s, export).ok().map(|()| s)
}

/// A simple request's bytes.
pub fn request(cmd: u16, cookie: u64, offset: u64, len: u32, data: &[u8]) -> Vec<u8> {
    let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&0u16.to_be_bytes());
    b.extend_from_slice(&cmd.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// Sends a request and reads its simple reply: the error and the data.
pub fn exchange(
    s: &mut TcpStream,
    cmd: u16,
    offset: u64,
    data: &[u8],
    read: u32,
) -> (u32, Vec<u8>) {
    let len = if cmd == CMD_WRITE {
        data.len() as u32
    } else {
        read
    };
    s.write_all(&request(cmd, 7, offset, len, data)).unwrap();
    let mut h = [0; 16];
    s.read_exact(&mut h).unwrap();
    assert_eq!(
        u32::from_be_bytes(h[..4].try_into().unwrap()),
        SIMPLE_REPLY_MAGIC
    );
    let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
    let mut body = vec![
        0;
        if error == 0 && cmd == CMD_READ {
            read as usize
        } else {
            0
        }
    ];
    s.read_exact(&mut body).unwrap();
    (error, body)
}

/// Write a pattern at offset 0 of `export` and read it back, from `source`.
pub fn verified_io(addr: SocketAddr, source: IpAddr, export: &str) {
    let mut s = connect_go(addr, source, export).expect("NBD_OPT_GO from the other address");
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 5) as u8).collect();
    assert_eq!(exchange(&mut s, CMD_WRITE, 0, &pattern, 0).0, 0, "write");
    let (error, read) = exchange(&mut s, CMD_READ, 0, &[], 4096);
    assert_eq!(error, 0, "read");
    assert_eq!(read, pattern, "read back what was written");
}
