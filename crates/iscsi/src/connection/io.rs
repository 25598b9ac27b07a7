//! Reading PDUs from a socket for the connection loop: the reader frames
//! PDUs with the connection's limits (so the loop can wait on several
//! things without losing partial reads). The write side is in `writer`.

use std::io;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;

use super::placed::{PlacedWrite, PLACED_SEGMENT_MIN};
use super::spin::SpinPolicy;
use crate::pdu::{self, Bhs, Framing, Opcode, Pdu, PduError, BHS_LEN, DIGEST_LEN};

pub(crate) use super::writer::{OutPdu, Outgoing, StatSn, Writer};

/// Why reading a PDU failed.
#[derive(Debug)]
pub(crate) enum ReadError {
    Io(io::Error),
    /// A framing error. `header` is the offending BHS when it was read;
    /// `in_sync` says whether the stream is still at a PDU boundary.
    Pdu {
        error: PduError,
        header: Option<Bhs>,
        in_sync: bool,
    },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Pdu { error, .. } => write!(f, "{error}"),
        }
    }
}

/// Read one PDU. `Ok(None)` is a clean end of stream between PDUs.
pub(crate) async fn read_pdu<R: AsyncRead + Unpin>(
    r: &mut R,
    framing: &Framing,
) -> Result<Option<Pdu>, ReadError> {
    let mut head = [0u8; BHS_LEN];
    // Distinguish EOF before a PDU from EOF inside one.
    let n = r.read(&mut head).await.map_err(ReadError::Io)?;
    if n == 0 {
        return Ok(None);
    }
    r.read_exact(&mut head[n..]).await.map_err(ReadError::Io)?;
    let bhs = Bhs(head);
    let lens = pdu::frame_lengths(&bhs, framing).map_err(|error| ReadError::Pdu {
        error,
        header: Some(bhs),
        in_sync: false,
    })?;
    let mut ahs = vec![0u8; lens.ahs];
    r.read_exact(&mut ahs).await.map_err(ReadError::Io)?;
    if lens.header_digest > 0 {
        let mut digest = [0u8; DIGEST_LEN];
        r.read_exact(&mut digest).await.map_err(ReadError::Io)?;
        pdu::verify_header_digest(&bhs, &ahs, &digest).map_err(|error| ReadError::Pdu {
            error,
            header: Some(bhs),
            in_sync: false,
        })?;
    }
    let mut data = BytesMut::zeroed(lens.data + lens.padding);
    r.read_exact(&mut data).await.map_err(ReadError::Io)?;
    if lens.data_digest > 0 {
        let mut digest = [0u8; DIGEST_LEN];
        r.read_exact(&mut digest).await.map_err(ReadError::Io)?;
        pdu::verify_data_digest(&data, &digest).map_err(|error| ReadError::Pdu {
            error,
            header: Some(bhs),
            in_sync: true,
        })?;
    }
    data.truncate(lens.data);
    Ok(Some(Pdu {
        bhs,
        ahs,
        data: data.freeze(),
    }))
}

/// Frames PDUs out of the byte stream of a connection in the full feature
/// phase, for the connection loop to read without a task of its own.
///
/// [`PduReader::fill`] is the only await and is cancel-safe (bytes read
/// stay in the buffer), so the loop can wait on the socket and on other
/// things at once; [`PduReader::next`] then frames every PDU that is
/// complete. One socket read usually brings several PDUs. The buffer holds
/// at most one PDU's frame, whose length the framing limits, plus one read.
pub(crate) struct PduReader<R> {
    r: R,
    buf: BytesMut,
    framing: Framing,
    /// The data segment being received straight into a started write.
    placing: Option<Placing>,
    /// The header at the front of the buffer was offered for placing and
    /// declined: do not ask again while the rest of its PDU arrives.
    declined: bool,
    /// The last PDU's data was placed: read the next header alone, so
    /// that the data of another PDU to place behind it is not read into
    /// the buffer with it.
    header_alone: bool,
    /// Whether to poll the socket before sleeping on it.
    spin: SpinPolicy,
}

