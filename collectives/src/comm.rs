//! The Communicator: one rank's handle on a job. `Send + Sync`; calls from several threads
//! are serialized. After any failure the communicator is broken: it closes its connections
//! (so peers learn of it at once) and every later call returns the same error.
//!
//! One file per concern: `init` (joining a job) and `transport` (RDMA or TCP), `register`
//! (registered memory), `algo` (algorithm choice), `checks` (argument checks), `run` (plans
//! and the executor), `typed` (the typed API).

mod algo;
mod checks;
mod init;
mod register;
mod run;
mod transport;
mod typed;

pub(crate) use init::{host_id, process_id};

use crate::conn::Connections;
use crate::cost::{HostEffects, Link, Machine};
use crate::exec::{Buffers, Compiled, Exec, RawBuf, Workspace};
use crate::plan::{build_ordered, group_plan, host_order, Algo, CollArgs, P2pKind, PlanOpts};
use crate::regions::{RegionId, Regions};
use parking_lot::Mutex;
use railcc_core::bootstrap::{unspecified_like, Bootstrap, RootServer, UniqueId};
use railcc_core::call::CollKind;
use railcc_core::config::AlgoChoice;
use railcc_core::launch;
use railcc_core::net::{MsgTag, NetTransport};
use railcc_core::{netif, Config, DataType, Element, Error, ErrorKind, ReduceOp, Result};
use railcc_transport_rdma::{RdmaTransport, RdmaTuning};
use railcc_transport_tcp::{TcpSettings, TcpTransport};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Compiled plans by call shape: a repeated call (the common case in training loops) skips
/// planning entirely.
type PlanKey = (CollArgs, Algo, usize, usize, bool);
const PLAN_CACHE_MAX: usize = 256;

struct State {
    conns: Connections,
    plans: HashMap<PlanKey, Arc<Compiled>>,
    ws: Workspace,
    bootstrap: Bootstrap,
    op_seq: u64,
    scratch: Vec<u64>,
    /// The scratch buffer's registration (re-made when the buffer grows).
    scratch_region: Option<RegionId>,
    regions: Regions,
    broken: Option<Error>,
}

pub struct Communicator {
    rank: usize,
    nranks: usize,
    cfg: Config,
    iface: String,
    iface_ip: std::net::IpAddr,
    /// What carries the data, for logs and bench headers ("tcp over lo", "rdma rxe0:1 ...").
    transport_desc: String,
    state: Mutex<State>,
    abort: Arc<AtomicBool>,
    /// Why the communicator was aborted, when the caller said ([`Communicator::abort_with`]).
    abort_why: parking_lot::Mutex<Option<Error>>,
    spin: Duration,
    local_ranks: usize,
    /// Rings visit ranks in this order: each host's ranks together ([`host_order`]).
    ring_order: Vec<usize>,
    /// Hosts in the job, for the cost model.
    nodes: usize,
    /// Ranks per host when every host holds the same number (the hierarchical plans need it).
    per_host: Option<usize>,
    /// The cost model's choice per size bucket.
    algo_cache: Mutex<HashMap<u32, Algo>>,
    _root: Option<RootServer>,
}

/// Buffers of one call, as bytes: separate, or one buffer for an in-place call.
pub enum Bufs<'a> {
    OutOfPlace { send: &'a [u8], recv: &'a mut [u8] },
    InPlace(&'a mut [u8]),
}

/// One operation of a grouped send/recv (see [`Communicator::group`]).
pub enum P2p<'a, T> {
    Send { peer: usize, buf: &'a [T] },
    Recv { peer: usize, buf: &'a mut [T] },
}

impl Communicator {
    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// How long a waiting rank busy-polls before it sleeps (zero where ranks outnumber cores).
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// How many ranks of this job run on this host.
    pub fn local_ranks(&self) -> usize {
        self.local_ranks
    }

    /// The interface the sockets use.
    pub fn interface(&self) -> &str {
        &self.iface
    }

    /// The address of that interface.
    pub fn interface_ip(&self) -> std::net::IpAddr {
        self.iface_ip
    }

    /// The transport in use and its device, e.g. `rdma rxe0:1 Ethernet GID[1] ...`.
    pub fn transport(&self) -> &str {
        &self.transport_desc
    }

    /// Unblocks every waiter within milliseconds and breaks the communicator. Callable from any
    /// thread, even while another thread is inside a collective.
    pub fn abort(&self) {
        self.abort.store(true, Ordering::Relaxed);
    }

    /// As [`Communicator::abort`], with `why` as the error every waiter gets and the reason the
    /// peers hear (so a failure seen here, such as a GPU peer's death, travels on).
    pub fn abort_with(&self, why: Error) {
        self.abort_why.lock().get_or_insert(why);
        self.abort();
    }

    /// The error that broke this communicator, if any (like `ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Option<Error> {
        if self.abort.load(Ordering::Relaxed) {
            if let Some(why) = self.abort_why.lock().clone() {
                return Some(why);
            }
            return Some(Error::new(ErrorKind::Aborted, "communicator aborted").rank(self.rank));
        }
        self.state.lock().broken.clone()
    }

    fn check_usable(&self, st: &State) -> Result<()> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(Error::new(ErrorKind::Aborted, "communicator was aborted").rank(self.rank));
        }
        if let Some(e) = &st.broken {
            return Err(Error::new(
                ErrorKind::Aborted,
                format!("communicator is broken by an earlier error: {e}"),
            )
            .rank(self.rank));
        }
        Ok(())
    }

    /// Out-of-band all-gather over the bootstrap ring (setup-time data, not bulk data).
    pub fn oob_all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.state.lock().bootstrap.all_gather(mine)
    }
}

// The raw pointers inside the state are only used while the mutex is held, during a call.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Communicator>();
};

/// Cores this process may run on (1 when unknown).
fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
