//! The network engine's staging kernel (`RAILCC_GPU_NET_KERNEL=1`): one launch moves a call's
//! pieces between the caller's device buffers and the pinned staging ring and hands each piece
//! to the progress thread through the same flags the stream operations use (`start = token`
//! after a piece is staged; wait for `done`, then copy the result back). The copies are the
//! SMs' loads and stores to mapped host memory, as NCCL's network path without GPUDirect does,
//! so a call costs the caller's thread one launch instead of two copies and two flag
//! operations per piece (what bounds a large call's return time, and a small call's latency).
//!
//! Block b of the launch runs pieces b, b + B, b + 2B, ... in order; B divides the ring's
//! depth, so the piece that next uses a ring slot is the same block's, after it is done with
//! the slot (piece j + depth of a launch is its call's piece i + depth for some i, so it
//! stages in the same ring slot). A call of more pieces and segments than one launch's
//! parameter holds (232 entries: a 128 MB call's 74 pieces of two segments fit) is several
//! launches, one after another on the stream: each starts with every ring slot free. A module of its own (a few hundred lines of PTX, compiled once and cached on
//! disk), loaded in the engine's context without the collective kernels.

use crate::compile;
use crate::driver::check;
use crate::hostsync::Ctx;
use cudarc::driver::sys;
use railcc_core::{Error, Result};
use std::ffi::{c_void, CString};
use std::path::Path;

/// Segments (device range to or from a stage range) of one piece at most: a launch of any
/// kernel takes such a piece alone.
pub const MAX_SEGS: usize = 168;
/// Ring depths the kernel's parameters hold.
pub const MAX_DEPTH: usize = 16;
pub const THREADS: u32 = 512;
/// Launches whose times a trace keeps (the host passes launch k entry k modulo this).
pub const STAMP_CALLS: usize = 4096;
/// The stamp words of a launch: entry, block 0's staged pieces started, block 0's first piece
/// seen done, block 0's exit (the GPU's global timer in ns, low 32 bits).
pub const STAMP_WORDS: usize = 4;
const NAME: &str = "net_stage";

/// One copy of a piece: `bytes` between device address `dev` and the stage at offset `stage`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seg {
    pub dev: u64,
    pub stage: u32,
    pub bytes: u32,
}

/// One piece: its flag slot and token, and its ring slot (its index in the call modulo the
/// ring's depth). [`Launch::push`] adds its segments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Piece {
    pub token: u32,
    pub slot: u16,
    pub ring: u8,
}

/// A piece entry's flag (its word 1's top byte): a pair piece, one segment in and one back,
/// both at stage offset 0 and of the same size (every piece of an all_reduce, broadcast or
/// reduce), whose one segment entry holds both device addresses: 2 entries instead of 3, so
/// a 128 MB call passes 2.4 KB instead of 3.5.
const PAIR: u32 = 1;

/// How many 16-byte entries (pieces and segments, in any mix) the kernel's parameter holds
/// after its header: one launch takes that many. A kernel of `table` entries also takes
/// launches whose entries lie in mapped host memory (its header names where), up to that many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub items: usize,
    pub table: usize,
}

/// Under CUDA's classic 4 KiB of kernel parameters (296 + 232 x 16 = 4008 bytes): any driver.
/// A call of pieces of two segments: 77 pieces a launch.
pub const SMALL: Limits = Limits {
    items: 232,
    table: 0,
};
/// 296 + 2012 x 16 = 32488 bytes, under the 32764 CUDA 12.1 drivers allow: 670 pieces of two
/// segments a launch (`RAILCC_GPU_NET_BIG_LAUNCH`).
pub const BIG: Limits = Limits {
    items: 2012,
    table: 0,
};
/// Entries in a table of mapped host memory (`RAILCC_GPU_NET_TABLE`): the parameter is the
/// header alone (304 bytes); each block copies the entries into shared memory (32 KiB) before
/// anything else. Launches with no table free pass their entries as [`SMALL`] does.
pub const TABLE: Limits = Limits {
    items: 232,
    table: 2012,
};

/// Bytes of the parameter before its entries.
const HEADER_BYTES: usize = 296;

impl Limits {
    /// Bytes of the parameter before its entries (a table kernel's header names the table).
    pub fn header_bytes(&self) -> usize {
        HEADER_BYTES + if self.table > 0 { 8 } else { 0 }
    }

    /// Bytes of the kernel's declared parameter.
    pub fn param_bytes(&self) -> usize {
        self.header_bytes() + self.items * 16
    }
}

/// The parameter's words before its entries (`struct Params` in [`source`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Header {
    /// Device address of the flag words (`hostsync::Flags`): slot i's `start` is word
    /// `i * slot_words`, its `done` word `i * slot_words + done_word`.
    pub flags: u64,
    /// Device addresses of the ring's send and receive slots.
    pub send: [u64; MAX_DEPTH],
    pub recv: [u64; MAX_DEPTH],
    pub depth: u32,
    /// A captured call: wait for `done == token`, then clear it (graph replays).
    pub captured: u32,
    pub slot_words: u32,
    pub done_word: u32,
    /// Device address of [`STAMP_WORDS`] mapped host words (this launch's entry of a trace's
    /// table) where block 0's thread 0 writes when the launch reached each step
    /// (`RAILCC_GPU_NET_TRACE`); 0: none.
    pub stamps: u64,
    /// A table kernel's launch: device address of its entries in mapped host memory; 0: in
    /// the parameter.
    pub table: u64,
}