/// A PDU (a Data-Out, or a SCSI Command with immediate data) whose data
/// segment goes straight into a started write.
struct Placing {
    bhs: Bhs,
    write: Arc<PlacedWrite>,
    /// Offset within the write of the next byte.
    at: usize,
    /// Data bytes still to come, then padding bytes to drop.
    left: usize,
    padding: usize,
}

/// What [`PduReader::next_placing`] completed.
pub(crate) enum Frame {
    Pdu(Pdu),
    /// A Data-Out or SCSI Command whose data went into the write its
    /// placer named; its header alone.
    Placed(Bhs),
}

/// Where the data of a Data-Out or SCSI Command goes, asked of the
/// connection for each long one: the started write and the offset within
/// it, or `None` to read the PDU whole as usual.
pub(crate) type Placer<'a> = dyn FnMut(&Bhs, usize) -> Option<(Arc<PlacedWrite>, usize)> + 'a;

/// A stream the reader reads; a TCP socket also lets it receive data
/// straight into a started write.
pub(crate) trait Socket: AsyncRead + Unpin {
    fn tcp(&self) -> Option<&TcpStream> {
        None
    }
}

impl Socket for OwnedReadHalf {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 64 * 1024;
/// Data segments at least this long share the read buffer's memory.
const SHARED_SEGMENT: usize = 16 * 1024;

impl<R: Socket> PduReader<R> {
    pub fn new(r: R, framing: Framing) -> Self {
        PduReader {
            r,
            buf: BytesMut::with_capacity(READ_CHUNK),
            framing,
            placing: None,
            declined: false,
            header_alone: false,
            spin: SpinPolicy::default(),
        }
    }

