//! Peers that stall or flood, against the real daemon: one that stops
//! reading while it keeps sending, one that opens thousands of idle
//! connections, and SIGTERM while a stalled peer is connected. Each must
//! cost only its own connections: memory comes back, the session can be
//! reinstated, other initiators log in and do verified I/O, the log stays
//! quiet, and shutdown does not wait on the peer.
//!
//! The flood and stall drivers in `hostile_peers/` speak only TCP and a
//! callback, so the same scenarios can be pointed at any listener.

mod common;
mod hostile_peers {
    pub mod flood;
    pub mod stall;
}

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::iscsi::{self, op, LoginParams, Pdu, Session, FINAL, IMMEDIATE};
use common::Daemon;
use hostile_peers::flood::IdleFlood;
use hostile_peers::stall::{connect_from, stall};

const IQN: &str = "iqn.2026-11.org.test:hostile";
const INITIATOR: &str = "iqn.2026-11.org.test:stalled";
const OTHER: &str = "iqn.2026-11.org.test:other";

/// `[daemon]` settings, then one 64 MiB RAM LUN.
fn config(daemon: &str) -> String {
    common::one_ram_lun_config(daemon, "m", "64M", IQN)
}

const NOP_INTERVAL: Duration = Duration::from_secs(2);
const NOP_TIMEOUT: Duration = Duration::from_secs(2);
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);

fn params(initiator: &str) -> LoginParams {
    LoginParams::normal(initiator, IQN)
}

/// An immediate NOP-Out ping with `data`, which the target echoes.
fn ping(s: &mut Session, data: &[u8]) -> Vec<u8> {
    let mut pdu = Pdu::new(op::NOP_OUT | IMMEDIATE);
    pdu.bhs[1] = FINAL;
    let itt = s.next_itt;
    s.next_itt = s.next_itt.wrapping_add(1) % 0xffff_fff0;
    pdu.set_u32(16, itt);
    pdu.set_u32(20, 0xffff_ffff);
    pdu.set_u32(24, s.cmd_sn);
    pdu.set_u32(28, s.exp_stat_sn);
    pdu.data = data.to_vec();
    pdu.encode(s.digests)
}

/// Logs in from `source` with a tiny receive buffer and sends pings until
/// the daemon stops taking them; returns the stalled session.
fn stalled_session(addr: SocketAddr, initiator: &str) -> Session {
    let stream = connect_from(addr, source(1), Some(4096));
    let mut s = Session::login_on(stream, &params(initiator)).expect("login");
    let data = vec![0xa5; s.target_max_recv.min(256 << 10)];
    let wire = ping(&mut s, &data);
    let sent = stall(&mut s.stream, || wire.clone(), 1 << 30);
    assert!(
        sent > 4 << 20,
        "the daemon took only {sent} bytes of pings before stalling"
    );
    s
}

