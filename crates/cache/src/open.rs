//! Opening a cache device: what the backing's label and the cache
//! device's superblock say, whether the cache found there is trusted,
//! formatted or refused, and the start of the device.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use block::BlockDevice;
use parking_lot::{Mutex, RwLock};

use crate::commit::{format, MetaWriter};
use crate::device::{CacheDevice, CacheOptions, FormatPolicy, Inner};
use crate::geometry::Geometry;
use crate::label::{self, Label};
use crate::locks::LineLocks;
use crate::meta::{load_table, read_superblock, Found, Superblock};
use crate::mode::Mode;
use crate::policy::PolicyKind;
use crate::state::State;
use crate::status::Counters;
use crate::stream::Streams;

/// What an open decided that it must also record, once the device is up.
struct Verdict {
    /// Writes only a lost cache device held, given up: the backing's mark
    /// naming that device, and why it is lost.
    lost: Option<(Label, String)>,
    /// This cache device failed while in use, with nothing stranded on
    /// it: the backing has moved on since, so its copies are stale, and
    /// it is formatted anew (losing nothing).
    failed_clean: bool,
}

/// The metadata and mapping the cache starts from.
struct Loaded {
    meta: MetaWriter,
    state: State,
    /// Bytes taken as dirty after an unclean stop.
    unclean_dirty: Option<u64>,
}

impl CacheDevice {
    /// Opens the cache in `cache` over `backing`: warm from its metadata
    /// when it is a cache of this backing, formatted when `options.format`
    /// allows it, refused otherwise.
    pub fn open(
        cache: Arc<dyn BlockDevice>,
        backing: Arc<dyn BlockDevice>,
        options: CacheOptions,
    ) -> io::Result<CacheDevice> {
        let exposed = label::exposed_size(&*backing)?;
        let geo = Geometry::new(cache.size(), exposed, options.line_size)?;
        let fresh = fresh_superblock(&geo, exposed, &options);
        let on_backing = label::read(&*backing)?;
        let mark = on_backing.clone().filter(|l| l.dirty);
        let found = read_cache(&*cache, &options, mark.as_ref())?;
        let mut options = options;
        let verdict = choose_format(
            &*cache,
            &found,
            on_backing.as_ref(),
            mark.as_ref(),
            &mut options,
            exposed,
        )?;
        let Loaded {
            meta,
            state,
            unclean_dirty,
        } = load_or_format(found, &*cache, &geo, &fresh, &options)?;
        let inner = Arc::new(Inner::new(
            (cache, backing),
            geo,
            &options,
            meta,
            state,
            mark.is_some(),
        ));
        let cleared_failure = on_backing.as_ref().is_some_and(|l| l.failed) && mark.is_none();
        inner.record_open(verdict, cleared_failure, unclean_dirty)?;
        CacheDevice::start(inner, &options)
    }

    /// Writes back what a mode other than write-back must not hold, and
    /// starts write-back.
    fn start(inner: Arc<Inner>, options: &CacheOptions) -> io::Result<CacheDevice> {
        let dev = CacheDevice {
            inner,
            worker: Mutex::new(None),
        };
        if options.mode != Mode::WriteBack && dev.inner.dirty_bytes() > 0 {
            dev.inner.flush_dirty(&mut |_| {})?;
        }
        dev.inner.unmark_if_clean()?;
        if options.background {
            *dev.worker.lock() = Some(crate::writeback::spawn(dev.inner.clone()));
        }
        Ok(dev)
    }
}

/// The superblock a format of this cache device writes.
fn fresh_superblock(geo: &Geometry, exposed: u64, options: &CacheOptions) -> Superblock {
    Superblock {
        seq: 0,
        instance: new_instance(),
        line: geo.line,
        slots: geo.slots,
        backing_size: exposed,
        backing_id: options.backing_id.clone(),
        clean: false,
        failed: false,
        mode: options.mode,
    }
}

/// What the cache device holds; unreadable while the backing depends on
/// it, it is lost.
fn read_cache(
    cache: &dyn BlockDevice,
    options: &CacheOptions,
    mark: Option<&Label>,
) -> io::Result<Found> {
    read_superblock(cache).map_err(|e| match mark {
        Some(l) => lost_cache(options, l, format!("it cannot be read: {e}")),
        None => e,
    })
}

