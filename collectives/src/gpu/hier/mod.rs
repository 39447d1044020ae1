//! GPU buffers on several hosts of several GPUs each: collectives as a hierarchy, NVLink
//! inside a host and the network between hosts, one network channel per local GPU.
//!
//! - [`plan`]: the schedules as data ([`plan::plan`]), checked on the host against the
//!   reference for many host x GPU shapes;
//! - [`run`]: [`HierGpu`], which enqueues a plan's steps on the caller's stream: local steps
//!   on the per-process NVLink path (`railcc_transport_nvlink::proc::ProcGpu` over the host's
//!   ranks), cross steps on the stream-ordered network engine ([`crate::gpu::net::GpuNet`]
//!   over the ranks of one local index), copies on the stream.

pub mod plan;
pub mod run;

pub use plan::{takes, Layout};
pub use run::HierGpu;
