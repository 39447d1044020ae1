//! NVRTC compilation of the kernels, with a cache on disk.
//!
//! The collective kernels are 53 modules (kernels.rs `modules`; 20 more for the opt-in TMA
//! form, `tma_modules`), compiled on parallel threads for the GPU's own architecture as
//! cubins (SASS: the driver loads them with no JIT, on every GPU of the process) and cached on
//! disk; PTX for the virtual architecture, which the driver JIT-compiles per context, is the
//! fallback where NVRTC cannot make a cubin for the GPU or the driver refuses it. The key
//! covers the source, the architecture and the driver version, so a changed kernel or driver
//! never loads a stale image; a cached file that the driver rejects is recompiled (see
//! `GpuCtx::new`).

use railcc_core::{Error, ErrorKind, Result};
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The virtual architecture for a compute capability major version.
pub fn arch_for(major: i32) -> &'static str {
    match major {
        10.. => "compute_100",
        9 => "compute_90",
        8 => "compute_80",
        _ => "compute_70",
    }
}

/// The real architecture of compute capability (major, minor), where we name it: NVRTC then
/// makes a cubin for exactly that GPU.
pub fn sm_for(major: i32, minor: i32) -> Option<&'static str> {
    Some(match (major, minor) {
        (7, 0) => "sm_70",
        (7, 5) => "sm_75",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90",
        (10, 0) => "sm_100",
        (12, 0) => "sm_120",
        _ => return None,
    })
}

/// NVRTC compiles this process has run (not cache or memo hits): `GpuCtx::new` tells a
/// refused fresh image from a refused cached one.
static FRESH: AtomicUsize = AtomicUsize::new(0);

pub fn fresh_compiles() -> usize {
    FRESH.load(Ordering::Relaxed)
}

/// The marker that the driver refused freshly compiled cubins for `cc` (a toolkit newer than
/// the driver): later processes then go straight to PTX.
fn refused_marker(dir: &Path, cc: (i32, i32)) -> PathBuf {
    let dv = driver_version().unwrap_or(0);
    dir.join(format!("cubin-refused-{}.{}-{dv}", cc.0, cc.1))
}

pub fn cubin_refused(dir: Option<&Path>, cc: (i32, i32)) -> bool {
    dir.is_some_and(|d| refused_marker(d, cc).exists())
}

pub fn refuse_cubin(dir: Option<&Path>, cc: (i32, i32)) {
    if let Some(d) = dir {
        store(&refused_marker(d, cc), b"");
    }
}

/// Whether `b` is a whole ELF64 image: its section and program header tables lie inside it
/// (the driver is given no length, so a truncated cached cubin must not reach it).
fn whole_elf(b: &[u8]) -> bool {
    let u64_at = |o: usize| {
        b.get(o..o + 8)
            .and_then(|x| x.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let u16_at = |o: usize| {
        b.get(o..o + 2)
            .and_then(|x| x.try_into().ok())
            .map(u16::from_le_bytes)
    };
    let inside = |off: Option<u64>, size: Option<u16>, n: Option<u16>| match (off, size, n) {
        (Some(o), Some(s), Some(n)) => o
            .checked_add(u64::from(s) * u64::from(n))
            .is_some_and(|end| end <= b.len() as u64),
        _ => false,
    };
    b.starts_with(b"\x7fELF\x02\x01")
        && inside(u64_at(0x20), u16_at(0x36), u16_at(0x38))
        && inside(u64_at(0x28), u16_at(0x3a), u16_at(0x3c))
}

/// A compiled module: a cubin, or PTX with its NUL; shared, not copied, between the GPUs of a
/// process.
pub type Image = Arc<Vec<u8>>;

/// What a module is compiled to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// SASS for the GPU's own architecture (`sm_for`).
    Cubin,
    /// PTX for its virtual architecture (`arch_for`), JIT-compiled by the driver.
    Ptx,
}

/// Where the image of the module `tag` (a kernels module, "kernels-float"; the network
/// staging kernel, "netcopy") of source `src` lives in `dir`, for this architecture ("sm_90":
/// a cubin; "compute_90": PTX) and driver.
pub fn cache_path_of(dir: &Path, tag: &str, src: &str, arch: &str, driver_version: i32) -> PathBuf {
    let mut h = blake3::Hasher::new();
    h.update(src.as_bytes());
    h.update(arch.as_bytes());
    h.update(&driver_version.to_le_bytes());
    let hex = h.finalize().to_hex();
    let ext = if arch.starts_with("sm_") {
        "cubin"
    } else {
        "ptx"
    };
    dir.join(format!("{tag}-{arch}-{}.{ext}", &hex[..16]))
}

pub(crate) fn driver_version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: valid out-pointer.
    crate::driver::check(
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) },
        "cuDriverGetVersion",
    )?;
    Ok(v)
}

