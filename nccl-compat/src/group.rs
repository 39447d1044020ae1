//! ncclGroupStart/End: calls made between them are held per thread and submitted together at
//! the outermost End, so one thread can drive every rank of a communicator without deadlock.

use crate::clique::Call;
use crate::Comm;
use std::cell::RefCell;

pub enum Pending {
    /// A communicator whose init (the bootstrap) runs at the outermost End.
    Init(*const Comm, railcc_core::bootstrap::UniqueId),
    Coll(*const Comm, Call),
    P2p(*const Comm, railcc_core::call::P2pOp),
}

#[derive(Default)]
struct State {
    depth: usize,
    pending: Vec<Pending>,
    /// Outermost groups this thread has closed.
    closed: u64,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

pub fn start() {
    STATE.with(|s| s.borrow_mut().depth += 1);
}

/// Some(pending calls) when this End closes the outermost group; None when still nested, or
/// Err when there was no Start.
pub fn end() -> Result<Option<Vec<Pending>>, ()> {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        if s.depth == 0 {
            return Err(());
        }
        s.depth -= 1;
        if s.depth == 0 {
            s.closed += 1;
        }
        Ok((s.depth == 0).then(|| std::mem::take(&mut s.pending)))
    })
}

pub fn in_group() -> bool {
    STATE.with(|s| s.borrow().depth > 0)
}

/// Which group of this thread the calls made now belong to (counts closed groups).
pub fn generation() -> u64 {
    STATE.with(|s| s.borrow().closed)
}

pub fn defer(p: Pending) {
    STATE.with(|s| s.borrow_mut().pending.push(p));
}