/// One launch's pieces and segments, and the parameter they make: the header, then the
/// pieces and the segments end to end as 16-byte entries, so a launch passes only the bytes
/// it uses (328 for one pair piece: the driver copies every parameter byte into the launch,
/// and NCCL passes its used bytes alone for the same reason).
///
/// A piece entry: token; slot | ring << 16 | flags << 24; then its segments `[a, b)` in
/// (down) and back (up) as `a | b << 16` each, or for a [`PAIR`] piece its segment's index and
/// its bytes. A segment entry: device address (two words), stage offset, bytes; a pair's:
/// the two device addresses, in then back.
#[derive(Clone)]
pub struct Launch {
    pub header: Header,
    limits: Limits,
    /// The entries go to a table (a table kernel's launch), not the parameter.
    table: bool,
    pieces: Vec<[u32; 4]>,
    segs: Vec<[u32; 4]>,
    words: Vec<u32>,
}

fn wide(v: u64) -> [u32; 2] {
    [v as u32, (v >> 32) as u32]
}

impl Launch {
    pub fn new(header: Header, limits: Limits) -> Launch {
        // Sized for a small call (most are); a large one grows them once.
        Launch {
            header,
            limits,
            table: false,
            pieces: Vec::with_capacity(8),
            segs: Vec::with_capacity(16),
            words: Vec::with_capacity(HEADER_BYTES / 4 + 4 * 24),
        }
    }

    /// Whether this launch's entries go to a table ([`NetKernel::launch_table`], a table
    /// kernel's) or in the parameter. Only an empty launch changes (false otherwise).
    pub fn use_table(&mut self, on: bool) -> bool {
        if self.npieces() > 0 || (on && self.limits.table == 0) {
            return false;
        }
        self.table = on;
        true
    }

    /// Whether the entries go to a table.
    pub fn in_table(&self) -> bool {
        self.table
    }

    /// Entries this launch takes: the parameter's, or a table's.
    fn cap(&self) -> usize {
        match self.table {
            true => self.limits.table,
            false => self.limits.items,
        }
    }

    /// Room for `pieces` pieces of `segs` segments in all, up to a launch's entries, so a
    /// large call's launch does not grow its vectors piece by piece.
    pub fn reserve(&mut self, pieces: usize, segs: usize) {
        let items = self.cap();
        self.pieces.reserve(pieces.min(items));
        self.segs.reserve(segs.min(items));
        self.words
            .reserve(self.limits.header_bytes() / 4 + 4 * (pieces + segs).min(items));
    }

    /// Adds a piece with its segments; false (and nothing added) when the launch is full.
    pub fn push(
        &mut self,
        p: Piece,
        mut down: impl ExactSizeIterator<Item = Seg>,
        mut up: impl ExactSizeIterator<Item = Seg>,
    ) -> bool {
        let n = self.segs.len();
        let (nd, nu) = (down.len(), up.len());
        let (used, cap) = (self.pieces.len() + n, self.cap());
        let head = |flags: u32| [p.token, p.slot as u32 | (p.ring as u32) << 16 | flags << 24];
        if nd == 1 && nu == 1 {
            if used + 2 > cap {
                return false;
            }
            let (Some(d), Some(u)) = (down.next(), up.next()) else {
                return false;
            };
            if d.stage == 0 && u.stage == 0 && d.bytes == u.bytes {
                let [h0, h1] = head(PAIR);
                self.pieces.push([h0, h1, n as u32, d.bytes]);
                let ([a0, a1], [b0, b1]) = (wide(d.dev), wide(u.dev));
                self.segs.push([a0, a1, b0, b1]);
                return true;
            }
            if used + 3 > cap {
                return false;
            }
            return self.push_segs(head(0), [d, u].into_iter(), 1);
        }
        if used + 1 + nd + nu > cap {
            return false;
        }
        self.push_segs(head(0), down.chain(up), nd)
    }

    /// A piece entry of head words `head` and its segments, the first `nd` of them in.
    fn push_segs(&mut self, head: [u32; 2], segs: impl Iterator<Item = Seg>, nd: usize) -> bool {
        let n = self.segs.len();
        self.segs.extend(segs.map(|g| {
            let [a0, a1] = wide(g.dev);
            [a0, a1, g.stage, g.bytes]
        }));
        let (d1, e) = ((n + nd) as u32, self.segs.len() as u32);
        self.pieces
            .push([head[0], head[1], n as u32 | d1 << 16, d1 | e << 16]);
        true
    }

    pub fn npieces(&self) -> usize {
        self.pieces.len()
    }

    /// Empties the launch for the next one (the header stays).
    pub fn clear(&mut self) {
        self.pieces.clear();
        self.segs.clear();
    }