/// PTX of the module `tag` (source `src`) for GPUs of compute capability `major`, from the
/// cache directory `dir` when `use_cache` and present there (keyed by source, architecture
/// and driver version), else compiled (and stored).
pub fn module_ptx(
    tag: &'static str,
    src: &str,
    major: i32,
    dir: Option<&Path>,
    use_cache: bool,
) -> Result<CString> {
    let arch = arch_for(major);
    let dv = driver_version()?;
    let path = dir.map(|d| cache_path_of(d, tag, src, arch, dv));
    ptx_of(tag, src, arch, path.as_deref(), use_cache)
}

/// Images (`form`) of `modules` (tag, source) for a GPU of compute capability `cc`, in their
/// order: each from the cache in `dir` when `use_cache` and present, else compiled (and
/// stored), the compiles on parallel threads (at most one per core).
pub fn module_images(
    modules: &[(&str, &str)],
    cc: (i32, i32),
    dir: Option<&Path>,
    use_cache: bool,
    form: Form,
) -> Result<Vec<Image>> {
    let arch = match form {
        Form::Cubin => sm_for(cc.0, cc.1).ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                format!(
                    "no cubin target named for compute capability {}.{}",
                    cc.0, cc.1
                ),
            )
        })?,
        Form::Ptx => arch_for(cc.0),
    };
    // Only the cache's key needs the driver (NVRTC runs without one).
    let dv = if dir.is_some() { driver_version()? } else { 0 };
    // Threads take the next module until none is left; each fills that module's slot.
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<Image>>>> =
        modules.iter().map(|_| Mutex::new(None)).collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, modules.len().max(1));
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let (Some(&(tag, src)), Some(slot)) = (modules.get(i), slots.get(i)) else {
                        break;
                    };
                    let path = dir.map(|d| cache_path_of(d, tag, src, arch, dv));
                    let image = image_of(tag, src, arch, path.as_deref(), use_cache);
                    if let Ok(mut g) = slot.lock() {
                        *g = Some(image);
                    }
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join()
                .map_err(|_| Error::new(ErrorKind::Io, "an NVRTC compile thread panicked"))
        })
    })?;
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .ok()
                .flatten()
                .unwrap_or_else(|| Err(Error::new(ErrorKind::Io, "a module was not compiled")))
        })
        .collect()
}

/// PTX of the module `tag` (source `src`) for `arch`, from the cache when `use_cache` and
/// present, else compiled (and stored).
pub fn ptx_of(
    tag: &str,
    src: &str,
    arch: &'static str,
    cache: Option<&Path>,
    use_cache: bool,
) -> Result<CString> {
    let bytes = image_of(tag, src, arch, cache, use_cache)?;
    CString::from_vec_with_nul(bytes.to_vec())
        .map_err(|_| Error::new(ErrorKind::Io, "PTX with a NUL byte inside").transport(crate::NAME))
}

