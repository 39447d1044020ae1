//! Repeated eager calls as CUDA graphs, so a call returns in one graph launch instead of
//! dozens of stream operations (copies into staging, flag writes and waits, copies back):
//! those cost the caller's thread 55-130 us at 128 MB, and their cost grows with the bytes
//! the copies move. Training repeats its calls on the same buffers (gradient buckets, the
//! same parameters every step), and so do benchmarks.
//!
//! The second time an engine sees the same call (stream, collective, buffers), it captures
//! the call's stream operations into a graph on a private stream, with flag slots of the
//! captured pool (toggles: `start = 1`, wait `done == 1`, `done = 0`, see `slots.rs`), and
//! keeps it; that time and every later one, the call launches the graph on the caller's
//! stream and queues the call for the progress thread in program order, as an eager call.
//! So the progress thread hands pieces to the channels in the same order on every rank. At
//! most [`CAP`] calls are kept per engine (their slots and graphs held until the engine
//! goes); later new calls stay eager.

use super::pieces::NetOp;
use cudarc::driver::sys;
use parking_lot::Mutex;
use railcc_core::Result;
use railcc_cuda::gpu::Graph;
use std::collections::HashMap;
use std::sync::Arc;

/// Calls remembered per engine (seen once, or kept as a graph).
pub const CAP: usize = 64;

/// A call as the cache knows it: the caller's stream and the call.
pub type Key = (usize, NetOp);

pub enum Entry<C> {
    /// Seen once: the next identical call becomes a graph.
    Seen,
    /// The graph and the call the progress thread runs at each launch.
    Kept { graph: Graph, call: Arc<C> },
}

pub struct Graphs<C> {
    pub map: Mutex<HashMap<Key, Entry<C>>>,
    /// The private stream calls are captured on (never the caller's: capturing it would
    /// capture the caller's other work too).
    pub stream: sys::CUstream,
}

// SAFETY: the stream handle is a plain driver handle, used under the map's lock or by the
// owner; graphs are only launched under the lock.
unsafe impl<C: Send + Sync> Send for Graphs<C> {}
// SAFETY: as above.
unsafe impl<C: Send + Sync> Sync for Graphs<C> {}

impl<C> Graphs<C> {
    /// A cache with its capture stream, in the context bound to this thread.
    pub fn new() -> Result<Graphs<C>> {
        let stream = railcc_cuda::gpu::new_stream_current()?;
        Ok(Graphs {
            map: Mutex::new(HashMap::new()),
            stream,
        })
    }
}

impl<C> Drop for Graphs<C> {
    fn drop(&mut self) {
        self.map.lock().clear();
        // SAFETY: created in new, destroyed once; nothing is captured on it any more.
        unsafe {
            let _ = sys::cuStreamDestroy_v2(self.stream);
        }
    }
}
