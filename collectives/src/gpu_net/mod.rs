//! GPU buffers across the network (ranks that CUDA peer access cannot reach: other hosts).
//!
//! - [`engine`]: [`GpuNet`], the stream-ordered path: a call enqueues flag operations on the
//!   caller's stream and returns; a progress thread and one thread per channel move the data
//!   through pinned staging, pipelined in chunks, and let the stream go on;
//! - [`pieces`]: how a call is cut into chunks and spread over the channels;
//! - [`host`], [`worker`], [`slots`]: the host call of a piece, a channel's thread, the flag
//!   slots and small-message staging;
//! - [`sync`]: [`GpuOverNet`], the older synchronous path (copy, host collective, copy back),
//!   kept for GPUDirect RDMA send/recv of registered buffers (`RAILCC_GPU_DIRECT=1`).

pub mod engine;
pub mod host;
pub mod pieces;
mod slots;
pub mod sync;
mod worker;

pub use engine::GpuNet;
pub use pieces::{NetOp, P2pOp};
pub use sync::GpuOverNet;