fn source(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// Write a pattern to LBA 0 and read it back, from `source`.
fn verified_io(addr: SocketAddr, from: IpAddr, initiator: &str) {
    let stream = connect_from(addr, from, None);
    let mut s =
        Session::login_on(stream, &params(initiator)).expect("login from the other address");
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    s.command_good(0, &iscsi::rw10_cdb(0x2a, 0, 8), &pattern, 0)
        .expect("WRITE(10)");
    let read = s
        .command_good(0, &iscsi::rw10_cdb(0x28, 0, 8), &[], 4096)
        .expect("READ(10)");
    assert_eq!(read, pattern, "read back what was written");
    s.logout().expect("logout");
}

fn wait_for_log(d: &Daemon, limit: Duration, what: impl Fn(&str) -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if d.log().lines().any(&what) {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Sessions of [`INITIATOR`] closed so far.
fn closed_count(d: &Daemon) -> usize {
    d.log()
        .lines()
        .filter(|l| l.contains("session closed") && l.contains(INITIATOR))
        .count()
}

fn metrics(addr: SocketAddr) -> String {
    let start = Instant::now();
    loop {
        if let Ok(mut s) = TcpStream::connect(addr) {
            write!(
                s,
                "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no metrics listener"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sample(text: &str, line_start: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {line_start} in\n{text}"))
}

#[test]
fn a_peer_that_stops_reading_is_dropped_and_its_memory_freed() {
    let (d, metrics_addr) = Daemon::start_with_metrics(&config(&format!(
        "nop_interval = \"{}s\"\nnop_timeout = \"{}s\"\nwrite_timeout = \"{}s\"",
        NOP_INTERVAL.as_secs(),
        NOP_TIMEOUT.as_secs(),
        WRITE_TIMEOUT.as_secs()
    )));
    let baseline = d.rss_kib().expect("daemon RSS");
    let s = stalled_session(d.addr(), INITIATOR);
    let stalled_at = Instant::now();
    let peak = d.rss_kib().expect("daemon RSS");

    let bound = NOP_INTERVAL + NOP_TIMEOUT + WRITE_TIMEOUT + Duration::from_secs(2);
    let closed = |l: &str| l.contains("session closed") && l.contains(INITIATOR);
    let took = wait_for_log(&d, bound, closed).unwrap_or_else(|| {
        panic!(
            "the stalled connection was not dropped within {bound:?}:\n{}",
            d.log()
        )
    });
    eprintln!(
        "dropped {:?} after the stall; RSS {baseline} KiB before, {peak} KiB stalled",
        took.max(stalled_at.elapsed().saturating_sub(Duration::from_secs(1)))
    );
    // At most the connection's outgoing budget (4 MiB) and buffers.
    assert!(
        peak < baseline + 16 * 1024,
        "a stalled peer pinned {} KiB",
        peak - baseline
    );

    let after = d.rss_kib().expect("daemon RSS");
    eprintln!("RSS after the drop: {after} KiB");
    assert!(
        after < baseline + 8 * 1024,
        "RSS {after} KiB after the drop, {baseline} KiB before"
    );

    // The same initiator and ISID log in again at once.
    let started = Instant::now();
    let mut again = Session::login(d.addr(), &params(INITIATOR), Duration::from_secs(5))
        .expect("reinstating login after the drop");
    assert!(started.elapsed() < Duration::from_secs(2));
    again.read_capacity(0).expect("READ CAPACITY");
    again.logout().expect("logout");
    drop(s);

    // The memory the first one took was freed: the allocator keeps it for
    // reuse, and more stalled peers, one after another, fit in it.
    for round in 0..3 {
        // Counted first: the daemon may drop the peer before it notices.
        let before = closed_count(&d);
        let s = stalled_session(d.addr(), INITIATOR);
        let rss = d.rss_kib().expect("daemon RSS");
        eprintln!("RSS with stalled peer {}: {rss} KiB", round + 2);
        assert!(
            rss < peak + 8 * 1024,
            "RSS {rss} KiB with another stalled peer, {peak} KiB with the first"
        );
        let dropped = wait_for_log(&d, bound, |_| closed_count(&d) > before);
        assert!(dropped.is_some(), "stalled peer {} not dropped", round + 2);
        drop(s);
    }

    let text = metrics(metrics_addr);
    assert!(
        sample(
            &text,
            "openarray_connections_stalled_total{transport=\"iscsi\"}"
        ) >= 1,
        "{text}"
    );
    assert!(d.log().contains("initiator stopped reading"));
}

#[test]
fn a_reinstating_login_replaces_a_stalled_session_at_once() {
    // A long write deadline: only the reinstatement can end the old one.
    let d = Daemon::start_with_config(&config("write_timeout = \"60s\"\nnop_interval = \"off\""));
    let _stalled = stalled_session(d.addr(), INITIATOR);
    let started = Instant::now();
    let mut again = Session::login(d.addr(), &params(INITIATOR), Duration::from_secs(15))
        .expect("reinstating login while the old session is stalled");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "reinstatement took {:?}",
        started.elapsed()
    );
    again.read_capacity(0).expect("READ CAPACITY");
}

#[test]
fn sigterm_ends_the_daemon_within_its_bound_despite_a_stalled_peer() {
    let d = Daemon::start_with_config(&config("write_timeout = \"60s\"\nnop_interval = \"off\""));
    let _stalled = stalled_session(d.addr(), INITIATOR);
    let started = Instant::now();
    let status = d.terminate();
    let took = started.elapsed();
    eprintln!("SIGTERM to exit: {took:?}");
    assert!(status.success(), "{status}");
    // logout_timeout (5 s) for peers, then nothing waits on them.
    assert!(took < Duration::from_secs(10), "shutdown took {took:?}");
}

#[test]
fn an_idle_flood_from_one_address_does_not_lock_out_another() {
    let (d, metrics_addr) = Daemon::start_with_metrics(&config(
        "max_logins_per_source = 16\nmax_logins = 32\nlogin_timeout = \"15s\"",
    ));
    let started = Instant::now();
    let flood = IdleFlood::open(d.addr(), source(1), 10_000);
    eprintln!(
        "{} of 10000 connections opened from {} in {:?}",
        flood.opened(),
        source(1),
        started.elapsed()
    );
    assert!(
        flood.opened() >= 9_000,
        "only {} connections opened",
        flood.opened()
    );
    // A second flooding address fills the total (32) with the first.
    let second = IdleFlood::open(d.addr(), source(3), 100);
    // The flood keeps reopening while the real initiator logs in.
    let churn = IdleFlood::churn(d.addr(), source(1), Duration::from_secs(3));
    for _ in 0..3 {
        verified_io(d.addr(), source(2), OTHER);
    }
    let churned = churn.finish();
    eprintln!("{churned} connections reopened by the flood during the logins");
    drop((flood, second));

    let text = metrics(metrics_addr);
    let refused = sample(
        &text,
        "openarray_connections_refused_total{transport=\"iscsi\",reason=\"source_logging_in\"}",
    );
    assert!(refused >= 9_000, "{refused} refusals counted");
    let evicted = sample(
        &text,
        "openarray_connections_evicted_total{transport=\"iscsi\"}",
    );
    assert!(evicted >= 1, "the logins from a third address evicted none");
    // One line per 10 s interval, not one per refusal.
    let lines = d
        .log()
        .lines()
        .filter(|l| l.contains("connection refused"))
        .count();
    eprintln!("{refused} refusals, {lines} log lines, {evicted} evicted");
    let bound = 2 + started.elapsed().as_secs() / 10;
    assert!(lines as u64 <= bound, "{lines} refusal lines in the log");
}
