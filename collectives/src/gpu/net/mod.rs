//! GPU buffers across the network (ranks that CUDA peer access cannot reach: other hosts).
//!
//! - [`engine`]: [`GpuNet`], the stream-ordered path: a call launches the staging kernel (or
//!   puts copies and flag operations) on the caller's stream and returns (`engine/ops.rs`); a
//!   progress thread (`engine/progress.rs`) and one thread per channel run the host side of
//!   each piece and let the stream go on;
//! - [`pieces`]: how a call is cut into pieces and spread over the channels;
//! - [`host`], `worker`, `ring`, `slots`, `tables`, `trace`, `warm`: a piece's host call, a
//!   channel's thread, the staging ring, the flag slots, the staging kernel's entry tables
//!   (`RAILCC_GPU_NET_TABLE`), where the time goes (`RAILCC_GPU_NET_TRACE`), the channels'
//!   warm-up at init.

pub mod engine;
pub mod host;
pub mod pieces;
mod ring;
mod slots;
mod tables;
mod trace;
mod warm;
mod worker;

pub use engine::GpuNet;
pub use pieces::{NetOp, P2pOp};
pub use ring::Rings;
