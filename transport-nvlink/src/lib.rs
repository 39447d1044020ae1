//! CUDA peer-to-peer transport over NVLink/PCIe (issue 3, in progress).
//!
//! Working today, on one process that drives several GPUs:
//! - [`driver`]: guarded loading of libcuda (no driver is an `Unsupported` error, never a
//!   panic), GPU discovery and the peer-access matrix;
//! - [`kernels`]: copy-free reduce kernels for every dtype and op, compiled by NVRTC for the
//!   device's architecture on first use (f16/bf16 accumulate in f32);
//! - [`multi`]: a stream-ordered all-reduce across the GPUs of one process (two-shot: each GPU
//!   reduces its segment by reading every peer's input over NVLink and writes the result to
//!   every peer's output).
//!
//! Not yet: one process per GPU (IPC handles), the other collectives, graph mode.

pub mod driver;
pub mod kernels;
pub mod multi;

pub const NAME: &str = "nvlink";