    /// The parameter's used words, as the kernel reads them.
    fn pack(&mut self) -> &[u32] {
        let h = &self.header;
        let w = &mut self.words;
        w.clear();
        w.extend(wide(h.flags));
        for &a in h.send.iter().chain(&h.recv) {
            w.extend(wide(a));
        }
        w.extend([
            h.depth,
            h.captured,
            self.pieces.len() as u32,
            self.segs.len() as u32,
            h.slot_words,
            h.done_word,
        ]);
        w.extend(wide(h.stamps));
        if self.limits.table > 0 {
            w.extend(wide(h.table));
        }
        w.extend(self.pieces.iter().chain(&self.segs).flatten());
        w
    }
}

/// Blocks of a launch for ring depth `depth`: at most `want`, a divisor of the depth.
pub fn blocks_for(depth: usize, want: usize) -> u32 {
    (1..=want.clamp(1, depth.max(1)))
        .rev()
        .find(|b| depth.is_multiple_of(*b))
        .unwrap_or(1) as u32
}

/// CUDA source of the staging kernel.
pub fn source(limits: Limits) -> String {
    let items = limits.items;
    let table = limits.table;
    // A table kernel reads the entries from a shared-memory copy (made from its table or its
    // parameter as the block starts); the others read the parameter.
    let (table_field, items_arg, item, items_here, table_start) = if table > 0 {
        (
            "unsigned long long table;",
            "const uint4* it",
            "((const unsigned int*)&it[i])",
            "sm",
            format!(
                r#"__shared__ uint4 sm[{table}];
  // A block with no piece never reads the entries: the host frees a table once every piece
  // of its launch has started, so only blocks that started a piece have copied it.
  if (blockIdx.x >= p.npieces) return;
  {{
    const unsigned int m = p.npieces + p.nsegs;
    const uint4* src = (const uint4*)p.table;
    for (unsigned int i = threadIdx.x; i < m; i += blockDim.x)
      sm[i] = src ? __ldcv(src + i) : make_uint4(p.items[i][0], p.items[i][1], p.items[i][2], p.items[i][3]);
    __syncthreads();
  }}"#
            ),
        )
    } else {
        ("", "const Params& p", "(p.items[i])", "p", String::new())
    };
    format!(
        r#"
struct Seg {{ unsigned long long dev; unsigned int stage; unsigned int bytes; }};
struct Piece {{ unsigned int token; unsigned short slot; unsigned char ring, flags; unsigned short down[2], up[2]; unsigned int pair; }};
struct Params {{
  unsigned long long flags;
  unsigned long long send[{MAX_DEPTH}];
  unsigned long long recv[{MAX_DEPTH}];
  unsigned int depth, captured, npieces, nsegs, slot_words, done_word;
  unsigned long long stamps;
  {table_field}
  // Pieces 0..npieces, then segments 0..nsegs (Launch in netcopy.rs): a launch passes only
  // the entries it uses.
  unsigned int items[{items}][4];
}};
#define ITEM(i) {item}
__device__ __forceinline__ Piece piece_at({items_arg}, unsigned int j) {{
  const unsigned int i = j;
  const unsigned int* w = ITEM(i);
  Piece q;
  q.token = w[0]; q.slot = w[1] & 0xffff; q.ring = (w[1] >> 16) & 0xff; q.flags = w[1] >> 24;
  if (q.flags & {PAIR}) {{
    // One segment entry: in and back, both at stage offset 0, `pair` bytes.
    q.down[0] = q.up[0] = w[2]; q.down[1] = q.up[1] = w[2] + 1; q.pair = w[3];
  }} else {{
    q.down[0] = w[2] & 0xffff; q.down[1] = w[2] >> 16; q.up[0] = w[3] & 0xffff; q.up[1] = w[3] >> 16; q.pair = 0;
  }}
  return q;
}}
// Segment s of piece q, on its way in (`back` 0) or back (1).
__device__ __forceinline__ Seg seg_at({items_arg}, unsigned int np, const Piece& q, unsigned int s, int back) {{
  const unsigned int i = np + s;
  const unsigned int* w = ITEM(i);
  Seg g;
  if (q.flags & {PAIR}) {{
    g.dev = back ? ((unsigned long long)w[3] << 32) | w[2] : ((unsigned long long)w[1] << 32) | w[0];
    g.stage = 0; g.bytes = q.pair;
  }} else {{
    g.dev = ((unsigned long long)w[1] << 32) | w[0]; g.stage = w[2]; g.bytes = w[3];
  }}
  return g;
}}
// One W-byte word; `cv`: the source is host memory the progress thread wrote (fetched again,
// never from a cache).
template <int W> struct Word;
template <> struct Word<16> {{ typedef uint4 T; }};
template <> struct Word<8> {{ typedef unsigned long long T; }};
template <> struct Word<4> {{ typedef unsigned int T; }};
template <> struct Word<2> {{ typedef unsigned short T; }};
template <> struct Word<1> {{ typedef unsigned char T; }};
template <typename T> __device__ __forceinline__ T load(const T* p, bool cv) {{ return cv ? __ldcv(p) : *p; }}
// Copies n bytes with the block's threads in W-byte words (both ends equally aligned modulo
// W), 8 loads in flight per thread: reads of host memory cross PCIe, so they must overlap.
template <int W> __device__ __forceinline__ void copy_words(unsigned char* dst, const unsigned char* src, unsigned long long n, bool cv) {{
  typedef typename Word<W>::T T;
  const unsigned long long t = threadIdx.x, S = blockDim.x;
  unsigned long long head = (W - ((unsigned long long)dst & (W - 1))) & (W - 1);
  if (head > n) head = n;
  const unsigned long long words = (n - head) / W;
  const T* s = (const T*)(src + head);
  T* d = (T*)(dst + head);
  unsigned long long i = t;
  for (; i + 7 * S < words; i += 8 * S) {{
    T v[8];
    #pragma unroll
    for (int u = 0; u < 8; u++) v[u] = load(s + i + u * S, cv);
    #pragma unroll
    for (int u = 0; u < 8; u++) d[i + u * S] = v[u];
  }}
  for (; i < words; i += S) d[i] = load(s + i, cv);
  for (unsigned long long k = t; k < head; k += S) dst[k] = load(src + k, cv);
  for (unsigned long long k = head + words * W + t; k < n; k += S) dst[k] = load(src + k, cv);
}}
__device__ __forceinline__ void copy_block(unsigned char* dst, const unsigned char* src, unsigned long long n, bool cv) {{
  const unsigned long long x = (unsigned long long)dst ^ (unsigned long long)src;
  if ((x & 15) == 0) copy_words<16>(dst, src, n, cv);
  else if ((x & 7) == 0) copy_words<8>(dst, src, n, cv);
  else if ((x & 3) == 0) copy_words<4>(dst, src, n, cv);
  else if ((x & 1) == 0) copy_words<2>(dst, src, n, cv);
  else copy_words<1>(dst, src, n, cv);
}}
__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {{
  unsigned int v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}}
__device__ __forceinline__ void store_release(unsigned int* p, unsigned int v) {{
  asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}}
__device__ __forceinline__ void stamp(unsigned int* st, int i) {{
  if (st) {{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    st[i] = (unsigned int)t;
  }}
}}
extern "C" __global__ void __launch_bounds__({THREADS}) {NAME}(const Params p) {{
  unsigned int* flags = (unsigned int*)p.flags;
  const unsigned int n = p.npieces, B = gridDim.x, D = p.depth;
  // Trace stamps: block 0's thread 0 only.
  unsigned int* st = (p.stamps && blockIdx.x == 0 && threadIdx.x == 0) ? (unsigned int*)p.stamps : 0;
  stamp(st, 0);
  {table_start}
  // Piece j: its segments into its ring slot's send stage, then start = token.
  #define COPY_IN(j) do {{ \
    const Piece q = piece_at({items_here}, j); \
    unsigned char* stage = (unsigned char*)p.send[q.ring]; \
    for (unsigned int s = q.down[0]; s < q.down[1]; s++) {{ \
      const Seg g = seg_at({items_here}, n, q, s, 0); \
      copy_block(stage + g.stage, (const unsigned char*)g.dev, g.bytes, false); \
    }} \
    __syncthreads(); \
    if (threadIdx.x == 0) {{ __threadfence_system(); store_release(flags + q.slot * p.slot_words, q.token); }} \
  }} while (0)
  for (unsigned int j = blockIdx.x; j < n && j < D; j += B) COPY_IN(j);
  stamp(st, 1);
  for (unsigned int j = blockIdx.x; j < n; j += B) {{
    const Piece q = piece_at({items_here}, j);
    unsigned int* done = flags + q.slot * p.slot_words + p.done_word;
    if (threadIdx.x == 0) {{
      // The progress thread sets done (also when the engine breaks: every waiting piece is
      // let go), so this wait ends without a deadline of its own, as the stream's wait did.
      if (p.captured) {{
        while (load_acquire(done) != q.token) __nanosleep(200);
        store_release(done, 0);
      }} else {{
        while ((int)(load_acquire(done) - q.token) < 0) __nanosleep(200);
      }}
      if (j == 0) stamp(st, 2);
    }}
    __syncthreads();
    const unsigned char* stage = (const unsigned char*)p.recv[q.ring];
    for (unsigned int s = q.up[0]; s < q.up[1]; s++) {{
      const Seg g = seg_at({items_here}, n, q, s, 1);
      copy_block((unsigned char*)g.dev, stage + g.stage, g.bytes, true);
    }}
    // The recv slot is this block's again only after every thread's loads.
    __syncthreads();
    if (j + D < n) COPY_IN(j + D);
  }}
  stamp(st, 3);
}}
"#
    )
}

