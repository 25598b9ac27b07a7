//! The bench's bound must serve the rows it is a bound for: fio's nbd
//! engine writes and reads back verified, and nbdcopy reads the file's
//! bytes as they are.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The server on a free port serving `file`, polling `poll_us`, with
/// the arguments `more` after that.
fn start(file: &std::path::Path, poll_us: u32, more: &[&str]) -> (Server, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_nbd-minimal-server"))
        .arg(format!("127.0.0.1:{port}"))
        .arg(file)
        .arg(poll_us.to_string())
        .args(more)
        .spawn()
        .expect("start nbd-minimal-server");
    let server = Server(child);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let start = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "server never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (server, format!("nbd://127.0.0.1:{port}/d"))
}

#[test]
fn fio_writes_read_back_verified_and_nbdcopy_reads_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk.img");
    let bytes: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &bytes).unwrap();
    for (poll_us, more) in [(0, &[][..]), (50, &[][..]), (0, &["simple"][..])] {
        let (_server, uri) = start(&file, poll_us, more);
        let structured = !more.contains(&"simple");
        let info = client_tools::run("nbdinfo", &["--json", &uri]);
        let info = String::from_utf8_lossy(&info.stdout);
        assert!(
            info.contains(&format!("\"structured\": {structured}")),
            "structured replies {structured} expected: {info}"
        );
        let copy = dir.path().join("copy.img");
        client_tools::run("nbdcopy", &[&uri, copy.to_str().unwrap()]);
        assert!(
            std::fs::read(&copy).unwrap() == std::fs::read(&file).unwrap(),
            "nbdcopy read other bytes"
        );
        assert_eq!(client_tools::fio_verified_writes(&uri, "4M", 8), 4096);
    }
    assert!(
        std::fs::read(&file).unwrap() != bytes,
        "fio's writes never reached the file"
    );
}
