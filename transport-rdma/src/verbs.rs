//! The ibverbs calls railcc uses, each behind a small owner type that frees its resource on
//! drop. Every `unsafe` block of the crate that touches verbs lives here.

use railcc_core::{Error, ErrorKind, Result};
use rdma_sys::*;
use std::ffi::CStr;
use std::sync::Arc;

/// `IBV_LINK_LAYER_ETHERNET` (verbs.h; a #define bindgen does not carry over).
const LINK_LAYER_ETHERNET: u8 = 2;

pub(crate) fn os_err(what: &str) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("{what}: {}", std::io::Error::last_os_error()),
    )
    .transport(crate::NAME)
}

/// One verbs device opened with a protection domain, on one port and GID.
pub struct Ctx {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    pub name: String,
    pub port: u8,
    pub gid_index: u8,
    pub gid: [u8; 16],
    pub lid: u16,
    pub mtu: u32,
    pub ethernet: bool,
    pub tuning: RdmaTuning,
}

/// Settings from the config: how long an RC queue pair waits for an acknowledgement before it
/// resends (4.096 µs × 2^`timeout`) and how many times (NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT);
/// messages up to `eager_bytes` go through registered staging slots; a connection this side
/// opens has `qps_per_conn` queue pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaTuning {
    pub timeout: u8,
    pub retry_cnt: u8,
    pub eager_bytes: usize,
    pub qps_per_conn: u8,
    /// With several rails: a queue pair that fails (its port went down) hands its pieces to
    /// the others instead of failing the connection (RAILCC_RAIL_FAILOVER).
    pub failover: bool,
    /// The GRH's traffic class on RoCE (RAILCC_IB_TC / NCCL_IB_TC).
    pub traffic_class: u8,
    /// The service level (RAILCC_IB_SL / NCCL_IB_SL).
    pub service_level: u8,
}

// SAFETY: verbs objects may be used from any thread (libibverbs is thread-safe); Ctx is
// immutable after open.
unsafe impl Send for Ctx {}
unsafe impl Sync for Ctx {}

impl Ctx {
    /// Opens device `name` on `port`, using GID `gid_index` (RoCE) or the LID (InfiniBand).
    pub fn open(name: &str, port: u8, gid_index: u8, tuning: RdmaTuning) -> Result<Arc<Ctx>> {
        let mut n = 0;
        // SAFETY: valid out-pointer; the list is freed below after we opened our device.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(os_err("ibv_get_device_list"));
        }
        let mut ctx = std::ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: `list` has `n` valid entries; names are NUL-terminated.
            let (dev, dn) = unsafe {
                let dev = *list.add(i);
                (
                    dev,
                    CStr::from_ptr(ibv_get_device_name(dev)).to_string_lossy(),
                )
            };
            if dn == name {
                // SAFETY: `dev` comes from the live list.
                ctx = unsafe { ibv_open_device(dev) };
                break;
            }
        }
        // SAFETY: the list came from ibv_get_device_list; opened contexts stay valid.
        unsafe { ibv_free_device_list(list) };
        if ctx.is_null() {
            return Err(os_err(&format!("open RDMA device {name}")));
        }
        let mut c = Ctx {
            ctx,
            pd: std::ptr::null_mut(),
            name: name.to_string(),
            port,
            gid_index,
            gid: [0; 16],
            lid: 0,
            mtu: 0,
            ethernet: false,
            tuning,
        };
        // SAFETY: `ctx` is open; out-structures are plain data, zero-initialized.
        unsafe {
            c.pd = ibv_alloc_pd(ctx);
            if c.pd.is_null() {
                return Err(os_err(&format!("{name}: ibv_alloc_pd")));
            }
            let mut pa: ibv_port_attr = std::mem::zeroed();
            if ___ibv_query_port(ctx, port, &mut pa) != 0 {
                return Err(os_err(&format!("{name}: query port {port}")));
            }
            c.lid = pa.lid;
            c.mtu = pa.active_mtu;
            c.ethernet = pa.link_layer == LINK_LAYER_ETHERNET;
            let mut g: ibv_gid = std::mem::zeroed();
            if ibv_query_gid(ctx, port, gid_index as i32, &mut g) != 0 {
                return Err(os_err(&format!("{name}: query GID {gid_index}")));
            }
            c.gid = g.raw;
        }
        Ok(Arc::new(c))
    }

    pub fn reg(self: &Arc<Self>, addr: usize, len: usize) -> Result<Mr> {
        let access = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
            .0 as i32;
        // SAFETY: the caller keeps `addr..addr+len` allocated while the Mr lives (Mr's owners
        // guarantee it); the pd is live.
        let mr = unsafe { ibv_reg_mr(self.pd, addr as *mut _, len.max(1), access) };
        if mr.is_null() {
            return Err(os_err(&format!(
                "{}: ibv_reg_mr of {len} bytes (is the memlock limit too low?)",
                self.name
            )));
        }
        // SAFETY: `mr` is a live registration.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Mr {
            mr,
            addr,
            len,
            lkey,
            rkey,
            _ctx: self.clone(),
        })
    }
}

