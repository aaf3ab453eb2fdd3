//! End-of-life events: streams recorded on live blocks (`record_stream`), the
//! queue of events recorded at free, and a bounded pool of idle events.

/// An event recorded on `stream` when the block in `slot` was freed.
pub(crate) struct PendingEvent<Ev, St> {
    pub(crate) event: Ev,
    pub(crate) slot: u32,
    pub(crate) stream: St,
}

/// A stream that used the live block in `slot` besides its own.
#[derive(Clone, Copy)]
pub(crate) struct StreamUse<St> {
    pub(crate) slot: u32,
    pub(crate) stream: St,
}
