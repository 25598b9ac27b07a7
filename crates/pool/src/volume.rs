//! A volume as a block device, and the data path through the unit map:
//! reads of unmapped units are zeros without I/O, writes to a unit owned
//! by this volume alone go in place, writes to an unmapped or shared unit
//! go to a freshly allocated one (copying the shared content first).

use std::io;
use std::sync::Arc;

use block::{Allocation, AtomicWrites, BlockDevice, Capabilities, MappedBytes};

use crate::pool::Pool;
use crate::record::VolumeKind;
use crate::sending::SendHold;

/// One volume of a pool. Snapshots are read-only.
pub struct VolumeDevice {
    pool: Arc<Pool>,
    id: u64,
    read_only: bool,
}

/// The piece of an I/O that falls in one virtual unit.
pub(crate) struct Piece {
    pub vunit: u64,
    /// Offset inside the unit.
    pub within: u64,
    /// Offset inside the caller's buffer.
    pub at: usize,
    pub len: usize,
}

pub(crate) fn pieces(unit_size: u64, offset: u64, len: u64) -> impl Iterator<Item = Piece> {
    let mut pos = offset;
    let end = offset + len;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let within = pos % unit_size;
        let n = (unit_size - within).min(end - pos);
        let piece = Piece {
            vunit: pos / unit_size,
            within,
            at: (pos - offset) as usize,
            len: n as usize,
        };
        pos += n;
        Some(piece)
    })
}

/// What became of a write to a unit this volume may own alone.
enum InPlace {
    /// Written to a unit whose mapping is committed.
    Done,
    /// Written, but the unit's mapping is not committed yet.
    DoneUncommitted,
    /// The unit is shared or unmapped: the write needs a new unit.
    Shared,
}

pub(crate) fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, "the volume was deleted")
}

impl VolumeDevice {
    pub(crate) fn new(pool: Arc<Pool>, id: u64, read_only: bool) -> VolumeDevice {
        VolumeDevice {
            pool,
            id,
            read_only,
        }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn read_only(&self) -> bool {
        self.read_only
    }

    pub(crate) fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        block::check_range_of("volume", self.size(), offset, len)
    }

    /// Writes one piece if its unit belongs to this volume alone.
    fn write_in_place(&self, p: &Piece, data: &[u8], fua: bool) -> io::Result<InPlace> {
        let st = self.pool.state.read();
        let vol = st.volumes.get(&self.id).ok_or_else(gone)?;
        match vol.map.get(&p.vunit) {
            Some(&unit) if st.space.exclusive(unit) => {
                self.pool.layout.write(unit, p.within, data, fua)?;
                if st.space.is_committed(unit) {
                    Ok(InPlace::Done)
                } else {
                    Ok(InPlace::DoneUncommitted)
                }
            }
            _ => Ok(InPlace::Shared),
        }
    }

    /// Writes one piece into a newly allocated unit: zeros around it for an
    /// unmapped unit, the shared unit's bytes around it otherwise (a
    /// copy-on-write). The unit is filled without the pool's lock, so
    /// other I/O goes on during the copy; meanwhile the shared unit is
    /// marked as being copied (`Space::start_copy`), so that nothing
    /// writes it in place. The new unit is mapped only if the piece's
    /// mapping is still the one copied; if another write or a discard
    /// changed it meanwhile, the write goes through the map again.
    fn write_allocating(&self, p: &Piece, data: &[u8]) -> io::Result<()> {
        let layout = &self.pool.layout;
        loop {
            let (source, new) = {
                let mut st = self.pool.state.write();
                let vol = st.volumes.get(&self.id).ok_or_else(gone)?;
                let source = vol.map.get(&p.vunit).copied();
                if source.is_some_and(|unit| st.space.exclusive(unit)) {
                    drop(st);
                    match self.write_in_place(p, data, false)? {
                        InPlace::Shared => continue,
                        InPlace::Done | InPlace::DoneUncommitted => return Ok(()),
                    }
                }
                let new = match st.space.reserve() {
                    Ok(unit) => unit,
                    Err(e) => {
                        let name = st.volumes[&self.id].record.name.clone();
                        drop(st);
                        self.pool.allocation_failed(&name);
                        return Err(e);
                    }
                };
                if let Some(unit) = source {
                    st.space.start_copy(unit);
                }
                (source, new)
            };
            let filled = match source {
                Some(unit) => layout.fill_copy(unit, new, p.within, data),
                None => layout.fill_fresh(new, p.within, data),
            };
            let mut st = self.pool.state.write();
            st.space.unreserve(new);
            if let Some(unit) = source {
                st.space.end_copy(unit);
            }
            filled?;
            let vol = st.volumes.get(&self.id).ok_or_else(gone)?;
            if vol.map.get(&p.vunit).copied() != source {
                continue;
            }
            st.set_mapping(self.id, p.vunit, Some(new));
            return Ok(());
        }
    }

