//! Where a transport listens, moved by a configuration change. The
//! addresses a change adds are bound (and the files it names loaded)
//! before anything is committed, so a change whose address is taken is
//! refused whole; once it is committed they start accepting, and the
//! addresses it dropped stop (the sessions that came through them go on).

/// A transport's listeners, as a change reaches them.
pub trait LiveListeners: Send + Sync {
    /// Binds what `next` adds and loads what it changes; nothing is served
    /// there until [`PreparedListeners::commit`]. The error names the
    /// field and the reason.
    fn prepare(&self, next: &control::Config) -> Result<Box<dyn PreparedListeners>, String>;
}

/// A change bound and ready to go live.
pub trait PreparedListeners: Send {
    /// Starts the new listeners and stops the dropped ones. Needs the I/O
    /// runtime's context.
    fn commit(self: Box<Self>);
}
