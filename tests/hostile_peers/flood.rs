//! A peer that opens connections and never speaks.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

/// Idle connections held open from one source address.
pub struct IdleFlood {
    held: Vec<TcpStream>,
}

/// Raise this process's descriptor limit to its hard limit: a flood needs
/// more than the usual soft 1024.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid, owned struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn connect_idle(addr: SocketAddr, source: IpAddr) -> Option<TcpStream> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).ok()?;
    socket.bind(&SocketAddr::new(source, 0).into()).ok()?;
    socket
        .connect_timeout(&addr.into(), Duration::from_secs(2))
        .ok()?;
    Some(socket.into())
}

impl IdleFlood {
    /// Open `count` connections from `source`, keeping those that connect.
    pub fn open(addr: SocketAddr, source: IpAddr, count: usize) -> IdleFlood {
        raise_fd_limit();
        let held = (0..count)
            .filter_map(|_| connect_idle(addr, source))
            .collect();
        IdleFlood { held }
    }

    pub fn opened(&self) -> usize {
        self.held.len()
    }

    /// Connections the listener has not closed.
    pub fn still_open(&self) -> usize {
        self.held
            .iter()
            .filter(|s| {
                s.set_nonblocking(true).expect("nonblocking");
                let mut byte = [0; 1];
                let open = matches!(s.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
                s.set_nonblocking(false).expect("blocking");
                open
            })
            .count()
    }

    /// Keep opening connections from `source` in the background for
    /// `duration`, holding the newest 64.
    pub fn churn(addr: SocketAddr, source: IpAddr, duration: Duration) -> Churn {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut held = std::collections::VecDeque::new();
            let mut opened = 0;
            while start.elapsed() < duration && !flag.load(Ordering::Relaxed) {
                if let Some(s) = connect_idle(addr, source) {
                    opened += 1;
                    held.push_back(s);
                    if held.len() > 64 {
                        held.pop_front();
                    }
                }
            }
            opened
        });
        Churn { stop, thread }
    }
}

/// A background flood started by [`IdleFlood::churn`].
pub struct Churn {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<usize>,
}

impl Churn {
    /// Stop it; returns how many connections it opened.
    pub fn finish(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("flood thread")
    }
}
