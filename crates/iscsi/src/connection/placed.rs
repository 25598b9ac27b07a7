//! WRITEs whose Data-Out goes from the socket straight into the device's
//! memory as it arrives ([`scsi_api::StartedWrite`]), instead of into a
//! buffer that is copied to the device once the write is complete.
//! docs/design.md ("WRITEs received into the file's pages") says when the
//! connection starts a write so and why that is safe.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use scsi_api::{ScsiResponse, StartedWrite};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Writes of at least this many bytes are started before their data
/// arrives; smaller ones gain too little from it to be worth the steps.
pub(crate) const PLACED_WRITE_MIN: u32 = 64 << 10;

/// A Data-Out segment at least this long is received straight into the
/// device; a shorter one is read with the PDUs around it and copied.
pub(crate) const PLACED_SEGMENT_MIN: usize = 16 << 10;

/// What a command that may be started before its data does with it.
pub(crate) enum Placed {
    /// Started: its data goes into the device as it arrives.
    Started(Arc<PlacedWrite>),
    /// Refused when it arrived: its data is dropped, then this answers it.
    Answered(ScsiResponse),
}

/// A started write, shared by its task and by the reader placing one of
/// its segments.
pub(crate) struct PlacedWrite {
    started: Box<dyn StartedWrite>,
    /// Set when the task is aborted: no byte goes in after that.
    stopped: AtomicBool,
    /// Cleared when receiving into the device's memory failed (EFAULT: a
    /// page the file system could not back): the rest is written from
    /// memory, which reports why (ENOSPC) or succeeds.
    direct: AtomicBool,
    /// The first failure to write, after which no byte goes in; the write
    /// then answers with it.
    failed: Mutex<Option<io::Error>>,
}

impl PlacedWrite {
    pub fn new(started: Box<dyn StartedWrite>) -> Arc<PlacedWrite> {
        Arc::new(PlacedWrite {
            started,
            stopped: AtomicBool::new(false),
            direct: AtomicBool::new(true),
            failed: Mutex::new(None),
        })
    }

    /// Whether bytes still go in.
    fn taking(&self) -> bool {
        !self.stopped.load(Ordering::Relaxed) && self.failed.lock().is_none()
    }

    /// No byte goes in after this (the task was aborted).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// Writes bytes that arrived in memory at `at` within the write.
    pub fn write(&self, at: usize, bytes: &[u8]) {
        if self.taking() {
            if let Err(e) = self.started.write(at, bytes) {
                self.fail(e);
            }
        }
    }

    fn fail(&self, e: io::Error) {
        self.failed.lock().get_or_insert(e);
    }

