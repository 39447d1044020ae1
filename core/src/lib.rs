//! railcc-core: the types every other crate shares. It knows nothing of CUDA or verbs.
//!
//! - [`call`]: one collective call (kind, arguments, buffers, stream) and point-to-point ops.
//! - [`dtype`]: element types and reduction operators.
//! - [`agree`]: every rank learns every rank's setup outcome (one record encoding).
//! - [`error`]: the one error type, carrying rank, peer, operation and transport.
//! - [`config`]: all tunables, from code or `RAILCC_*` variables.
//! - [`auth`]: the secret-proving handshake used by bootstrap and transports.
//! - [`bootstrap`]: unique id, rendezvous, out-of-band all-gather and barrier.
//! - [`launch`]: rank discovery from torchrun, Open MPI, Slurm and PMI variables.
//! - [`net`]: the network-transport interface (NCCL net-plugin shape).
//! - [`netif`]: choosing the socket interface.
//! - [`topo`]: topology discovery, path classes and rail choice.

pub mod agree;
pub mod auth;
pub mod bootstrap;
pub mod call;
pub mod config;
pub mod dtype;
pub mod error;
pub mod handshake;
pub mod launch;
pub mod nccl_env;
pub mod net;
pub mod netif;
pub mod topo;
pub mod wire;

pub use config::Config;
pub use dtype::{DataType, Element, ReduceOp};
pub use error::{Error, ErrorKind, Result};