/// The image of module `tag` (source `src`) for `arch` ("sm_*": a cubin; "compute_*": PTX,
/// NUL-terminated), from the cache when `use_cache` and present, else compiled (and stored).
/// Compiled images are also kept in memory, so a process driving several GPUs compiles once.
fn image_of(
    tag: &str,
    src: &str,
    arch: &'static str,
    cache: Option<&Path>,
    use_cache: bool,
) -> Result<Image> {
    type Memo = Vec<(String, &'static str, Image)>;
    static MEMO: Mutex<Memo> = Mutex::new(Vec::new());
    if use_cache {
        let hit = MEMO.lock().ok().and_then(|m| {
            m.iter()
                .find(|(t, a, _)| t == tag && *a == arch)
                .map(|(.., c)| c.clone())
        });
        if let Some(c) = hit {
            return Ok(c);
        }
    }
    let c = Arc::new(image_uncached(tag, src, arch, cache, use_cache)?);
    if let Ok(mut m) = MEMO.lock() {
        m.retain(|(t, a, _)| !(t == tag && *a == arch));
        m.push((tag.to_string(), arch, c.clone()));
    }
    Ok(c)
}

fn image_uncached(
    tag: &str,
    src: &str,
    arch: &'static str,
    cache: Option<&Path>,
    use_cache: bool,
) -> Result<Vec<u8>> {
    let cubin = arch.starts_with("sm_");
    // Held until the image is stored: the ranks of a fresh machine compile each module once
    // between them instead of once each.
    let mut _lock = None;
    if let (Some(path), true) = (cache, use_cache) {
        if let Some(bytes) = cached(path, cubin) {
            return Ok(bytes);
        }
        _lock = lock_beside(path, LOCK_WAIT);
        if let Some(bytes) = cached(path, cubin) {
            return Ok(bytes);
        }
    }
    let t0 = std::time::Instant::now();
    FRESH.fetch_add(1, Ordering::Relaxed);
    let image = compile(src, arch, cubin)?;
    tracing::info!(
        "NVRTC compiled kernel module {tag} ({} KB of CUDA) for {arch} in {:?}",
        src.len() / 1024,
        t0.elapsed()
    );
    if let Some(path) = cache {
        store(path, &image);
    }
    Ok(image)
}

/// The image at `path` if it is whole: a PTX file ends with its only NUL; a cubin's ELF
/// headers lie inside it.
fn cached(path: &Path, cubin: bool) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    let whole = if cubin {
        whole_elf(&bytes)
    } else {
        bytes.last() == Some(&0) && !bytes[..bytes.len() - 1].contains(&0)
    };
    tracing::debug!("kernels from the cache {} (whole: {whole})", path.display());
    whole.then_some(bytes)
}

/// How long a process waits for another's compile of the same module before compiling it
/// itself: a compile takes seconds to a minute.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// An exclusive lock on `<path>.lock` (released when the file closes, also when the process
/// dies), or None after `wait` or where the folder takes no lock file: then no lock.
fn lock_beside(path: &Path, wait: std::time::Duration) -> Option<std::fs::File> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let _ = std::fs::create_dir_all(path.parent()?);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&name)
        .ok()?;
    let t0 = std::time::Instant::now();
    loop {
        match f.try_lock() {
            Ok(()) => return Some(f),
            Err(std::fs::TryLockError::WouldBlock) if t0.elapsed() < wait => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(_) => return None,
        }
    }
}

/// One NVRTC compile of `src` for `arch`: the cubin, or the PTX with its NUL.
fn compile(src: &str, arch: &'static str, cubin: bool) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    let fail = |what: String| Error::new(ErrorKind::Io, what).transport(crate::NAME);
    let csrc = CString::new(src).map_err(|_| fail("kernel source with a NUL byte".into()))?;
    let prog = result::create_program(&csrc, None)
        .map_err(|e| fail(format!("nvrtcCreateProgram: {e:?}")))?;
    let opt = format!("--gpu-architecture={arch}");
    // SAFETY: `prog` is a live program, destroyed once below on every path; the sizes come
    // from NVRTC for the buffers it fills.
    unsafe {
        let r = (|| -> Result<Vec<u8>> {
            if let Err(e) = result::compile_program(prog, &[opt.as_str()]) {
                let log = result::get_program_log(prog)
                    .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                    .unwrap_or_default();
                return Err(fail(format!(
                    "NVRTC compile for {arch} failed: {e:?}: {log}"
                )));
            }
            let mut n = 0usize;
            let (size, get): (unsafe fn(_, *mut usize) -> _, unsafe fn(_, *mut _) -> _) = if cubin {
                (sys::nvrtcGetCUBINSize, sys::nvrtcGetCUBIN)
            } else {
                (sys::nvrtcGetPTXSize, sys::nvrtcGetPTX)
            };
            size(prog, &mut n)
                .result()
                .map_err(|e| fail(format!("NVRTC image size: {e:?}")))?;
            let mut buf = vec![0u8; n];
            get(prog, buf.as_mut_ptr() as *mut std::ffi::c_char)
                .result()
                .map_err(|e| fail(format!("NVRTC image: {e:?}")))?;
            Ok(buf)
        })();
        let _ = result::destroy_program(prog);
        r
    }
}

