//! Which ranges of an image hold data, for GET LBA STATUS: librbd's diff
//! against nothing lists the extents that exist, whole objects at a time
//! (from the object map, without reading the objects).

use std::ffi::c_void;
use std::io;
use std::ptr;

use block::Allocation;

use crate::errno::check_doing;
use crate::ffi;
use crate::image::Image;

/// Extents that exist, in ascending order, as the diff reports them.
#[derive(Default)]
struct Extents {
    /// Where the question starts: extents are kept only from here.
    from: u64,
    /// (start, length) of each extent with data.
    found: Vec<(u64, u64)>,
}

/// The diff's callback returns this to stop early; not an error.
const ENOUGH: i32 = -libc::ECANCELED;

unsafe extern "C" fn on_extent(offset: u64, len: usize, exists: i32, arg: *mut c_void) -> i32 {
    // SAFETY: `arg` is the `Extents` that `allocation` lends for the call.
    let extents = unsafe { &mut *(arg as *mut Extents) };
    if exists == 0 {
        return 0;
    }
    let (start, len) = (offset, len as u64);
    extents.found.push((start, len));
    // Once a gap follows the first run, later extents change nothing.
    let settled =
        match extents.found.first() {
            Some(&(first, _)) if first > extents.from => true,
            _ => {
                let covered = extents.found[..extents.found.len() - 1].iter().fold(
                    extents.from,
                    |c, &(s, l)| if s <= c { c.max(s + l) } else { c },
                );
                start > covered
            }
        };
    if settled {
        ENOUGH
    } else {
        0
    }
}

/// The state at `offset` and how far it goes, at most `len`, given the
/// extents with data from `offset` on.
fn first_run(found: &[(u64, u64)], offset: u64, len: u64) -> (Allocation, u64) {
    let end = offset + len;
    let mut covered = offset;
    for &(start, l) in found {
        if start > covered {
            break;
        }
        covered = covered.max(start + l);
    }
    if covered > offset {
        return (Allocation::Mapped, covered.min(end) - offset);
    }
    let next = found
        .iter()
        .map(|&(s, _)| s)
        .find(|&s| s > offset)
        .unwrap_or(end);
    (Allocation::Deallocated, next.min(end) - offset)
}

impl Image {
    /// Whether the extent at `offset` holds data (a clone's parent data
    /// counts) and its length, at most `len`.
    pub(crate) fn allocation(&self, offset: u64, len: u64) -> io::Result<(Allocation, u64)> {
        let mut extents = Extents {
            from: offset,
            found: Vec::new(),
        };
        // SAFETY: open image; `extents` outlives the synchronous call.
        let r = unsafe {
            ffi::rbd_diff_iterate2(
                self.handle,
                ptr::null(),
                offset,
                len,
                1,
                1,
                Some(on_extent),
                &mut extents as *mut Extents as *mut c_void,
            )
        };
        if r != ENOUGH {
            check_doing(r as i64, || {
                format!("listing the allocated extents of {}", self.spec)
            })?;
        }
        Ok(first_run(&extents.found, offset, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OBJ: u64 = 4 << 20;

    #[test]
    fn nothing_found_is_one_deallocated_run() {
        assert_eq!(first_run(&[], 100, 1000), (Allocation::Deallocated, 1000));
    }

    #[test]
    fn a_run_of_objects_is_mapped_to_its_end_or_to_len() {
        let found = [(0, OBJ), (OBJ, OBJ), (3 * OBJ, OBJ)];
        assert_eq!(
            first_run(&found, 512, 10 * OBJ),
            (Allocation::Mapped, 2 * OBJ - 512)
        );
        assert_eq!(first_run(&found, 512, 4096), (Allocation::Mapped, 4096));
    }

    #[test]
    fn a_hole_runs_to_the_next_extent() {
        let found = [(3 * OBJ, OBJ)];
        assert_eq!(
            first_run(&found, 2 * OBJ, 10 * OBJ),
            (Allocation::Deallocated, OBJ)
        );
        assert_eq!(
            first_run(&found, 2 * OBJ, 100),
            (Allocation::Deallocated, 100)
        );
    }
}