    /// Drops the mapping of a whole unit.
    fn unmap(&self, vunit: u64) -> io::Result<()> {
        let mut st = self.pool.state.write();
        if !st.volumes.contains_key(&self.id) {
            return Err(gone());
        }
        st.set_mapping(self.id, vunit, None);
        Ok(())
    }

    /// `copy_from` for a source in this pool with the same alignment.
    fn share_range(
        &self,
        src: &VolumeDevice,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> io::Result<()> {
        src.check(src_offset, len)?;
        self.check(dst_offset, len)?;
        let unit_size = self.pool.layout.unit_size();
        let delta = dst_offset as i128 - src_offset as i128;
        let mut whole = Vec::new();
        for p in pieces(unit_size, src_offset, len) {
            if p.len as u64 == unit_size {
                whole.push(p.vunit);
            } else {
                let at = p.vunit * unit_size + p.within;
                let mut buf = vec![0u8; p.len];
                src.read_at(&mut buf, at)?;
                self.write_at(&buf, (at as i128 + delta) as u64, false)?;
            }
        }
        let (Some(&first), Some(&last)) = (whole.first(), whole.last()) else {
            return Ok(());
        };
        let dst_first = (first as i128 + delta / i128::from(unit_size)) as u64;
        let mut st = self.pool.state.write();
        let source = st.volumes.get(&src.id).ok_or_else(gone)?;
        let units: Vec<Option<u64>> = (first..=last)
            .map(|v| source.map.get(&v).copied())
            .collect();
        if !st.volumes.contains_key(&self.id) {
            return Err(gone());
        }
        for (i, unit) in units.into_iter().enumerate() {
            // Like a write, the new mappings commit with the next flush.
            st.set_mapping(self.id, dst_first + i as u64, unit);
        }
        Ok(())
    }

    fn is_mapped(&self, vunit: u64) -> io::Result<bool> {
        let st = self.pool.state.read();
        let vol = st.volumes.get(&self.id).ok_or_else(gone)?;
        Ok(vol.map.contains_key(&vunit))
    }
}

impl BlockDevice for VolumeDevice {
    fn size(&self) -> u64 {
        let st = self.pool.state.read();
        st.volumes.get(&self.id).map_or(0, |v| v.record.size)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        let st = self.pool.state.read();
        let vol = st.volumes.get(&self.id).ok_or_else(gone)?;
        let unit_size = self.pool.layout.unit_size();
        for p in pieces(unit_size, offset, buf.len() as u64) {
            let out = &mut buf[p.at..p.at + p.len];
            match vol.map.get(&p.vunit) {
                Some(&unit) => self.pool.layout.read(unit, p.within, out)?,
                None => out.fill(0),
            }
        }
        Ok(())
    }

