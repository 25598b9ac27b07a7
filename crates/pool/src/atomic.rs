//! Atomic writes of a volume, all or nothing across a crash, by
//! redirect-on-write: every unit the write touches is written anew to a
//! freshly taken unit (the old unit's bytes around the write copied in, as
//! a snapshot's copy-on-write does), and then every mapping of the write
//! switches to its new unit under one hold of the pool's lock. Mappings
//! commit together with the next flush, in one metadata transaction after
//! the data devices are flushed, so a crash before that commit leaves the
//! old units mapped and one after it the new ones; no old byte is ever
//! overwritten. The old units are freed by the switch and, like every
//! freed unit, held until the commit that frees them is durable, so none
//! is reused while the committed state still maps it.

use std::io;

use block::AtomicWrites;

use crate::volume::{gone, pieces, Piece, VolumeDevice};

/// The longest atomic write: its new units are all taken before any is
/// mapped, so this bounds what one write holds of the pool's free space.
pub const MAX_ATOMIC_BYTES: u64 = 32 << 20;

/// One touched unit of an atomic write: where its bytes were, and the
/// fresh unit that takes them with the write laid over.
struct Redirect {
    piece: Piece,
    source: Option<u64>,
    fresh: u64,
}

impl VolumeDevice {
    pub(crate) fn atomic_limits(&self) -> Option<AtomicWrites> {
        (!self.read_only()).then_some(AtomicWrites::up_to(MAX_ATOMIC_BYTES))
    }

    /// `buf` at `offset`, all or nothing across a crash (module comment).
    pub(crate) fn write_redirected(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        if self.read_only() {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        self.check(offset, buf.len() as u64)?;
        let limits = AtomicWrites::up_to(MAX_ATOMIC_BYTES);
        if !limits.allows(offset, buf.len() as u64) {
            return Err(limits.refusal(offset, buf.len() as u64));
        }
        let pool = self.pool();
        let layout = &pool.layout;
        loop {
            let redirects = self.take_fresh_units(offset, buf.len() as u64)?;
            // Filled outside the lock, as a copy-on-write is: other I/O goes
            // on, and the sources, marked as being copied, are written in
            // place by nobody meanwhile.
            let filled = redirects.iter().try_for_each(|r| {
                let p = &r.piece;
                let data = &buf[p.at..p.at + p.len];
                match r.source {
                    Some(unit) => layout.fill_copy(unit, r.fresh, p.within, data),
                    None => layout.fill_fresh(r.fresh, p.within, data),
                }
            });
            let mut st = pool.state.write();
            for r in &redirects {
                st.space.unreserve(r.fresh);
                if let Some(unit) = r.source {
                    st.space.end_copy(unit);
                }
            }
            filled?;
            let vol = st.volumes.get(&self.id()).ok_or_else(gone)?;
            // A write or discard that changed a mapping meanwhile would be
            // undone by the switch: start again from the map as it is.
            if redirects
                .iter()
                .any(|r| vol.map.get(&r.piece.vunit).copied() != r.source)
            {
                continue;
            }
            // The switch: one hold of the lock, so one commit takes all of
            // these mappings or none.
            for r in &redirects {
                st.set_mapping(self.id(), r.piece.vunit, Some(r.fresh));
            }
            break;
        }
        if fua {
            pool.flush()?;
        }
        Ok(())
    }

    /// A fresh unit reserved for every unit `len` bytes at `offset` touch,
    /// and each unit they map now marked as being copied. On a full pool,
    /// nothing stays reserved or marked.
    fn take_fresh_units(&self, offset: u64, len: u64) -> io::Result<Vec<Redirect>> {
        let pool = self.pool();
        let mut st = pool.state.write();
        let mut redirects: Vec<Redirect> = Vec::new();
        for piece in pieces(pool.layout.unit_size(), offset, len) {
            let vol = st.volumes.get(&self.id()).ok_or_else(gone)?;
            let source = vol.map.get(&piece.vunit).copied();
            match st.space.reserve() {
                Ok(fresh) => {
                    if let Some(unit) = source {
                        st.space.start_copy(unit);
                    }
                    redirects.push(Redirect {
                        piece,
                        source,
                        fresh,
                    });
                }
                Err(e) => {
                    for r in &redirects {
                        st.space.unreserve(r.fresh);
                        if let Some(unit) = r.source {
                            st.space.end_copy(unit);
                        }
                    }
                    let name = st.volumes[&self.id()].record.name.clone();
                    drop(st);
                    pool.allocation_failed(&name);
                    return Err(e);
                }
            }
        }
        Ok(redirects)
    }
}
