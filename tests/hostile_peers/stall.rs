//! A peer that stops reading: it connects with a tiny receive buffer and
//! keeps sending requests whose answers pile up in the listener.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use socket2::{Domain, Socket, Type};

/// A TCP connection to `addr` from `source` (any loopback address works),
/// with a receive buffer of `recv_buffer` bytes when given.
pub fn connect_from(addr: SocketAddr, source: IpAddr, recv_buffer: Option<usize>) -> TcpStream {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    if let Some(size) = recv_buffer {
        // Before connect, so the window announced is small from the start.
        socket.set_recv_buffer_size(size).expect("SO_RCVBUF");
    }
    socket
        .bind(&SocketAddr::new(source, 0).into())
        .expect("bind the source address");
    socket
        .connect_timeout(&addr.into(), Duration::from_secs(5))
        .expect("connect");
    let stream: TcpStream = socket.into();
    stream.set_nodelay(true).expect("nodelay");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    stream
}

/// Send `request()` over and over without reading, until the listener
/// stops taking bytes for a second or `limit` bytes went out; returns the
/// bytes sent.
pub fn stall(stream: &mut TcpStream, request: impl Fn() -> Vec<u8>, limit: usize) -> usize {
    stream
        .set_write_timeout(Some(Duration::from_secs(1)))
        .expect("write timeout");
    let mut sent = 0;
    while sent < limit {
        let bytes = request();
        if stream.write_all(&bytes).is_err() {
            break;
        }
        sent += bytes.len();
    }
    sent
}