impl Ctx {
    /// Registers GPU memory exported as dma-buf `fd` (`len` bytes from `offset` in it), so
    /// the NIC reads and writes it directly (GPUDirect RDMA). `iova` is the address work
    /// requests use for its first byte: the device address, so remote writes name it as they
    /// would a host buffer.
    pub fn reg_dmabuf(
        self: &Arc<Self>,
        fd: i32,
        offset: u64,
        len: usize,
        iova: usize,
    ) -> Result<Mr> {
        let access = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
            .0 as i32;
        // SAFETY: the pd is live; the kernel checks the fd and range and takes its own
        // reference on the dma-buf, so the registration outlives neither the memory's owner
        // (who drops the Mr before freeing) nor anything we hold.
        let mr = unsafe { ibv_reg_dmabuf_mr(self.pd, offset, len.max(1), iova as u64, fd, access) };
        if mr.is_null() {
            return Err(os_err(&format!(
                "{}: ibv_reg_dmabuf_mr of {len} bytes of GPU memory (GPUDirect RDMA through \
                 dma-buf unsupported by this device or kernel?)",
                self.name
            )));
        }
        // SAFETY: `mr` is a live registration.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Mr {
            mr,
            addr: iova,
            len,
            lkey,
            rkey,
            _ctx: self.clone(),
        })
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: created in `open`, released once; every Mr/Qp holds an Arc so they are gone.
        unsafe {
            if !self.pd.is_null() {
                ibv_dealloc_pd(self.pd);
            }
            ibv_close_device(self.ctx);
        }
    }
}

/// A registered memory region.
pub struct Mr {
    mr: *mut ibv_mr,
    pub addr: usize,
    pub len: usize,
    pub lkey: u32,
    pub rkey: u32,
    _ctx: Arc<Ctx>,
}

// SAFETY: a registration is a kernel object usable from any thread.
unsafe impl Send for Mr {}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered in `Ctx::reg`, deregistered once.
        unsafe {
            ibv_dereg_mr(self.mr);
        }
    }
}

/// What a peer needs to connect its queue pair to ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    pub mtu: u32,
}

pub const QP_INFO_BYTES: usize = 30;