    /// A READ of mapped units, sent from their pages where the data device
    /// can (a file in memory): each unit is held until they are sent, so
    /// it cannot be freed and reused under them (sending.rs). A READ across
    /// a unit boundary goes this way too when the next unit follows on the
    /// device, as units written in order usually do.
    fn mapped_bytes(&self, offset: u64, len: usize) -> Option<MappedBytes> {
        let layout = &self.pool.layout;
        let unit_size = layout.unit_size();
        let vunit = offset / unit_size;
        let within = offset % unit_size;
        let end = within + len as u64;
        let st = self.pool.state.read();
        let map = &st.volumes.get(&self.id)?.map;
        let unit = *map.get(&vunit)?;
        let next = if end <= unit_size {
            None
        } else {
            let next = *map.get(&(vunit + 1))?;
            if end > 2 * unit_size || !layout.follows(unit, next) {
                return None;
            }
            Some(next)
        };
        let bytes = layout.mapped_bytes(unit, within, len)?;
        // Taken while the state lock keeps the units mapped.
        let holds = (
            SendHold::new(self.pool.clone(), unit),
            next.map(|next| SendHold::new(self.pool.clone(), next)),
        );
        drop(st);
        Some(bytes.holding(Box::new(holds)))
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        self.check(offset, buf.len() as u64)?;
        let unit_size = self.pool.layout.unit_size();
        // Whether a mapping this write relies on is not committed yet.
        let mut uncommitted = false;
        for p in pieces(unit_size, offset, buf.len() as u64) {
            let data = &buf[p.at..p.at + p.len];
            match self.write_in_place(&p, data, fua)? {
                InPlace::Done => {}
                InPlace::DoneUncommitted => uncommitted = true,
                InPlace::Shared => {
                    self.write_allocating(&p, data)?;
                    uncommitted = true;
                }
            }
        }
        if fua && uncommitted {
            // The mappings must be as durable as the data.
            self.pool.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.pool.flush()
    }

    /// By redirect-on-write (atomic.rs).
    fn atomic_writes(&self) -> Option<AtomicWrites> {
        self.atomic_limits()
    }

    fn write_atomic(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.write_redirected(buf, offset, fua)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        self.check(offset, len)?;
        let size = self.size();
        let unit_size = self.pool.layout.unit_size();
        for p in pieces(unit_size, offset, len) {
            let unit_end = (p.vunit + 1) * unit_size;
            let piece_end = p.vunit * unit_size + p.within + p.len as u64;
            if p.within == 0 && (piece_end == unit_end || piece_end >= size) {
                self.unmap(p.vunit)?;
            } else if self.is_mapped(p.vunit)? {
                // Part of a unit: it must read as zeros afterwards.
                let zeros = vec![0u8; p.len];
                let at = p.vunit * unit_size + p.within;
                self.write_at(&zeros, at, false)?;
            }
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.discard(offset, len)
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<(Allocation, u64)> {
        self.check(offset, len)?;
        let st = self.pool.state.read();
        let vol = st.volumes.get(&self.id).ok_or_else(gone)?;
        let unit_size = self.pool.layout.unit_size();
        let state_of = |vunit: u64| {
            if vol.map.contains_key(&vunit) {
                Allocation::Mapped
            } else {
                Allocation::Deallocated
            }
        };
        let first = state_of(offset / unit_size);
        let mut extent = 0;
        for p in pieces(unit_size, offset, len) {
            if state_of(p.vunit) != first {
                break;
            }
            extent += p.len as u64;
        }
        Ok((first, extent))
    }

    fn granularity(&self) -> u64 {
        self.pool.layout.unit_size()
    }

    /// Another volume of the same pool, at the same offset within a unit:
    /// whole units are shared copy-on-write (a count more, no data moved),
    /// the partial units at either end are copied. Anything else (another
    /// pool or device, different alignment, overlap within one volume) is
    /// left to the caller.
    fn copy_from(
        &self,
        src: &dyn BlockDevice,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> Option<io::Result<()>> {
        let src = src.as_any()?.downcast_ref::<VolumeDevice>()?;
        let unit_size = self.pool.layout.unit_size();
        if self.read_only
            || !Arc::ptr_eq(&self.pool, &src.pool)
            || src_offset % unit_size != dst_offset % unit_size
        {
            return None;
        }
        let overlaps = src_offset < dst_offset.saturating_add(len)
            && dst_offset < src_offset.saturating_add(len);
        if src.id == self.id && overlaps {
            return None;
        }
        Some(self.share_range(src, src_offset, dst_offset, len))
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn space_threshold(&self) -> Option<Arc<block::SpaceThreshold>> {
        Some(self.pool.space_threshold())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            thin: true,
            volatile_cache: true,
            may_block: self.pool.may_block(),
            discard_zeroes: true,
            discard: !self.read_only,
            read_only: self.read_only,
        }
    }

    fn describe(&self) -> String {
        let st = self.pool.state.read();
        let name = st
            .volumes
            .get(&self.id)
            .map_or("<deleted>".to_string(), |v| v.record.name.clone());
        let kind = match st.volumes.get(&self.id).map(|v| v.record.kind) {
            Some(VolumeKind::Snapshot) => "snapshot",
            _ => "volume",
        };
        format!("{kind}:{}/{name}", self.pool.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_at_unit_boundaries() {
        let ps: Vec<(u64, u64, usize, usize)> = pieces(100, 150, 220)
            .map(|p| (p.vunit, p.within, p.at, p.len))
            .collect();
        assert_eq!(ps, vec![(1, 50, 0, 50), (2, 0, 50, 100), (3, 0, 150, 70)]);
        assert_eq!(pieces(100, 0, 0).count(), 0);
    }
}