/// Sets `options.format` to `Always` where formatting loses nothing, or
/// only writes given up; refuses writes lost without
/// `accept_lost_writes`. `mark`: the backing's label when it is marked
/// as depending on a cache device.
fn choose_format(
    cache: &dyn BlockDevice,
    found: &Found,
    on_backing: Option<&Label>,
    mark: Option<&Label>,
    options: &mut CacheOptions,
    exposed: u64,
) -> io::Result<Verdict> {
    let lost = mark.and_then(|l| lost_writes(cache, found, l));
    if let Some((l, why)) = &lost {
        if !options.accept_lost_writes {
            return Err(lost_cache(options, l, why.clone()));
        }
        // Never the cache of another backing, though.
        let other =
            matches!(found, Found::Superblock { sb, .. } if sb.backing_id != options.backing_id);
        if !other {
            options.format = FormatPolicy::Always;
        }
    }
    let failed_clean = failed_clean(found, on_backing, mark.is_none(), options);
    if failed_clean {
        options.format = FormatPolicy::Always;
    }
    if let Found::Superblock { sb, .. } = found {
        if mark.is_none() && relined_clean(cache, sb, options, exposed)? {
            // Nothing to write back: the cache is formatted for the new
            // line size and warms up again.
            options.format = FormatPolicy::Always;
        }
    }
    Ok(Verdict { lost, failed_clean })
}

/// Why the backing, marked as depending on the cache device `mark` names,
/// is not served by that device: another device is there, or this one
/// failed. Its blocks may then be older than what was acknowledged.
fn lost_writes(cache: &dyn BlockDevice, found: &Found, mark: &Label) -> Option<(Label, String)> {
    let why = match found {
        Found::Superblock { sb, .. }
            if sb.instance == mark.instance && !sb.failed && !mark.failed =>
        {
            return None
        }
        Found::Superblock { sb, .. } if sb.instance == mark.instance => {
            "it failed while in use".to_string()
        }
        Found::Superblock { sb, .. } => format!(
            "{} holds another cache (of {:?}), formatted since",
            cache.describe(),
            sb.backing_id
        ),
        Found::Blank => format!("{} is blank: a new or another device", cache.describe()),
        Found::Garbage => format!("{} holds no cache", cache.describe()),
    };
    Some((mark.clone(), why))
}

/// Whether this cache device failed while in use with nothing stranded
/// on it (see [`Verdict::failed_clean`]).
fn failed_clean(
    found: &Found,
    on_backing: Option<&Label>,
    unmarked: bool,
    options: &CacheOptions,
) -> bool {
    match (found, on_backing) {
        (Found::Superblock { sb, .. }, Some(l)) if unmarked => {
            (sb.failed || l.failed && l.instance == sb.instance)
                && sb.backing_id == options.backing_id
        }
        (Found::Superblock { sb, .. }, None) => sb.failed && sb.backing_id == options.backing_id,
        _ => false,
    }
}

/// The cache as found when it is a cache of this backing (and the policy
/// keeps it), a new format where the policy allows one, or a refusal.
fn load_or_format(
    found: Found,
    cache: &dyn BlockDevice,
    geo: &Geometry,
    fresh: &Superblock,
    options: &CacheOptions,
) -> io::Result<Loaded> {
    let always = options.format == FormatPolicy::Always;
    match found {
        Found::Superblock { sb, copy } => {
            let same = sb.backing_id == fresh.backing_id
                && sb.backing_size == fresh.backing_size
                && sb.line == fresh.line
                && sb.slots == fresh.slots;
            if sb.failed && !always {
                return Err(refused(format!(
                    "{} failed while caching {:?}: the backing may have changed since, \
                     so what it holds is not trusted; format it to use it again",
                    cache.describe(),
                    sb.backing_id
                )));
            }
            if same && !always {
                warm(cache, geo, sb, copy, options.policy)
            } else if always {
                formatted(cache, geo, fresh, options.policy)
            } else {
                Err(refused(format!(
                    "{} holds the cache of {:?} ({} bytes, {}-byte lines, {} lines), \
                     not of {:?} ({} bytes, {}-byte lines, {} lines); refusing to format it",
                    cache.describe(),
                    sb.backing_id,
                    sb.backing_size,
                    sb.line,
                    sb.slots,
                    fresh.backing_id,
                    fresh.backing_size,
                    fresh.line,
                    fresh.slots
                )))
            }
        }
        Found::Blank if options.format != FormatPolicy::Never => {
            formatted(cache, geo, fresh, options.policy)
        }
        Found::Garbage if always => formatted(cache, geo, fresh, options.policy),
        Found::Blank | Found::Garbage => Err(refused(format!(
            "{} is not a cache device; refusing to format it",
            cache.describe()
        ))),
    }
}