/// The staging kernel loaded in one GPU's context.
pub struct NetKernel {
    func: sys::CUfunction,
    module: sys::CUmodule,
    ctx: sys::CUcontext,
    limits: Limits,
    /// Whether a launch passes only its used parameter bytes (the probe at load found the
    /// driver takes them; else every declared byte).
    short: bool,
}

// SAFETY: module and function handles may be used from any thread with the context bound; the
// driver API is thread safe.
unsafe impl Send for NetKernel {}
// SAFETY: as above.
unsafe impl Sync for NetKernel {}

impl NetKernel {
    /// Compiles (or takes from the PTX cache in `cache`) and loads the kernel in `ctx`: with
    /// `big`, the variant of [`BIG`] launches where the driver runs it (a kernel parameter over
    /// 4 KiB needs a CUDA 12.1 driver), else (or failing that) the one of [`SMALL`] launches.
    /// With `table`, the variant of [`TABLE`] launches (tried first; a failure falls back as
    /// `big` does).
    pub fn load(ctx: &Ctx, cache: Option<&Path>, big: bool, table: bool) -> Result<NetKernel> {
        crate::driver::nvrtc_available()?;
        ctx.bind()?;
        if table {
            let k = NetKernel::load_with(ctx, cache, TABLE).and_then(|mut k| k.probe().map(|_| k));
            match k {
                Ok(k) => return Ok(k),
                Err(e) => tracing::warn!(
                    "net staging kernel: no table launches here ({e}); entries in the parameter"
                ),
            }
        }
        if big {
            let k = NetKernel::load_with(ctx, cache, BIG).and_then(|mut k| k.probe().map(|_| k));
            match k {
                Ok(k) => return Ok(k),
                Err(e) => tracing::warn!(
                    "net staging kernel: no launches of {} entries here ({e}); {} a launch",
                    BIG.items,
                    SMALL.items
                ),
            }
        }
        let mut k = NetKernel::load_with(ctx, cache, SMALL)?;
        k.probe()?;
        Ok(k)
    }