impl QpInfo {
    pub fn encode(&self) -> [u8; QP_INFO_BYTES] {
        let mut b = [0u8; QP_INFO_BYTES];
        b[0..4].copy_from_slice(&self.qpn.to_le_bytes());
        b[4..8].copy_from_slice(&self.psn.to_le_bytes());
        b[8..10].copy_from_slice(&self.lid.to_le_bytes());
        b[10..26].copy_from_slice(&self.gid);
        b[26..30].copy_from_slice(&self.mtu.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; QP_INFO_BYTES]) -> Result<QpInfo> {
        let u32at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[10..26]);
        let info = QpInfo {
            qpn: u32at(0),
            psn: u32at(4) & 0xff_ffff,
            lid: u16::from_le_bytes([b[8], b[9]]),
            gid,
            mtu: u32at(26),
        };
        if info.qpn == 0 || info.qpn > 0xff_ffff || !(1..=5).contains(&info.mtu) {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("rdma: bad queue-pair info from peer: {info:?}"),
            )
            .transport(crate::NAME));
        }
        Ok(info)
    }
}

/// An RC queue pair with its own completion queue, and the completion channel whose file
/// descriptor lets a sleeping rank wake the moment a completion arrives.
pub struct Qp {
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
    pub ctx: Arc<Ctx>,
    pub depth: u32,
}

// SAFETY: a QP is used by one comm at a time (comms are Send, not Sync).
unsafe impl Send for Qp {}

/// Completion of one work request.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    pub wr_id: u64,
    pub ok: bool,
    pub status: &'static str,
    pub opcode: u32,
    pub byte_len: u32,
    pub imm: Option<u32>,
}