/// Writes atomically (temporary file, then rename) so concurrent ranks never read half a file.
/// A cache that cannot be written is only logged: it is an optimization.
fn store(path: &Path, bytes: &[u8]) {
    let Some(dir) = path.parent() else { return };
    let tmp = dir.join(format!(
        ".{}.{:?}.tmp",
        std::process::id(),
        std::thread::current().id()
    ));
    // Synced before the rename: a crash leaves the old name or the whole file, never part.
    let r = std::fs::create_dir_all(dir)
        .and_then(|_| {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()
        })
        .and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        tracing::warn!("could not write the kernel cache {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::source;

    #[test]
    fn cache_key_depends_on_arch_and_driver() {
        let d = Path::new("/c");
        assert_ne!(
            cache_path_of(d, "kernels", &source(), "compute_90", 1),
            cache_path_of(d, "kernels", &source(), "compute_80", 1)
        );
        assert_ne!(
            cache_path_of(d, "kernels", &source(), "compute_90", 1),
            cache_path_of(d, "kernels", &source(), "compute_90", 2)
        );
        assert_eq!(
            cache_path_of(d, "kernels", &source(), "compute_90", 1),
            cache_path_of(d, "kernels", &source(), "compute_90", 1)
        );
    }

    #[test]
    fn a_cubin_whose_headers_lie_past_its_end_is_not_whole() {
        // An ELF64 header (64 bytes) with one 64-byte section header at 64 and no program
        // headers: whole at 128 bytes, not when cut.
        let mut b = vec![0u8; 128];
        b[..6].copy_from_slice(b"\x7fELF\x02\x01");
        b[0x28..0x30].copy_from_slice(&64u64.to_le_bytes());
        b[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        b[0x3c..0x3e].copy_from_slice(&1u16.to_le_bytes());
        assert!(whole_elf(&b));
        assert!(!whole_elf(&b[..127]));
        assert!(!whole_elf(&b[..40]));
        b[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
        assert!(!whole_elf(&b));
        b[..4].copy_from_slice(b"\x7fELG");
        assert!(!whole_elf(&b[..4]));
    }

    #[test]
    fn one_holder_of_a_modules_lock_at_a_time() {
        let dir = std::env::temp_dir().join(format!("railcc-lock-{}", std::process::id()));
        let p = dir.join("kernels-float-sm_90-0.cubin");
        let short = std::time::Duration::from_millis(100);
        let held = lock_beside(&p, short).expect("first lock");
        // Another holder (another process's, here another open file) waits, then gives up.
        let t0 = std::time::Instant::now();
        assert!(lock_beside(&p, short).is_none());
        assert!(t0.elapsed() >= short);
        drop(held);
        assert!(lock_beside(&p, short).is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn store_is_atomic_and_readable() {
        let dir = std::env::temp_dir().join(format!("railcc-ptx-{}", std::process::id()));
        let p = dir.join("k.ptx");
        store(&p, b"// ptx");
        assert_eq!(std::fs::read(&p).unwrap(), b"// ptx");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod nvrtc_tests {
    use super::*;
    use crate::kernels::{kernel_name, modules, scale_name, tma_modules, Family, P2P_KERNELS};
    use railcc_core::{DataType, ReduceOp};

    /// Compiles the real kernel modules, as PTX and as sm_90 cubins, when NVRTC is present
    /// (it needs no GPU); prints a skip line otherwise, as on CI. Every kernel that
    /// `GpuCtx::load` looks up is in the module it looks in.
    #[test]
    fn kernels_compile_with_nvrtc() {
        if let Err(e) = crate::driver::nvrtc_available() {
            println!("SKIP NVRTC compile: {e}");
            return;
        }
        let ms: Vec<_> = modules().into_iter().chain(tma_modules()).collect();
        // Every (dtype, family, op) in exactly one module.
        let mut seen = std::collections::HashSet::new();
        for m in &ms {
            if let Some((dt, fam)) = m.dtype {
                for &op in &m.ops {
                    assert!(seen.insert((dt, fam as u8, op)), "{} twice", m.tag);
                }
            }
        }
        assert_eq!(
            seen.len(),
            Family::ALL.len() * DataType::ALL.len() * ReduceOp::ALL.len()
        );
        assert_eq!(ms.len(), 73);
        let parts: Vec<(&str, &str)> = ms
            .iter()
            .map(|m| (m.tag.as_str(), m.src.as_str()))
            .collect();
        for form in [Form::Ptx, Form::Cubin] {
            let t0 = std::time::Instant::now();
            let images = module_images(&parts, (9, 0), None, false, form).expect("kernels compile");
            println!("{} modules as {form:?} in {:?}", images.len(), t0.elapsed());
            assert_eq!(images.len(), ms.len());
            for (m, image) in ms.iter().zip(&images) {
                match form {
                    Form::Ptx => assert_eq!(image.last(), Some(&0)),
                    Form::Cubin => {
                        assert!(whole_elf(image), "{}", m.tag);
                        assert!(!whole_elf(&image[..image.len() / 2]), "{}", m.tag);
                    }
                }
                let has = |name: &str| {
                    let want = match form {
                        Form::Ptx => format!(".entry {name}("),
                        Form::Cubin => format!("{name}\0"),
                    };
                    image.windows(want.len()).any(|w| w == want.as_bytes())
                };
                let names: Vec<String> = match m.dtype {
                    Some((dt, fam)) => m
                        .ops
                        .iter()
                        .map(|&op| match fam {
                            Family::Bulk => kernel_name(dt, op),
                            Family::Ll => crate::ll::kernel_name(dt, op),
                            Family::Push => crate::push::kernel_name(dt, op),
                            Family::Tma => crate::tma::kernel_name(dt, op),
                        })
                        .chain(
                            (fam == Family::Bulk && m.ops.contains(&ReduceOp::Sum))
                                .then(|| scale_name(dt)),
                        )
                        .chain(m.ops.iter().filter_map(|&op| match fam {
                            Family::Bulk => Some(crate::kernels::late_kernel_name(dt, op)),
                            Family::Push => Some(crate::push::late_kernel_name(dt, op)),
                            _ => None,
                        }))
                        .collect(),
                    None => DataType::ALL
                        .iter()
                        .flat_map(|&dt| {
                            [
                                crate::check::kernel_name(dt),
                                crate::check::fill_kernel_name(dt),
                            ]
                        })
                        .chain(P2P_KERNELS.iter().map(|n| n.to_string()))
                        .collect(),
                };
                for n in names {
                    assert!(has(&n), "{form:?}: {n} not in {}", m.tag);
                }
                // Each module holds no other dtype's or family's kernels.
                if let Some((dt, fam)) = m.dtype {
                    let other = if dt == DataType::F32 {
                        DataType::F64
                    } else {
                        DataType::F32
                    };
                    assert!(!has(&kernel_name(other, ReduceOp::Sum)), "{}", m.tag);
                    let not_mine = match fam {
                        Family::Bulk => crate::ll::kernel_name(dt, ReduceOp::Sum),
                        _ => kernel_name(dt, ReduceOp::Sum),
                    };
                    assert!(!has(&not_mine), "{}", m.tag);
                }
            }
        }
    }
}