    /// The entries (pieces and segments) one launch of this kernel takes.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn load_with(ctx: &Ctx, cache: Option<&Path>, limits: Limits) -> Result<NetKernel> {
        ctx.bind()?;
        let mut dev: sys::CUdevice = 0;
        // SAFETY: valid out-pointer; the context is bound.
        check(unsafe { sys::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
        let major = crate::driver::attr(
            dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        )?;
        let src = source(limits);
        let image = compile::module_ptx("netcopy", &src, major, cache, true)?;
        match NetKernel::from_image(ctx, &image, limits) {
            Ok(k) => Ok(k),
            Err(_) => {
                // A cached file the driver rejects: rebuild.
                let image = compile::module_ptx("netcopy", &src, major, cache, false)?;
                NetKernel::from_image(ctx, &image, limits)
            }
        }
    }

    fn from_image(ctx: &Ctx, image: &CString, limits: Limits) -> Result<NetKernel> {
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: NUL-terminated PTX; the context is bound (load).
        check(
            unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void) },
            "cuModuleLoadData(netcopy)",
        )?;
        let name = CString::new(NAME).map_err(|_| Error::invalid("kernel name"))?;
        let mut func: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: module loaded above; `name` is NUL-terminated.
        let r = check(
            unsafe { sys::cuModuleGetFunction(&mut func, module, name.as_ptr()) },
            "cuModuleGetFunction(net_stage)",
        );
        if let Err(e) = r {
            // SAFETY: loaded above, not used after.
            unsafe {
                let _ = sys::cuModuleUnload(module);
            }
            return Err(e);
        }
        Ok(NetKernel {
            func,
            module,
            ctx: ctx.ctx,
            limits,
            short: true,
        })
    }

    /// Launches of no pieces on a stream of its own (the caller's other work is not waited
    /// for), waited for: first with the header's bytes alone, then with every declared byte.
    /// A driver that wants every byte clears `short` (NCCL passes its used bytes alone, so
    /// drivers take them); one that refuses the declared size fails the load here, not in a
    /// call.
    fn probe(&mut self) -> Result<()> {
        let mut p = Launch::new(
            Header {
                depth: 1,
                ..Header::default()
            },
            self.limits,
        );
        let mut all = p.pack().to_vec();
        let header = all.len() * 4;
        all.resize(self.limits.param_bytes() / 4, 0);
        let stream = crate::gpu::new_stream_current()?;
        // SAFETY: zero pieces and segments (the kernel reads none of the entries and writes
        // nothing, no stamps); a stream of the bound context, destroyed once.
        let r = unsafe {
            let short = self.raw_launch(stream, &all, header, 1);
            if short != sys::CUresult::CUDA_SUCCESS {
                tracing::warn!(
                    "net staging kernel: the driver refused a launch of {header} parameter bytes ({short:?}); every launch passes all {}",
                    self.limits.param_bytes()
                );
                self.short = false;
            }
            check(
                self.raw_launch(stream, &all, all.len() * 4, 1),
                "cuLaunchKernel(net_stage probe)",
            )
            .and_then(|_| {
                check(
                    sys::cuStreamSynchronize(stream),
                    "cuStreamSynchronize(probe)",
                )
            })
        };
        // SAFETY: made above, no work of ours left on it.
        let _ = unsafe { sys::cuStreamDestroy_v2(stream) };
        r
    }

    /// Launches `p` on `stream` with `blocks` blocks (a divisor of `p.header.depth`).
    ///
    /// # Safety
    /// `stream` is a live stream of this kernel's context, which is current; the segments'
    /// device ranges are live device memory of that GPU until the stream passes the launch;
    /// the ring slots and flag words are mapped host memory that outlives it.
    pub unsafe fn launch(&self, stream: sys::CUstream, p: &mut Launch, blocks: u32) -> Result<()> {
        self.fits(p, blocks, false)?;
        p.header.table = 0;
        let words = p.pack();
        // SAFETY: the caller's contract.
        unsafe { self.launch_words(stream, words, words.len() * 4, blocks) }
    }

    /// Launches `p` (in a table: [`Launch::use_table`]) with its entries in a table of mapped host
    /// memory at device address `table`: `write` puts them there (the GPU reads them once the
    /// launch starts); the parameter is the header alone.
    ///
    /// # Safety
    /// As [`NetKernel::launch`]; the table holds the entries `write` is given, and nothing
    /// else writes it until every block of the launch that has a piece has started one.
    pub unsafe fn launch_table(
        &self,
        stream: sys::CUstream,
        p: &mut Launch,
        blocks: u32,
        table: u64,
        write: impl FnOnce(&[u32]) -> Result<()>,
    ) -> Result<()> {
        self.fits(p, blocks, true)?;
        if table == 0 {
            return Err(Error::invalid(
                "net staging kernel: a table launch without a table",
            ));
        }
        p.header.table = table;
        let head = self.limits.header_bytes();
        let words = p.pack();
        write(&words[head / 4..])?;
        // SAFETY: the caller's contract; the header says the entries are in the table.
        unsafe { self.launch_words(stream, words, head, blocks) }
    }

    /// Whether `p` is a launch of this kernel, in a table or not as `table` says, with
    /// `blocks` blocks dividing its ring's depth.
    fn fits(&self, p: &Launch, blocks: u32, table: bool) -> Result<()> {
        let depth = p.header.depth as usize;
        if depth == 0 || depth > MAX_DEPTH || blocks == 0 || !depth.is_multiple_of(blocks as usize)
        {
            return Err(Error::invalid(format!(
                "net staging kernel: {blocks} blocks for a ring of depth {depth}"
            )));
        }
        if p.limits != self.limits || p.in_table() != table {
            return Err(Error::invalid(format!(
                "net staging kernel: a launch of {:?} (in a table: {}) for a kernel of {:?}, as {}",
                p.limits,
                p.in_table(),
                self.limits,
                if table {
                    "a table launch"
                } else {
                    "a parameter launch"
                }
            )));
        }
        Ok(())
    }

    /// Launches with the first `bytes` of `words` as the parameter (every declared byte where
    /// the driver wants them).
    ///
    /// # Safety
    /// As [`NetKernel::launch`]; `words` holds every entry the kernel reads from the parameter.
    unsafe fn launch_words(
        &self,
        stream: sys::CUstream,
        words: &[u32],
        bytes: usize,
        blocks: u32,
    ) -> Result<()> {
        let full = self.limits.param_bytes();
        let short = self.short;
        let rc = if short {
            // SAFETY: the caller's contract; `words` holds every entry the kernel reads.
            unsafe { self.raw_launch(stream, words, bytes, blocks) }
        } else {
            let mut all = words.to_vec();
            all.resize(full / 4, 0);
            // SAFETY: as above, with every declared byte.
            unsafe { self.raw_launch(stream, &all, full, blocks) }
        };
        check(rc, "cuLaunchKernel(net_stage)")
    }

    /// `cuLaunchKernel` with the first `bytes` of `words` as the parameter.
    ///
    /// # Safety
    /// As [`NetKernel::launch`]; `bytes <= words.len() * 4` and at most the declared size.
    unsafe fn raw_launch(
        &self,
        stream: sys::CUstream,
        words: &[u32],
        bytes: usize,
        blocks: u32,
    ) -> sys::CUresult {
        let mut size = bytes.min(words.len() * 4);
        // The driver copies the parameter bytes at the launch.
        let mut extra: [*mut c_void; 5] = [
            sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut c_void,
            words.as_ptr() as *mut c_void,
            sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut c_void,
            &mut size as *mut usize as *mut c_void,
            sys::CU_LAUNCH_PARAM_END_AS_INT as usize as *mut c_void,
        ];
        // SAFETY: the buffer is the kernel's one parameter (source()); its first `size` bytes
        // hold every entry the kernel reads (the header says how many); buffer and size
        // outlive the call, which copies them; the caller vouches for the addresses in them.
        unsafe {
            sys::cuLaunchKernel(
                self.func,
                blocks,
                1,
                1,
                THREADS,
                1,
                1,
                0,
                stream,
                std::ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        }
    }
}