/// The cache as its table left it; after an unclean stop every cached
/// block is taken as dirty.
fn warm(
    cache: &dyn BlockDevice,
    geo: &Geometry,
    sb: Superblock,
    copy: usize,
    policy: PolicyKind,
) -> io::Result<Loaded> {
    let table = load_table(cache, geo, sb.instance)?;
    let state = State::from_table(&table.entries, policy, !sb.clean);
    let unclean_dirty = (!sb.clean).then(|| state.dirty_subs * geo.sub);
    let meta = MetaWriter {
        sb,
        sb_copy: copy,
        seq: table.max_seq,
        current_copy: table.current_copy,
    };
    Ok(Loaded {
        meta,
        state,
        unclean_dirty,
    })
}

/// A new, empty cache.
fn formatted(
    cache: &dyn BlockDevice,
    geo: &Geometry,
    fresh: &Superblock,
    policy: PolicyKind,
) -> io::Result<Loaded> {
    Ok(Loaded {
        meta: format(cache, fresh)?,
        state: State::empty(geo.slots, policy),
        unclean_dirty: None,
    })
}

impl Inner {
    /// `devices`: the cache device and the backing; `marked`: the backing
    /// is marked as depending on this cache device.
    fn new(
        devices: (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>),
        geo: Geometry,
        options: &CacheOptions,
        mut meta: MetaWriter,
        state: State,
        marked: bool,
    ) -> Inner {
        let (cache, backing) = devices;
        meta.current_copy.resize(geo.table_blocks as usize, None);
        let instance = meta.sb.instance;
        Inner {
            cache,
            backing,
            geo,
            mode: RwLock::new(options.mode),
            detached: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            state: Mutex::new(state),
            locks: LineLocks::default(),
            meta: Mutex::new(meta),
            streams: Mutex::new(Streams::new(options.sequential_cutoff)),
            counters: Counters::default(),
            events: Mutex::new(VecDeque::new()),
            writeback: Mutex::new(options.writeback),
            writeback_cursor: AtomicU64::new(0),
            writeback_pass: Mutex::new(()),
            flushing: Mutex::new(None),
            started: Instant::now(),
            last_io: AtomicU64::new(0),
            backing_mark: RwLock::new(marked),
            instance,
        }
    }

    /// Marks the cache device in use, so that a stop without `close` is
    /// seen as unclean, and records what the open decided: on the
    /// backing's label, and as events. `cleared_failure`: the backing's
    /// label recorded a failure that no longer holds.
    fn record_open(
        &self,
        verdict: Verdict,
        cleared_failure: bool,
        unclean_dirty: Option<u64>,
    ) -> io::Result<()> {
        self.write_superblock(&mut self.meta.lock(), false)?;
        if verdict.failed_clean || cleared_failure {
            label::write(&*self.backing, &self.label(false))?;
        }
        if verdict.failed_clean {
            self.event(format!(
                "{} failed while in use before: formatted anew (nothing was left on it to \
                 write back, and the backing has moved on since)",
                self.cache.describe()
            ));
        }
        if let Some((l, why)) = verdict.lost {
            self.unmark_if_clean()?;
            self.event(format!(
                "gave up the writes not yet written back that only {} held ({why}): \
                 the backing is served as it is",
                l.cache
            ));
        }
        if let Some(dirty) = unclean_dirty {
            self.event(format!(
                "opened after an unclean stop: every cached block is taken as dirty \
                 ({dirty} bytes to write back)"
            ));
        }
        Ok(())
    }
}

fn refused(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Whether `sb` is a cache of this backing made for another line size
/// that holds nothing not yet written back, so formatting it for the new
/// line size loses no data.
fn relined_clean(
    cache: &dyn BlockDevice,
    sb: &Superblock,
    options: &CacheOptions,
    exposed: u64,
) -> io::Result<bool> {
    // Only after a clean stop: a cache open elsewhere, or stopped
    // uncleanly, is never clean.
    if !sb.clean
        || sb.backing_id != options.backing_id
        || sb.backing_size != exposed
        || sb.line == options.line_size
        || sb.failed
    {
        return Ok(false);
    }
    let old = Geometry::new(cache.size(), exposed, sb.line)?;
    if old.slots != sb.slots {
        return Ok(false);
    }
    let table = load_table(cache, &old, sb.instance)?;
    Ok(table
        .entries
        .iter()
        .all(|(e, _)| e.line.is_none() || e.dirty == 0))
}

/// The refusal to serve a backing whose newest writes are on a cache
/// device that is not there.
fn lost_cache(options: &CacheOptions, l: &Label, why: String) -> io::Error {
    refused(format!(
        "backing {:?} holds writes not yet written back that only cache device {} has, \
         and {why}: the backing alone would serve blocks older than what was \
         acknowledged, so it is not served. Bring that cache device back (a mirrored \
         cache device, a RAID1, survives the loss of one), or give those writes up \
         with accept_lost_writes = true",
        options.backing_id, l.cache
    ))
}

fn new_instance() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}