    /// Read more bytes. `Ok(false)` is the end of the stream; the error
    /// is already framed as [`ReadError`] for a stream that ends inside a
    /// PDU. Cancel-safe.
    pub async fn fill(&mut self) -> Result<bool, ReadError> {
        // How much to ask for: no more than a placed segment still lacks,
        // or one header after a placed segment.
        let mut limit = READ_CHUNK;
        if let Some(p) = &mut self.placing {
            if let (true, Some(socket)) = (self.buf.is_empty() && p.left > 0, self.r.tcp()) {
                match p.write.receive(socket, p.at, p.left).await {
                    Ok(Some(0)) => return Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into())),
                    Ok(Some(n)) => {
                        p.at += n;
                        p.left -= n;
                        return Ok(true);
                    }
                    Ok(None) => {}
                    Err(e) => return Err(ReadError::Io(e)),
                }
            }
            limit = p.left + p.padding;
        } else if self.header_alone && self.buf.len() < BHS_LEN {
            limit = BHS_LEN - self.buf.len();
        }
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 4 {
            self.buf.reserve(READ_CHUNK);
        }
        let started = std::time::Instant::now();
        let budget = self.spin.budget();
        if let Some(budget) = budget {
            let caught = self.poll_briefly(started + budget, limit).await;
            self.spin.polled(caught.is_some());
            if let Some(caught) = caught {
                return caught;
            }
        }
        let n = (&mut self.r)
            .take(limit as u64)
            .read_buf(&mut self.buf)
            .await
            .map_err(ReadError::Io)?;
        if budget.is_none() {
            self.spin.slept(started.elapsed());
        }
        if n > 0 {
            return Ok(true);
        }
        if self.buf.is_empty() && self.placing.is_none() {
            Ok(false)
        } else {
            Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into()))
        }
    }

    /// Tell the reader how many commands received are not yet answered
    /// (see [`SpinPolicy::running`]).
    pub fn set_running(&mut self, commands: usize) {
        self.spin.running = commands;
    }

    /// Read from the socket without sleeping on it, until `until`,
    /// yielding to the thread's other tasks between tries: `Some` once
    /// bytes came (or the socket failed), `None` if none came in time or
    /// the stream ended (the sleeping read that follows reports that).
    async fn poll_briefly(
        &mut self,
        until: std::time::Instant,
        limit: usize,
    ) -> Option<Result<bool, ReadError>> {
        loop {
            let socket = self.r.tcp()?;
            match socket.try_read_buf(&mut bytes::BufMut::limit(&mut self.buf, limit)) {
                Ok(0) => return None,
                Ok(_) => return Some(Ok(true)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Some(Err(ReadError::Io(e))),
            }
            if std::time::Instant::now() >= until {
                return None;
            }
            tokio::task::yield_now().await;
        }
    }

    /// The next PDU if all of it has arrived, placing none. After an error
    /// with `in_sync: false` the stream cannot be framed any more.
    #[cfg(test)]
    pub fn next(&mut self) -> Option<Result<Pdu, ReadError>> {
        match self.next_placing(&mut |_, _| None)? {
            Ok(Frame::Pdu(pdu)) => Some(Ok(pdu)),
            Ok(Frame::Placed(_)) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Like [`PduReader::next`], offering every Data-Out and SCSI Command
    /// with a long data segment to `place` as soon as its header is in:
    /// the data of one it places goes into
    /// the write it names as it arrives, and comes out as
    /// [`Frame::Placed`] once all of it is in.
    pub fn next_placing(&mut self, place: &mut Placer<'_>) -> Option<Result<Frame, ReadError>> {
        if self.placing.is_some() {
            return self.go_on_placing().map(Ok);
        }
        let head = self.buf.get(..BHS_LEN)?;
        let mut raw = [0u8; BHS_LEN];
        raw.copy_from_slice(head);
        let bhs = Bhs(raw);
        self.header_alone = false;
        let lens = match pdu::frame_lengths(&bhs, &self.framing) {
            Ok(l) => l,
            Err(error) => {
                return Some(Err(ReadError::Pdu {
                    error,
                    header: Some(bhs),
                    in_sync: false,
                }))
            }
        };
        let placeable = matches!(bhs.opcode(), Some(Opcode::DataOut | Opcode::ScsiCommand))
            && lens.ahs == 0
            && lens.data_digest == 0
            && lens.data >= PLACED_SEGMENT_MIN;
        let header = BHS_LEN + lens.header_digest;
        if placeable && !self.declined && self.buf.len() >= header {
            if lens.header_digest > 0 {
                let digest = &self.buf[BHS_LEN..header];
                if let Err(error) = pdu::verify_header_digest(&bhs, &[], digest) {
                    return Some(Err(ReadError::Pdu {
                        error,
                        header: Some(bhs),
                        in_sync: false,
                    }));
                }
            }
            match place(&bhs, lens.data) {
                Some((write, at)) => {
                    self.spin.saw(&bhs);
                    self.buf.advance(header);
                    self.placing = Some(Placing {
                        bhs,
                        write,
                        at,
                        left: lens.data,
                        padding: lens.padding,
                    });
                    return self.go_on_placing().map(Ok);
                }
                None => self.declined = true,
            }
        }
        let total = lens.total();
        if self.buf.len() < total {
            self.buf.reserve(total - self.buf.len());
            return None;
        }
        self.declined = false;
        self.spin.saw(&bhs);
        let frame = self.buf.split_to(total);
        let mut at = BHS_LEN;
        let ahs = &frame[at..at + lens.ahs];
        at += lens.ahs;
        if lens.header_digest > 0 {
            if let Err(error) = pdu::verify_header_digest(&bhs, ahs, &frame[at..at + DIGEST_LEN]) {
                return Some(Err(ReadError::Pdu {
                    error,
                    header: Some(bhs),
                    in_sync: false,
                }));
            }
            at += DIGEST_LEN;
        }
        let data_at = at;
        let data = &frame[at..at + lens.data + lens.padding];
        at += lens.data + lens.padding;
        if lens.data_digest > 0 {
            if let Err(error) = pdu::verify_data_digest(data, &frame[at..at + DIGEST_LEN]) {
                return Some(Err(ReadError::Pdu {
                    error,
                    header: Some(bhs),
                    in_sync: true,
                }));
            }
        }
        let ahs = ahs.to_vec();
        // A small segment gets its own allocation, so it does not keep a
        // whole read buffer alive while its command waits; a large one is
        // most of its buffer already and is not worth a copy.
        let data = if lens.data >= SHARED_SEGMENT {
            frame.freeze().slice(data_at..data_at + lens.data)
        } else {
            Bytes::copy_from_slice(&data[..lens.data])
        };
        Some(Ok(Frame::Pdu(Pdu { bhs, ahs, data })))
    }

    /// Hands the placed segment's bytes that are in the buffer to its
    /// write, drops its padding, and ends it once all are in.
    fn go_on_placing(&mut self) -> Option<Frame> {
        let p = self.placing.as_mut()?;
        let n = p.left.min(self.buf.len());
        if n > 0 {
            p.write.write(p.at, &self.buf[..n]);
            self.buf.advance(n);
            p.at += n;
            p.left -= n;
        }
        let pad = p.padding.min(self.buf.len());
        self.buf.advance(pad);
        p.padding -= pad;
        if p.left > 0 || p.padding > 0 {
            return None;
        }
        let done = self.placing.take()?;
        self.header_alone = true;
        Some(Frame::Placed(done.bhs))
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdsn::CmdWindow;
    use crate::connection::sink::Sink;
    use crate::pdu::{Decoded, Opcode};
    use parking_lot::Mutex;
    use scsi_api::FileRegion;
    use tokio::sync::mpsc;

    #[tokio::test]
    async fn read_pdu_from_stream() {
        let framing = Framing {
            header_digest: true,
            data_digest: true,
            max_data_segment: 1024,
        };
        let mut bhs = Bhs::new(Opcode::NopOut, 0x80);
        bhs.set_itt(5);
        let pdu = Pdu::new(bhs, Bytes::from_static(b"ping!"));
        let mut wire = pdu::encode(&pdu, &framing);
        wire.extend(pdu::encode(&pdu, &framing));
        let mut r = &wire[..];
        assert_eq!(read_pdu(&mut r, &framing).await.unwrap(), Some(pdu.clone()));
        assert_eq!(read_pdu(&mut r, &framing).await.unwrap(), Some(pdu));
        assert!(read_pdu(&mut r, &framing).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn oversized_segment_is_refused_unread() {
        let framing = Framing {
            header_digest: false,
            data_digest: false,
            max_data_segment: 16,
        };
        let pdu = Pdu::new(Bhs::new(Opcode::NopOut, 0x80), Bytes::from(vec![0u8; 32]));
        let wire = pdu::encode(
            &pdu,
            &Framing {
                max_data_segment: 64,
                ..framing
            },
        );
        let mut r = &wire[..];
        match read_pdu(&mut r, &framing).await {
            Err(ReadError::Pdu {
                error: PduError::DataSegmentTooLong { len: 32, max: 16 },
                in_sync: false,
                ..
            }) => {}
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(r.len(), 32, "data left unread");
    }

    #[tokio::test]
    async fn data_digest_error_keeps_stream_in_sync() {
        let framing = Framing {
            header_digest: false,
            data_digest: true,
            max_data_segment: 64,
        };
        let pdu = Pdu::new(Bhs::new(Opcode::NopOut, 0x80), Bytes::from_static(b"abcd"));
        let mut wire = pdu::encode(&pdu, &framing);
        let last = wire.len() - 1;
        wire[last] ^= 0xff;
        wire.extend(pdu::encode(&pdu, &framing));
        let mut r = &wire[..];
        assert!(matches!(
            read_pdu(&mut r, &framing).await,
            Err(ReadError::Pdu { in_sync: true, .. })
        ));
        assert_eq!(read_pdu(&mut r, &framing).await.unwrap(), Some(pdu));
    }

    /// A reader that hands out its bytes in pieces of the given sizes.
    struct Pieces(Vec<Vec<u8>>);

    impl Socket for Pieces {}

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            if !self.0.is_empty() {
                let piece = self.0.remove(0);
                buf.put_slice(&piece);
            }
            std::task::Poll::Ready(Ok(()))
        }
    }

    fn pieces(wire: &[u8], sizes: &[usize]) -> Pieces {
        let mut out = Vec::new();
        let mut at = 0;
        for &n in sizes {
            out.push(wire[at..at + n].to_vec());
            at += n;
        }
        out.push(wire[at..].to_vec());
        Pieces(out)
    }

    #[tokio::test]
    async fn pdu_reader_frames_several_pdus_per_read_and_split_ones() {
        let framing = Framing {
            header_digest: true,
            data_digest: true,
            max_data_segment: 1024,
        };
        let pdus: Vec<Pdu> = (0..3)
            .map(|i| {
                let mut bhs = Bhs::new(Opcode::NopOut, 0x80);
                bhs.set_itt(i);
                Pdu::new(bhs, Bytes::from(vec![i as u8; 5 + i as usize]))
            })
            .collect();
        let mut wire = Vec::new();
        for p in &pdus {
            wire.extend(pdu::encode(p, &framing));
        }
        let one = pdu::encode(&pdus[0], &framing).len();
        // The first read holds one PDU and part of the next.
        let mut r = PduReader::new(pieces(&wire, &[one + 20]), framing);
        let mut got = Vec::new();
        while r.fill().await.unwrap() {
            while let Some(p) = r.next() {
                got.push(p.unwrap());
            }
        }
        assert_eq!(got, pdus);
    }

    #[tokio::test]
    async fn pdu_reader_reports_errors() {
        let framing = Framing {
            header_digest: false,
            data_digest: true,
            max_data_segment: 16,
        };
        let ok = Pdu::new(Bhs::new(Opcode::NopOut, 0x80), Bytes::from_static(b"abcd"));
        let mut wire = pdu::encode(&ok, &framing);
        let last = wire.len() - 1;
        wire[last] ^= 0xff;
        wire.extend(pdu::encode(&ok, &framing));
        let big = Pdu::new(Bhs::new(Opcode::NopOut, 0x80), Bytes::from(vec![0u8; 32]));
        wire.extend(pdu::encode(
            &big,
            &Framing {
                max_data_segment: 64,
                ..framing
            },
        ));
        let mut r = PduReader::new(pieces(&wire, &[]), framing);
        assert!(r.fill().await.unwrap());
        assert!(matches!(
            r.next(),
            Some(Err(ReadError::Pdu {
                error: PduError::DataDigest,
                in_sync: true,
                ..
            }))
        ));
        assert_eq!(r.next().unwrap().unwrap(), ok);
        assert!(matches!(
            r.next(),
            Some(Err(ReadError::Pdu {
                error: PduError::DataSegmentTooLong { len: 32, max: 16 },
                in_sync: false,
                ..
            }))
        ));
        // A stream that ends inside a PDU is an error, between PDUs it is not.
        let mut r = PduReader::new(pieces(&wire[..10], &[]), framing);
        assert!(r.fill().await.unwrap());
        assert!(r.next().is_none());
        assert!(matches!(r.fill().await, Err(ReadError::Io(_))));
        let mut r = PduReader::new(Pieces(Vec::new()), framing);
        assert!(!r.fill().await.unwrap());
    }

    #[tokio::test]
    async fn writer_stamps_and_batches() {
        let window = Arc::new(Mutex::new(CmdWindow::new(10, 4)));
        window.lock().accept(true);
        let (client, server) = tokio::io::duplex(1 << 16);
        let writer = Writer::new(server, Framing::LOGIN, 100, window.clone());
        let (tx, rx) = mpsc::channel(8);
        let mut first = OutPdu::new(
            crate::pdu::target::nop_in([0; 8], 1, 0xffff_ffff),
            Bytes::from_static(b"xyz"),
            StatSn::Advance,
        );
        first.frees_window_slot = true;
        tx.send(Outgoing::Pdu(first)).await.unwrap();
        tx.send(Outgoing::Pdu(OutPdu::new(
            crate::pdu::target::r2t([0; 8], 2, 3, 0, 0, 512),
            Bytes::new(),
            StatSn::Peek,
        )))
        .await
        .unwrap();
        tx.send(Outgoing::Close(None)).await.unwrap();
        writer.run(rx).await;
        let mut buf = Vec::new();
        let mut client = client;
        client.read_to_end(&mut buf).await.unwrap();
        let Ok(Decoded::Complete { pdu: a, consumed }) = pdu::decode(&buf, &Framing::LOGIN) else {
            panic!()
        };
        assert_eq!(&a.data[..], b"xyz");
        assert_eq!(
            (a.bhs.u32_at(24), a.bhs.u32_at(28), a.bhs.u32_at(32)),
            (100, 11, 14)
        );
        let Ok(Decoded::Complete { pdu: b, .. }) = pdu::decode(&buf[consumed..], &Framing::LOGIN)
        else {
            panic!()
        };
        assert_eq!(b.bhs.u32_at(24), 101, "R2T carries the next StatSN");
        assert_eq!(window.lock().inflight(), 0);
    }

    /// A batch of a memory PDU, a file PDU that runs past the file's end,
    /// and another memory PDU, as the peer decodes it.
    async fn send_mixed_batch<S: Sink + 'static>(sink: S) {
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &[7u8; 1000]).unwrap();
        let file = Arc::new(file);
        let window = Arc::new(Mutex::new(CmdWindow::new(10, 4)));
        let writer = Writer::new(sink, Framing::LOGIN, 100, window);
        let (tx, rx) = mpsc::channel(8);
        let pdu = |itt, data: &'static [u8]| {
            let bhs = crate::pdu::target::nop_in([0; 8], itt, 0xffff_ffff);
            Outgoing::Pdu(OutPdu::new(bhs, Bytes::from_static(data), StatSn::Reserved))
        };
        let mut paged = pdu(2, b"");
        if let Outgoing::Pdu(p) = &mut paged {
            p.file = Some(FileRegion {
                file,
                offset: 900,
                len: 201,
            });
        }
        for item in [pdu(1, b"ab"), paged, pdu(3, b"cd")] {
            tx.send(item).await.unwrap();
        }
        tx.send(Outgoing::Close(None)).await.unwrap();
        writer.run(rx).await;
    }

    fn decode_all(mut wire: &[u8]) -> Vec<Pdu> {
        let mut pdus = Vec::new();
        while !wire.is_empty() {
            let Ok(Decoded::Complete { pdu, consumed }) = pdu::decode(wire, &Framing::LOGIN) else {
                panic!("undecodable bytes");
            };
            pdus.push(pdu);
            wire = &wire[consumed..];
        }
        pdus
    }

    fn assert_mixed_batch(pdus: &[Pdu]) {
        assert_eq!(pdus.len(), 3);
        assert_eq!(&pdus[0].data[..], b"ab");
        let mut paged = vec![7u8; 100];
        paged.resize(201, 0);
        assert_eq!(
            &pdus[1].data[..],
            &paged[..],
            "file bytes, zeros past its end"
        );
        assert_eq!(&pdus[2].data[..], b"cd");
    }

    #[tokio::test]
    async fn file_regions_leave_from_the_file_over_a_socket() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await.unwrap();
            buf
        });
        let (server, _) = listener.accept().await.unwrap();
        let (_rd, wr) = server.into_split();
        send_mixed_batch(wr).await;
        assert_mixed_batch(&decode_all(&client.await.unwrap()));
    }

    #[tokio::test]
    async fn file_regions_are_copied_where_there_is_no_socket() {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        send_mixed_batch(server).await;
        let mut buf = Vec::new();
        client.read_to_end(&mut buf).await.unwrap();
        assert_mixed_batch(&decode_all(&buf));
    }
}