impl Drop for NetKernel {
    fn drop(&mut self) {
        // SAFETY: loaded in `ctx`, unloaded once.
        unsafe {
            let _ = sys::cuCtxSetCurrent(self.ctx);
            let _ = sys::cuModuleUnload(self.module);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_fit_cudas_limits() {
        assert_eq!(std::mem::size_of::<Seg>(), 16);
        // The classic 4 KiB, and CUDA 12.1's 32764 bytes.
        assert_eq!(SMALL.param_bytes(), 4008);
        assert!(BIG.param_bytes() <= 32764, "{}", BIG.param_bytes());
        // The header as packed: 33 u64 and six u32 (the CUDA struct's fields in order, no
        // padding before `stamps` or after it), so entries start at byte 296.
        let mut p = Launch::new(Header::default(), SMALL);
        assert_eq!(p.pack().len() * 4, HEADER_BYTES);
    }

    fn seg(dev: u64, stage: u32, bytes: u32) -> Seg {
        Seg { dev, stage, bytes }
    }

    fn piece(token: u32) -> Piece {
        Piece {
            token,
            slot: 0x1234,
            ring: 5,
        }
    }

    #[test]
    fn packing_puts_segments_after_the_pieces_and_passes_only_those() {
        let header = Header {
            depth: 8,
            flags: 0x5_0000_0007,
            stamps: 9,
            ..Default::default()
        };
        let mut p = Launch::new(header, SMALL);
        // Not a pair (stage offsets differ), one side only, and a pair.
        assert!(p.push(
            piece(9),
            [seg(0x1_0000_0002, 3, 8)].into_iter(),
            [seg(4, 5, 8)].into_iter()
        ));
        assert!(p.push(piece(10), std::iter::empty(), [seg(6, 7, 8)].into_iter()));
        assert!(p.push(
            piece(11),
            [seg(0x2_0000_0010, 0, 96)].into_iter(),
            [seg(0x3_0000_0020, 0, 96)].into_iter()
        ));
        let w = p.pack().to_vec();
        // Three pieces and four segment entries: 296 + 7 x 16 bytes.
        assert_eq!(w.len() * 4, 408);
        // flags, then depth, captured, npieces, nsegs at words 66-69, stamps at 72.
        assert_eq!((w[0], w[1]), (7, 5));
        assert_eq!(&w[66..70], &[8, 0, 3, 4]);
        assert_eq!((w[72], w[73]), (9, 0));
        let item = |i: usize| &w[74 + 4 * i..78 + 4 * i];
        // Piece 0: token, slot | ring << 16, down [0, 1], up [1, 2]; piece 1: down [2, 2],
        // up [2, 3]; piece 2 a pair: the PAIR flag, its segment entry (3), its bytes.
        assert_eq!(item(0), &[9, 0x1234 | 5 << 16, 1 << 16, 1 | 2 << 16]);
        assert_eq!(item(1), &[10, 0x1234 | 5 << 16, 2 | 2 << 16, 2 | 3 << 16]);
        assert_eq!(item(2), &[11, 0x1234 | 5 << 16 | PAIR << 24, 3, 96]);
        // Segment 0 right after the last piece, its address in two words; the pair's entry
        // holds its two addresses.
        assert_eq!(item(3), &[2, 1, 3, 8]);
        assert_eq!(item(5), &[6, 0, 7, 8]);
        assert_eq!(item(6), &[0x10, 2, 0x20, 3]);
        // Full launches pass every entry and no more than the declared parameter.
        for limits in [SMALL, BIG] {
            let mut full = Launch::new(header, limits);
            while full.push(
                Piece::default(),
                [seg(1, 0, 8)].into_iter(),
                [seg(2, 0, 8)].into_iter(),
            ) {}
            let bytes = full.pack().len() * 4;
            assert!(bytes <= limits.param_bytes(), "{limits:?}: {bytes}");
            assert_eq!(
                bytes,
                HEADER_BYTES + 16 * (full.npieces() * 2),
                "{limits:?}"
            );
        }
        // Cleared: the header stays, no entries.
        p.clear();
        assert_eq!(p.npieces(), 0);
        assert_eq!(p.pack().len() * 4, HEADER_BYTES);
    }

    #[test]
    fn push_lays_segments_end_to_end_and_stops_when_full() {
        let mut p = Launch::new(Header::default(), SMALL);
        let s = |d: u64| seg(d, 0, 8);
        assert!(p.push(
            Piece::default(),
            [s(1)].into_iter(),
            [s(2), s(3)].into_iter()
        ));
        assert!(p.push(Piece::default(), std::iter::empty(), [s(4)].into_iter()));
        assert_eq!((p.pieces.len(), p.segs.len()), (2, 4));
        assert_eq!((p.pieces[0][2], p.pieces[0][3]), (1 << 16, 1 | 3 << 16));
        assert_eq!((p.pieces[1][2], p.pieces[1][3]), (3 | 3 << 16, 3 | 4 << 16));
        assert_eq!(p.segs[3][0], 4);
        // Entries used: 2 pieces and 4 segments of 232. A piece of the most segments fits
        // (175 used); a second does not: refused, nothing changed.
        let many = vec![s(9); MAX_SEGS];
        assert!(p.push(Piece::default(), many.iter().copied(), std::iter::empty()));
        assert!(!p.push(Piece::default(), many.iter().copied(), std::iter::empty()));
        assert_eq!((p.pieces.len(), p.segs.len()), (3, 4 + MAX_SEGS));
        // Alone in a launch it fits.
        let mut alone = Launch::new(Header::default(), SMALL);
        assert!(alone.push(Piece::default(), many.iter().copied(), std::iter::empty()));
        // 57 entries left: 27 pairs leave 3, where a piece of one segment each way that is
        // no pair (3 entries) fits and then nothing but a piece of no segment.
        for _ in 0..27 {
            assert!(p.push(Piece::default(), [s(1)].into_iter(), [s(2)].into_iter()));
        }
        let odd = || [seg(1, 8, 8)].into_iter();
        let mut q = p.clone();
        assert!(q.push(Piece::default(), odd(), odd()));
        assert_eq!(q.pieces.len() + q.segs.len(), SMALL.items);
        // A pair fits the same 3, leaving 1: no pair, no odd piece, an empty piece.
        assert!(p.push(Piece::default(), [s(1)].into_iter(), [s(2)].into_iter()));
        assert!(!p.push(Piece::default(), [s(1)].into_iter(), [s(2)].into_iter()));
        assert!(!p.push(Piece::default(), odd(), odd()));
        assert!(p.push(Piece::default(), std::iter::empty(), std::iter::empty()));
        assert!(!p.push(Piece::default(), std::iter::empty(), std::iter::empty()));
        assert_eq!(p.pieces.len() + p.segs.len(), SMALL.items);
        // A 128 MB all_reduce's 74 pairs (1.75 MiB slots) in one launch: 116 fit; a big
        // launch takes 1006.
        for (limits, n) in [(SMALL, 116), (BIG, 1006)] {
            let mut b = Launch::new(Header::default(), limits);
            for _ in 0..n {
                assert!(b.push(Piece::default(), [s(1)].into_iter(), [s(2)].into_iter()));
            }
            assert!(!b.push(Piece::default(), [s(1)].into_iter(), [s(2)].into_iter()));
        }
    }

    #[test]
    fn a_table_launch_passes_the_header_alone_and_takes_a_table_of_entries() {
        // The header names the table: 304 bytes, entries after it; 4016 declared.
        assert_eq!(TABLE.header_bytes(), 304);
        assert_eq!(TABLE.param_bytes(), 4016);
        let h = Header {
            table: 0x7_0000_0040,
            ..Header::default()
        };
        let mut p = Launch::new(h, TABLE);
        assert!(!p.in_table());
        let w = p.pack().to_vec();
        assert_eq!(w.len() * 4, 304);
        assert_eq!((w[74], w[75]), (0x40, 7));
        // Other kernels have no table: their launches cannot take one.
        assert!(!Launch::new(h, SMALL).use_table(true));
        assert_eq!(Launch::new(h, SMALL).pack().len() * 4, HEADER_BYTES);
        // In a table: 1006 pairs (2012 entries), where the parameter takes 116.
        let s = |d: u64| seg(d, 0, 8);
        assert!(p.use_table(true) && p.in_table());
        for _ in 0..1006 {
            assert!(p.push(Piece::default(), [s(1)].into_iter(), [s(2)].into_iter()));
        }
        assert!(!p.push(Piece::default(), [s(1)].into_iter(), [s(2)].into_iter()));
        // Only an empty launch changes where its entries go.
        assert!(!p.use_table(false));
        p.clear();
        assert!(p.use_table(false) && !p.in_table());
        for _ in 0..116 {
            assert!(p.push(Piece::default(), [s(1)].into_iter(), [s(2)].into_iter()));
        }
        assert!(!p.push(Piece::default(), [s(1)].into_iter(), [s(2)].into_iter()));
    }

    #[test]
    fn blocks_divide_the_depth() {
        assert_eq!(blocks_for(8, 4), 4);
        assert_eq!(blocks_for(6, 4), 3);
        assert_eq!(blocks_for(7, 4), 1);
        assert_eq!(blocks_for(2, 4), 2);
        assert_eq!(blocks_for(16, 1), 1);
        for d in 1..=MAX_DEPTH {
            for w in 1..=8 {
                let b = blocks_for(d, w) as usize;
                assert!(b >= 1 && b <= w && d % b == 0, "{d} {w}: {b}");
            }
        }
    }

    /// Compiles the kernel when NVRTC is present (no GPU needed); a skip line otherwise.
    #[test]
    fn net_stage_compiles_with_nvrtc() {
        if let Err(e) = crate::driver::nvrtc_available() {
            println!("SKIP NVRTC compile of net_stage: {e}");
            return;
        }
        for limits in [SMALL, BIG, TABLE] {
            let ptx = compile::ptx_of("netcopy", &source(limits), "compute_90", None, false)
                .expect("net_stage compiles");
            let ptx = ptx.to_string_lossy();
            assert!(ptx.contains(".entry net_stage"));
            // The parameter is read in place: no copy of it in local memory per thread.
            assert!(!ptx.contains(".local"), "{limits:?}: local memory");
            // The table kernel's copy of the entries, and none in the others.
            assert_eq!(ptx.contains(".shared"), limits.table > 0, "{limits:?}");
        }
    }
}
