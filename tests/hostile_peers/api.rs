//! Callers of the TCP administration API: ones that guess the token, and
//! ones that open connections and send nothing.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};

use super::stall::connect_from;

/// `GET path` from `source` with these `Authorization` header values: the
/// status, or 0 when the connection was closed without an answer.
pub fn get(addr: SocketAddr, source: IpAddr, path: &str, authorization: &[&str]) -> u16 {
    let mut s = connect_from(addr, source, None);
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    for value in authorization {
        head.push_str(&format!("Authorization: {value}\r\n"));
    }
    head.push_str("\r\n");
    if s.write_all(head.as_bytes()).is_err() {
        return 0;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}
