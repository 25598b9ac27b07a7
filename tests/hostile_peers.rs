//! Peers that stall or flood, against the real daemon and each of its
//! listeners (iSCSI, NBD, NVMe/TCP, the TCP administration API): one that stops
//! reading while it keeps sending, one that opens thousands of idle
//! connections, one that guesses the API token, and SIGTERM while stalled
//! peers are connected everywhere. Each must cost only its own
//! connections: memory comes back, the session can be reinstated, other
//! clients connect and do verified I/O, the log stays quiet, and shutdown
//! does not wait on the peer.
//!
//! The flood and stall drivers in `hostile_peers/` speak only TCP and a
//! callback; `nbd`, `nvmf` and `api` add the few protocol bytes each
//! listener needs before a peer can misbehave.

mod common;
mod hostile_peers {
    pub mod api;
    pub mod flood;
    pub mod nbd;
    pub mod nvmf;
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

/// Lines of the daemon's log that contain `needle`.
fn log_lines(d: &Daemon, needle: &str) -> usize {
    d.log().lines().filter(|l| l.contains(needle)).count()
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
fn sigterm_ends_the_daemon_in_5s_despite_stalled_peers_on_every_listener() {
    let all = all_listeners("write_timeout = \"60s\"\nnop_interval = \"off\"");
    let _iscsi = stalled_session(all.d.addr(), INITIATOR);
    let _nbd = nbd_stall(all.nbd);
    let _nvmf = nvmf_stall(all.nvmf);
    // Half a request head, then nothing.
    let mut api = connect_from(all.api, source(1), Some(4096));
    api.write_all(b"GET /v1/status HTTP/1.1\r\nHost:").unwrap();
    let started = Instant::now();
    let status = all.d.terminate();
    let took = started.elapsed();
    eprintln!("SIGTERM to exit: {took:?}");
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
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
    let lines = log_lines(&d, "connection refused");
    eprintln!("{refused} refusals, {lines} log lines, {evicted} evicted");
    let bound = 2 + started.elapsed().as_secs() / 10;
    assert!(lines as u64 <= bound, "{lines} refusal lines in the log");
}

const TOKEN: &str = "t0ken-of-the-hostile-peers-0123456789";

/// A daemon on every listener: the iSCSI portal (one RAM LUN), NBD with
/// a file export `f` and an export `hidden` no loopback client may use,
/// NVMe/TCP with `f` as namespace 1, the TCP API, and metrics.
struct AllListeners {
    d: Daemon,
    metrics: SocketAddr,
    nbd: SocketAddr,
    nvmf: SocketAddr,
    api: SocketAddr,
    _dir: tempfile::TempDir,
}

fn all_listeners(daemon: &str) -> AllListeners {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("api.token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token file");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let (nbd, api) = (loopback(common::free_port()), loopback(common::free_port()));
    let nvmf = loopback(common::free_port());
    let daemon = format!(
        "{daemon}\napi_listen = \"{api}\"\napi_token_file = \"{}\"",
        token.display()
    );
    let toml = format!(
        "{}\n[[device]]\nname = \"f\"\nkind = \"file\"\npath = \"{}\"\nsize = \"256M\"\n\n\
         [nbd]\nlisten = [\"{nbd}\"]\n[[nbd.export]]\nname = \"f\"\ndevice = \"f\"\n\
         [[nbd.export]]\nname = \"hidden\"\ndevice = \"f\"\nallow = [\"10.0.0.0/8\"]\n\
         [nvmf]\nlisten = [\"{nvmf}\"]\n[[nvmf.subsystem]]\nnqn = \"{}\"\nallow_hosts = [\"*\"]\n\
         [[nvmf.subsystem.namespace]]\nnsid = 1\ndevice = \"f\"\n",
        config(&daemon),
        dir.path().join("f.img").display(),
        hostile_peers::nvmf::NQN,
    );
    let (d, metrics) = Daemon::start_with_metrics(&toml);
    let listening = format!("NBD listening addr={nbd}");
    wait_for_log(&d, Duration::from_secs(10), |l| l.ends_with(&listening))
        .unwrap_or_else(|| panic!("NBD not listening:\n{}", d.log()));
    let listening = format!("nvmf: listening on {nvmf}");
    wait_for_log(&d, Duration::from_secs(10), |l| l.contains(&listening))
        .unwrap_or_else(|| panic!("NVMe/TCP not listening:\n{}", d.log()));
    AllListeners {
        d,
        metrics,
        nbd,
        nvmf,
        api,
        _dir: dir,
    }
}

/// An NBD client from `source(1)` with a tiny receive buffer, in
/// transmission on `f`, that sends 1 MiB reads until the daemon stops
/// taking them.
fn nbd_stall(addr: SocketAddr) -> TcpStream {
    let mut s = connect_from(addr, source(1), Some(4096));
    hostile_peers::nbd::go(&mut s, "f").expect("NBD_OPT_GO");
    let cookie = std::cell::Cell::new(0u64);
    let read = || {
        let i = cookie.get() + 1;
        cookie.set(i);
        hostile_peers::nbd::request(nbd::proto::CMD_READ, i, (i % 256) << 20, 1 << 20, &[])
    };
    let sent = stall(&mut s, read, 1 << 30);
    assert!(sent > 0, "the daemon took no request");
    s
}

fn nbd_stalled_total(all: &AllListeners) -> u64 {
    sample(
        &metrics(all.metrics),
        "openarray_connections_stalled_total{transport=\"nbd\"}",
    )
}

/// Stalls an NBD client and waits until the daemon dropped it; how long
/// that took after the client's writes stopped going through.
fn nbd_stall_round(all: &AllListeners, bound: Duration) -> Duration {
    let before = nbd_stalled_total(all);
    let s = nbd_stall(all.nbd);
    let stalled_at = Instant::now();
    while nbd_stalled_total(all) == before {
        assert!(
            stalled_at.elapsed() < bound,
            "the stalled NBD client was not dropped within {bound:?}:\n{}",
            all.d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(s);
    stalled_at.elapsed()
}

#[test]
fn a_stalled_nbd_client_is_dropped_in_time_and_gives_its_memory_back() {
    let write_timeout = Duration::from_secs(1);
    let all = all_listeners("write_timeout = \"1s\"");
    let baseline = all.d.rss_kib().expect("daemon RSS");
    // The client notices the stall a second after the daemon's writes
    // stopped, so the drop comes within the write timeout of that.
    let took = nbd_stall_round(&all, write_timeout + Duration::from_secs(2));
    eprintln!("stalled NBD client dropped {took:?} after it saw its writes stop for 1 s");
    assert!(all
        .d
        .log()
        .contains("nbd: dropped a client that stopped reading replies"));
    // The daemon trims its heaps a moment after a drop.
    std::thread::sleep(Duration::from_millis(500));
    let first = all.d.rss_kib().expect("daemon RSS");
    for _ in 1..10 {
        nbd_stall_round(&all, write_timeout + Duration::from_secs(5));
    }
    std::thread::sleep(Duration::from_millis(500));
    let tenth = all.d.rss_kib().expect("daemon RSS");
    eprintln!(
        "RSS {baseline} KiB before, {first} KiB after the first stall, {tenth} after the tenth"
    );
    assert!(
        tenth < first + 20 * 1024,
        "RSS {tenth} KiB after ten stalled clients, {first} KiB after the first"
    );
    // One line per 10 s, not one per drop.
    let lines = log_lines(&all.d, "stopped reading replies");
    assert!(lines <= 4, "{lines} lines for ten drops");
    hostile_peers::nbd::verified_io(all.nbd, source(2), "f");
}

#[test]
fn one_address_cannot_hold_every_nbd_or_api_slot() {
    let all = all_listeners("");
    // NBD serves 1024 connections at most; one address finishing the
    // handshake 1100 times and sitting idle gets its share (256).
    let mut held = Vec::new();
    let started = Instant::now();
    for _ in 0..1100 {
        if let Some(s) = hostile_peers::nbd::connect_go(all.nbd, source(1), "f") {
            held.push(s);
        }
    }
    eprintln!(
        "{} of 1100 NBD connections from one address held after {:?}",
        held.len(),
        started.elapsed()
    );
    assert!(
        held.len() <= 256,
        "one address holds {} NBD slots",
        held.len()
    );
    hostile_peers::nbd::verified_io(all.nbd, source(2), "f");
    let text = metrics(all.metrics);
    let refused = sample(
        &text,
        "openarray_connections_refused_total{transport=\"nbd\",reason=\"source_holds_most\"}",
    );
    assert!(refused >= 800, "{refused} refusals counted");
    let lines = log_lines(&all.d, "its source address holds its most open");
    assert!(lines <= 2, "{lines} refusal lines in the log");

    // The API's idle callers: one address holds 16 (max_logins_per_source).
    let flood = IdleFlood::open(all.api, source(3), 200);
    std::thread::sleep(Duration::from_millis(500));
    let open = flood.still_open();
    eprintln!(
        "{open} of {} idle API connections from one address kept",
        flood.opened()
    );
    assert!(open <= 16, "one address holds {open} API connections");
    let bearer = format!("Bearer {TOKEN}");
    let status = hostile_peers::api::get(all.api, source(2), "/metrics", &[&bearer]);
    assert_eq!(status, 200);
}

#[test]
fn an_export_a_client_may_not_use_is_answered_as_an_unknown_name() {
    let all = all_listeners("");
    let answer = |export: &str| {
        let mut s = connect_from(all.nbd, source(1), None);
        hostile_peers::nbd::go(&mut s, export)
    };
    let unknown = answer("no-such-export");
    assert_eq!(unknown, Err(nbd::proto::REP_ERR_UNKNOWN));
    assert_eq!(answer("hidden"), unknown);
}

#[test]
fn wrong_api_tokens_are_slowed_and_logged_and_two_tokens_refused() {
    let all = all_listeners("auth_fail_delay = \"10ms\"\nauth_fail_delay_max = \"40ms\"");
    let bearer = format!("Bearer {TOKEN}");
    let get = |auth: &[&str]| hostile_peers::api::get(all.api, source(1), "/metrics", auth);
    assert_eq!(get(&[&bearer, "Bearer guess"]), 400);
    assert_eq!(get(&["Bearer guess", &bearer]), 400);
    let started = Instant::now();
    for i in 0..30 {
        assert_eq!(get(&[&format!("Bearer guess-{i}")]), 401);
    }
    let took = started.elapsed();
    eprintln!(
        "30 wrong tokens took {took:?}: {:.0} guesses a second",
        30.0 / took.as_secs_f64()
    );
    // Waits of 10, 20, then 40 ms: about 1.1 s in all.
    assert!(
        took >= Duration::from_millis(900),
        "30 guesses took {took:?}"
    );
    // Another address is not slowed, and the right token still works.
    let other = Instant::now();
    assert_eq!(
        hostile_peers::api::get(all.api, source(2), "/metrics", &[&bearer]),
        200
    );
    assert!(other.elapsed() < Duration::from_millis(500));
    assert_eq!(get(&[&bearer]), 200);
    let lines = log_lines(&all.d, "admin API: request refused");
    assert!(
        (1..=2).contains(&lines),
        "{lines} lines for 30 wrong tokens"
    );
}

/// An NVMe/TCP host from `source(1)`: a controller's admin queue, and
/// its I/O queue with a tiny receive buffer that sends 1 MiB reads, as
/// many as the queue has entries (a host keeps within them), and reads
/// no answer. The two connections.
fn nvmf_stall(addr: SocketAddr) -> (TcpStream, TcpStream) {
    use hostile_peers::nvmf::{admin, io_queue, read, ENTRIES};
    let (admin, cntlid) = admin(addr, source(1)).expect("admin queue");
    let mut q = io_queue(addr, source(1), Some(4096), cntlid).expect("I/O queue");
    let cid = std::cell::Cell::new(0u16);
    let next = || {
        let i = cid.get() + 1;
        cid.set(i);
        read(i, u64::from(i) * 2048, 2048)
    };
    let one = read(1, 0, 2048).len();
    let sent = stall(&mut q, next, usize::from(ENTRIES - 1) * one);
    assert!(sent > 0, "the daemon took no command");
    (admin, q)
}

fn nvmf_sample(all: &AllListeners, name: &str, reason: Option<&str>) -> u64 {
    let labels = match reason {
        Some(r) => format!("{{transport=\"nvme-tcp\",reason=\"{r}\"}}"),
        None => "{transport=\"nvme-tcp\"}".to_string(),
    };
    sample(&metrics(all.metrics), &format!("{name}{labels}"))
}

/// Stalls an NVMe/TCP host and waits until the daemon dropped it; how
/// long that took after the host's writes stopped going through.
fn nvmf_stall_round(all: &AllListeners, bound: Duration) -> Duration {
    let stalled = || nvmf_sample(all, "openarray_connections_stalled_total", None);
    let before = stalled();
    let peer = nvmf_stall(all.nvmf);
    let stalled_at = Instant::now();
    while stalled() == before {
        assert!(
            stalled_at.elapsed() < bound,
            "the stalled NVMe/TCP host was not dropped within {bound:?}:\n{}",
            all.d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(peer);
    stalled_at.elapsed()
}

#[test]
fn a_stalled_nvme_tcp_host_is_dropped_in_time_and_gives_its_memory_back() {
    let write_timeout = Duration::from_secs(1);
    let all = all_listeners("write_timeout = \"1s\"");
    let baseline = all.d.rss_kib().expect("daemon RSS");
    let took = nvmf_stall_round(&all, write_timeout + Duration::from_secs(2));
    eprintln!("stalled NVMe/TCP host dropped {took:?} after its writes stopped going through");
    assert!(
        all.d.log().contains("nvmf: dropped a host"),
        "{}",
        all.d.log()
    );
    std::thread::sleep(Duration::from_millis(500));
    let first = all.d.rss_kib().expect("daemon RSS");
    for _ in 1..10 {
        nvmf_stall_round(&all, write_timeout + Duration::from_secs(5));
    }
    std::thread::sleep(Duration::from_millis(500));
    let tenth = all.d.rss_kib().expect("daemon RSS");
    eprintln!(
        "RSS {baseline} KiB before, {first} KiB after the first stall, {tenth} after the tenth"
    );
    assert!(
        tenth < first + 20 * 1024,
        "RSS {tenth} KiB after ten stalled hosts, {first} KiB after the first"
    );
    // One line per 10 s, not one per drop.
    let lines = log_lines(&all.d, "nvmf: dropped a host");
    assert!(lines <= 4, "{lines} lines for ten drops");
    hostile_peers::nvmf::verified_io(all.nvmf, source(2));
}

#[test]
fn one_address_cannot_hold_every_nvme_tcp_slot() {
    let all = all_listeners("");
    // 1024 connections at most; one address connecting 1100 controllers
    // and sitting idle gets its share (256).
    let mut held = Vec::new();
    let started = Instant::now();
    for _ in 0..1100 {
        if let Ok(c) = hostile_peers::nvmf::admin(all.nvmf, source(1)) {
            held.push(c);
        }
    }
    eprintln!(
        "{} of 1100 NVMe/TCP controllers from one address held after {:?}",
        held.len(),
        started.elapsed()
    );
    assert!(
        held.len() <= 256,
        "one address holds {} NVMe/TCP connections",
        held.len()
    );
    hostile_peers::nvmf::verified_io(all.nvmf, source(2));
    let refused = nvmf_sample(
        &all,
        "openarray_connections_refused_total",
        Some("source_holds_most"),
    );
    assert!(refused >= 800, "{refused} refusals counted");
    let lines = log_lines(
        &all.d,
        "nvmf: refused a connection: its source address holds",
    );
    assert!(lines <= 2, "{lines} refusal lines in the log");
}

#[test]
fn an_idle_nvme_tcp_flood_from_one_address_does_not_lock_out_another() {
    let all = all_listeners("max_logins_per_source = 16\nmax_logins = 32\nlogin_timeout = \"15s\"");
    let started = Instant::now();
    let flood = IdleFlood::open(all.nvmf, source(1), 2_000);
    eprintln!(
        "{} of 2000 connections opened from {} in {:?}",
        flood.opened(),
        source(1),
        started.elapsed()
    );
    assert!(flood.opened() >= 1_800, "only {} opened", flood.opened());
    std::thread::sleep(Duration::from_millis(500));
    let open = flood.still_open();
    assert!(
        open <= 16,
        "one address holds {open} connections not yet connected"
    );
    // A second flooding address fills the total (32) with the first.
    let second = IdleFlood::open(all.nvmf, source(3), 100);
    let churn = IdleFlood::churn(all.nvmf, source(1), Duration::from_secs(3));
    for _ in 0..3 {
        hostile_peers::nvmf::verified_io(all.nvmf, source(2));
    }
    let churned = churn.finish();
    eprintln!("{churned} connections reopened by the flood during the connects");
    drop((flood, second));
    let refused = nvmf_sample(
        &all,
        "openarray_connections_refused_total",
        Some("source_logging_in"),
    );
    assert!(refused >= 1_700, "{refused} refusals counted");
    let evicted = nvmf_sample(&all, "openarray_connections_evicted_total", None);
    assert!(
        evicted >= 1,
        "the connects from a third address evicted none"
    );
    let lines = log_lines(&all.d, "nvmf: refused a connection");
    let bound = 2 + started.elapsed().as_secs() / 10;
    eprintln!("{refused} refusals, {lines} log lines, {evicted} evicted");
    assert!(lines as u64 <= bound, "{lines} refusal lines in the log");
}