    /// Receives up to `len` bytes for offset `at` from `socket` straight
    /// into the device; `Ok(0)` is the end of the stream. `Ok(None)`: this
    /// write takes no more bytes so (stopped, failed, or receiving into
    /// the device failed), and the caller reads them into memory and hands
    /// them to [`PlacedWrite::write`]. Cancel-safe.
    pub async fn receive(
        &self,
        socket: &TcpStream,
        at: usize,
        len: usize,
    ) -> io::Result<Option<usize>> {
        use std::os::fd::AsRawFd;
        let fd = socket.as_raw_fd();
        loop {
            if !self.taking() || !self.direct.load(Ordering::Relaxed) {
                return Ok(None);
            }
            socket.readable().await?;
            // Whether the failure came from the socket (the connection's
            // problem) or from placing the bytes (the write's).
            let mut from_socket = false;
            let attempt = socket.try_io(Interest::READABLE, || {
                self.started.fill(at, len, &mut |to, n| {
                    // SAFETY: `to` is `n` writable bytes of the device's
                    // memory, lent for this call; only the kernel writes
                    // them (StartedWrite::fill says why).
                    let got = unsafe { libc::recv(fd, to.cast(), n, libc::MSG_DONTWAIT) };
                    if got < 0 {
                        let e = io::Error::last_os_error();
                        from_socket = e.raw_os_error() != Some(libc::EFAULT);
                        return Err(e);
                    }
                    Ok(got as usize)
                })
            });
            match attempt {
                Ok(n) => return Ok(Some(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if from_socket => return Err(e),
                Err(e) => {
                    tracing::debug!(error = %e, "receiving a write into the device failed");
                    self.direct.store(false, Ordering::Relaxed);
                    return Ok(None);
                }
            }
        }
    }

    /// The write's response; `None` when the reader still holds it (it
    /// never does once the last segment is in).
    pub fn finish(self: Arc<Self>) -> Option<ScsiResponse> {
        let this = Arc::into_inner(self)?;
        let failed = this.failed.into_inner();
        Some(this.started.finish(failed))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use scsi_api::Fill;
    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::connection::io::{Frame, PduReader, Socket};
    use crate::pdu::{self, Bhs, Framing, Opcode, Pdu};

    impl Socket for tokio::io::DuplexStream {}

    /// A started write into memory of our own, counting how often bytes
    /// were received straight into it.
    struct MemWrite {
        bytes: Mutex<Vec<u8>>,
        direct: std::sync::atomic::AtomicUsize,
    }

    /// Shares a [`MemWrite`] with the test that looks at it.
    struct Shared(Arc<MemWrite>);

    impl std::ops::Deref for Shared {
        type Target = MemWrite;
        fn deref(&self) -> &MemWrite {
            &self.0
        }
    }

    impl StartedWrite for Shared {
        fn write(&self, at: usize, bytes: &[u8]) -> io::Result<()> {
            self.bytes.lock()[at..at + bytes.len()].copy_from_slice(bytes);
            Ok(())
        }

        fn fill(&self, at: usize, len: usize, fill: &mut Fill<'_>) -> io::Result<usize> {
            let mut bytes = self.bytes.lock();
            let to = bytes[at..at + len].as_mut_ptr();
            let n = fill(to, len)?;
            self.direct.fetch_add(1, Ordering::Relaxed);
            Ok(n)
        }

        fn finish(self: Box<Self>, failed: Option<io::Error>) -> ScsiResponse {
            assert!(failed.is_none());
            ScsiResponse::good()
        }
    }

    const FRAMING: Framing = Framing {
        header_digest: true,
        data_digest: false,
        max_data_segment: 1 << 20,
    };

    fn data_out(itt: u32, offset: u32, data: &[u8]) -> Vec<u8> {
        let mut bhs = Bhs::new(Opcode::DataOut, 0);
        bhs.set_itt(itt);
        bhs.set_u32(20, 0xffff_ffff);
        bhs.set_u32(40, offset);
        pdu::encode(&Pdu::new(bhs, Bytes::copy_from_slice(data)), &FRAMING)
    }

    fn nop(itt: u32) -> Vec<u8> {
        let mut bhs = Bhs::new(Opcode::NopOut, 0x80);
        bhs.set_itt(itt);
        pdu::encode(&Pdu::new(bhs, Bytes::from_static(b"ping")), &FRAMING)
    }

    /// A NOP, a long Data-Out (placed), a short one (read whole), a long
    /// one with padding (placed), a NOP; all Data-Outs for ITT 1.
    fn wire(data: &[u8]) -> Vec<u8> {
        let mut wire = nop(7);
        wire.extend(data_out(1, 0, &data[..40_000]));
        wire.extend(data_out(1, 40_000, &data[40_000..41_000]));
        wire.extend(data_out(1, 41_000, &data[41_000..]));
        wire.extend(nop(8));
        wire
    }

    /// Reads `wire` through a reader over `stream`, placing ITT 1's long
    /// Data-Outs into `write`; what came out, as short names.
    async fn frames<S: Socket>(stream: S, write: Arc<PlacedWrite>) -> Vec<String> {
        let mut reader = PduReader::new(stream, FRAMING);
        let mut place = |bhs: &Bhs, _len: usize| {
            (bhs.itt() == 1).then(|| (write.clone(), bhs.u32_at(40) as usize))
        };
        let mut out = Vec::new();
        while reader.fill().await.expect("the stream stays in sync") {
            while let Some(frame) = reader.next_placing(&mut place) {
                out.push(match frame.unwrap() {
                    Frame::Pdu(p) => format!("{:?} {}", p.bhs.opcode().unwrap(), p.data.len()),
                    Frame::Placed(bhs) => format!("placed {}", bhs.data_segment_len()),
                });
            }
        }
        out
    }

    fn expected_frames() -> Vec<String> {
        [
            "NopOut 4",
            "placed 40000",
            "DataOut 1000",
            "placed 20002",
            "NopOut 4",
        ]
        .map(String::from)
        .to_vec()
    }

    fn mem_write(len: usize) -> Arc<MemWrite> {
        Arc::new(MemWrite {
            bytes: Mutex::new(vec![0; len]),
            direct: Default::default(),
        })
    }

    /// Sends `wire` in uneven pieces, pausing between them so that the
    /// reader sees them apart.
    async fn send_in_pieces(mut to: impl tokio::io::AsyncWrite + Unpin, wire: Vec<u8>) {
        let mut at = 0;
        for n in [10, 61, 3000, 17_000, 5, 24_000].into_iter().cycle() {
            let end = (at + n).min(wire.len());
            to.write_all(&wire[at..end]).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            at = end;
            if at == wire.len() {
                break;
            }
        }
    }

    #[tokio::test]
    async fn long_data_outs_go_from_a_socket_straight_into_the_write() {
        let data: Vec<u8> = (0..61_002u32).map(|i| (i % 253) as u8).collect();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sender = tokio::net::TcpStream::connect(listener.local_addr().unwrap());
        let (sender, accepted) = tokio::join!(sender, listener.accept());
        let (rd, _wr) = accepted.unwrap().0.into_split();
        let mem = mem_write(data.len());
        let write = PlacedWrite::new(Box::new(Shared(mem.clone())));
        let (got, ()) = tokio::join!(
            frames(rd, write.clone()),
            send_in_pieces(sender.unwrap(), wire(&data))
        );
        assert_eq!(got, expected_frames());
        assert!(mem.bytes.lock()[..40_000] == data[..40_000]);
        assert!(
            mem.bytes.lock()[40_000..41_000].iter().all(|&b| b == 0),
            "read whole, not placed"
        );
        assert!(mem.bytes.lock()[41_000..] == data[41_000..]);
        assert!(
            mem.direct.load(Ordering::Relaxed) > 0,
            "some bytes came straight from the socket"
        );
        assert!(write.finish().is_some_and(|r| r.status == 0));
    }

    #[tokio::test]
    async fn without_a_socket_placed_data_is_copied_and_a_stopped_write_takes_none() {
        let data: Vec<u8> = (0..61_002u32).map(|i| (i % 251) as u8).collect();
        for stop in [false, true] {
            let (rd, wr) = tokio::io::duplex(4096);
            let mem = mem_write(data.len());
            let write = PlacedWrite::new(Box::new(Shared(mem.clone())));
            if stop {
                write.stop();
            }
            let (got, ()) = tokio::join!(frames(rd, write), send_in_pieces(wr, wire(&data)));
            assert_eq!(got, expected_frames(), "stopped: {stop}");
            let bytes = mem.bytes.lock();
            assert_eq!(mem.direct.load(Ordering::Relaxed), 0);
            if stop {
                assert!(bytes.iter().all(|&b| b == 0));
            } else {
                assert!(bytes[..40_000] == data[..40_000]);
                assert!(bytes[41_000..] == data[41_000..]);
            }
        }
    }
}