impl Qp {
    /// Creates the CQ and QP and moves the QP to INIT.
    pub fn new(ctx: &Arc<Ctx>, depth: u32) -> Result<Qp> {
        // SAFETY: the context and pd are live; init structures are plain data.
        unsafe {
            let channel = ibv_create_comp_channel(ctx.ctx);
            if channel.is_null() {
                return Err(os_err(&format!("{}: ibv_create_comp_channel", ctx.name)));
            }
            // Non-blocking, so draining events never sleeps.
            let fd = (*channel).fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
                let e = os_err(&format!("{}: completion channel O_NONBLOCK", ctx.name));
                ibv_destroy_comp_channel(channel);
                return Err(e);
            }
            let cq = ibv_create_cq(
                ctx.ctx,
                (2 * depth) as i32,
                std::ptr::null_mut(),
                channel,
                0,
            );
            if cq.is_null() {
                let e = os_err(&format!("{}: ibv_create_cq", ctx.name));
                ibv_destroy_comp_channel(channel);
                return Err(e);
            }
            let mut init: ibv_qp_init_attr = std::mem::zeroed();
            init.send_cq = cq;
            init.recv_cq = cq;
            init.qp_type = ibv_qp_type::IBV_QPT_RC;
            init.cap.max_send_wr = depth;
            init.cap.max_recv_wr = depth;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            let qp = ibv_create_qp(ctx.pd, &mut init);
            if qp.is_null() {
                let e = os_err(&format!("{}: ibv_create_qp", ctx.name));
                ibv_destroy_cq(cq);
                ibv_destroy_comp_channel(channel);
                return Err(e);
            }
            let q = Qp {
                qp,
                cq,
                channel,
                ctx: ctx.clone(),
                depth,
            };
            let mut a: ibv_qp_attr = std::mem::zeroed();
            a.qp_state = ibv_qp_state::IBV_QPS_INIT;
            a.pkey_index = 0;
            a.port_num = ctx.port;
            a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
                .0;
            let mask = ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                | ibv_qp_attr_mask::IBV_QP_PORT
                | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
            q.modify(&mut a, mask, "INIT")?;
            Ok(q)
        }
    }

    pub fn info(&self, psn: u32) -> QpInfo {
        QpInfo {
            // SAFETY: the QP is live.
            qpn: unsafe { (*self.qp).qp_num },
            psn: psn & 0xff_ffff,
            lid: self.ctx.lid,
            gid: self.ctx.gid,
            mtu: self.ctx.mtu,
        }
    }

    /// Moves the queue pair to the error state: it sends and accepts nothing more, and its
    /// outstanding work requests come back flushed (a rail given up on).
    pub fn set_error(&self) -> Result<()> {
        // SAFETY: a zeroed attribute struct is valid; only the state is set.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE, "ERR")
    }

    fn modify(&self, a: &mut ibv_qp_attr, mask: ibv_qp_attr_mask, state: &str) -> Result<()> {
        // SAFETY: the QP is live; `a` is a valid attribute struct.
        let r = unsafe { ibv_modify_qp(self.qp, a, mask.0 as i32) };
        if r != 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "{}: moving the queue pair to {state} failed: {}",
                    self.ctx.name,
                    std::io::Error::from_raw_os_error(r)
                ),
            )
            .transport(crate::NAME));
        }
        Ok(())
    }

    /// Connects to `remote` (RTR, then RTS with our send PSN `psn`).
    pub fn connect(&self, remote: &QpInfo, psn: u32) -> Result<()> {
        // SAFETY: plain-data attribute structs, zero-initialized.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = remote.mtu.min(self.ctx.mtu);
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.port_num = self.ctx.port;
        a.ah_attr.sl = self.ctx.tuning.service_level;
        if self.ctx.ethernet {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
            a.ah_attr.grh.sgid_index = self.ctx.gid_index;
            a.ah_attr.grh.hop_limit = 64;
            a.ah_attr.grh.traffic_class = self.ctx.tuning.traffic_class;
        } else {
            a.ah_attr.dlid = remote.lid;
        }
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut a, mask, "RTR")?;
        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        // A dead peer shows at once on the control socket, so the resend timer need not be
        // short; short ones fire spuriously on a loaded host (and Soft-RoCE's resend path has
        // stalled under that in our VM tests).
        a.timeout = self.ctx.tuning.timeout;
        a.retry_cnt = self.ctx.tuning.retry_cnt;
        a.rnr_retry = 7; // receiver not ready: retry forever (bounded by our deadlines)
        a.sq_psn = psn & 0xff_ffff;
        a.max_rd_atomic = 1;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, mask, "RTS")
    }

    /// Posts a receive of up to `len` bytes at `addr` (`len` 0: a receive that only takes an
    /// immediate).
    pub fn post_recv(&self, wr_id: u64, addr: usize, len: u32, lkey: u32) -> Result<()> {
        let mut sge = ibv_sge {
            addr: addr as u64,
            length: len,
            lkey,
        };
        let mut wr = ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: if len > 0 { 1 } else { 0 },
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: `wr` and `sge` live across the call (the driver copies them); the buffer is
        // registered memory kept by the caller until the completion.
        let r = unsafe { ibv_post_recv(self.qp, &mut wr, &mut bad) };
        if r != 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "{}: ibv_post_recv: {}",
                    self.ctx.name,
                    std::io::Error::from_raw_os_error(r)
                ),
            )
            .transport(crate::NAME));
        }
        Ok(())
    }

    /// Posts a SEND (`remote` None) or RDMA WRITE to (addr, rkey), with an immediate when
    /// `imm` is set; signaled when `signaled`.
    #[allow(clippy::too_many_arguments)]
    pub fn post_send(
        &self,
        wr_id: u64,
        addr: usize,
        len: u32,
        lkey: u32,
        remote: Option<(u64, u32)>,
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<()> {
        let mut sge = ibv_sge {
            addr: addr as u64,
            length: len,
            lkey,
        };
        // SAFETY: plain-data work request, zero-initialized, then filled.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = if len > 0 { 1 } else { 0 };
        wr.opcode = match (remote.is_some(), imm.is_some()) {
            (true, true) => ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
            (true, false) => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            (false, true) => ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
            (false, false) => ibv_wr_opcode::IBV_WR_SEND,
        };
        wr.send_flags = if signaled {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        if let Some(i) = imm {
            wr.imm_data_invalidated_rkey_union.imm_data = i.to_be();
        }
        if let Some((raddr, rkey)) = remote {
            wr.wr.rdma = rdma_sys::rdma_t {
                remote_addr: raddr,
                rkey,
            };
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: `wr` and `sge` live across the call; buffers are registered and kept by the
        // caller until the completion (or, unsignaled, until a later signaled one).
        let r = unsafe { ibv_post_send(self.qp, &mut wr, &mut bad) };
        if r != 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "{}: ibv_post_send: {}",
                    self.ctx.name,
                    std::io::Error::from_raw_os_error(r)
                ),
            )
            .transport(crate::NAME));
        }
        Ok(())
    }

    /// The completion channel's descriptor: readable once a completion arrives after [`Qp::arm`].
    pub fn event_fd(&self) -> std::os::fd::RawFd {
        // SAFETY: the channel is live for the QP's lifetime.
        unsafe { (*self.channel).fd }
    }

    /// Before sleeping: consumes the events already signalled and asks for one on the next
    /// completion. A completion that lands between the caller's last poll and this call
    /// raises no event; the caller's sleep is bounded, so it costs at most one timeout.
    pub fn arm(&self) {
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the channel and CQ are live; the fd is non-blocking, so ibv_get_cq_event
        // returns -1 (EAGAIN) instead of sleeping once no event is pending. Each event is
        // acknowledged at once, as ibv_destroy_cq requires.
        unsafe {
            while ibv_get_cq_event(self.channel, &mut cq, &mut cq_ctx) == 0 {
                ibv_ack_cq_events(cq, 1);
            }
            // A failure here only costs the wake-up; the bounded sleep still comes back.
            ibv_req_notify_cq(self.cq, 0);
        }
    }

    /// Appends up to 16 completions to `out`.
    pub fn poll(&self, out: &mut Vec<Completion>) -> Result<()> {
        // SAFETY: plain-data array for the driver to fill.
        let mut wc: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
        // SAFETY: the CQ is live; `wc` has room for 16 entries.
        let n = unsafe { ibv_poll_cq(self.cq, 16, wc.as_mut_ptr()) };
        if n < 0 {
            return Err(os_err(&format!("{}: ibv_poll_cq", self.ctx.name)));
        }
        for w in &wc[..n as usize] {
            let with_imm = w.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
            // SAFETY: ibv_wc_status_str returns a static string for any status.
            let status = unsafe { CStr::from_ptr(ibv_wc_status_str(w.status)) }
                .to_str()
                .unwrap_or("unknown status");
            out.push(Completion {
                wr_id: w.wr_id,
                ok: w.status == ibv_wc_status::IBV_WC_SUCCESS,
                status,
                opcode: w.opcode,
                byte_len: w.byte_len,
                // SAFETY: the union holds the immediate when the flag says so.
                imm: with_imm
                    .then(|| u32::from_be(unsafe { w.imm_data_invalidated_rkey_union.imm_data })),
            });
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once: QP, then CQ (its events were acknowledged
        // in `arm`; any pending one is consumed first), then the channel.
        unsafe {
            ibv_destroy_qp(self.qp);
            let mut cq: *mut ibv_cq = std::ptr::null_mut();
            let mut cq_ctx: *mut std::ffi::c_void = std::ptr::null_mut();
            while ibv_get_cq_event(self.channel, &mut cq, &mut cq_ctx) == 0 {
                ibv_ack_cq_events(cq, 1);
            }
            ibv_destroy_cq(self.cq);
            ibv_destroy_comp_channel(self.channel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_info_round_trips_and_rejects_garbage() {
        let i = QpInfo {
            qpn: 17,
            psn: 0x123456,
            lid: 3,
            gid: [9; 16],
            mtu: 3,
        };
        assert_eq!(QpInfo::decode(&i.encode()).unwrap(), i);
        assert!(QpInfo::decode(&[0u8; QP_INFO_BYTES]).is_err());
        let mut bad = i.encode();
        bad[26] = 9; // mtu enum out of range
        assert!(QpInfo::decode(&bad).is_err());
    }
}
