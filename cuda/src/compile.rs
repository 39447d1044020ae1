//! NVRTC compilation of the kernels, with a PTX cache on disk.
//!
//! Compiling every (dtype, op) kernel takes about a second, once per process; the cache makes
//! every later process start in milliseconds. The key covers the source, the architecture and
//! the driver version, so a changed kernel or driver never loads stale PTX; a cached file that
//! the driver rejects is recompiled (see `GpuCtx::new`).

use railcc_core::{Error, ErrorKind, Result};
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// The virtual architecture for a compute capability major version.
pub fn arch_for(major: i32) -> &'static str {
    match major {
        10.. => "compute_100",
        9 => "compute_90",
        8 => "compute_80",
        _ => "compute_70",
    }
}

/// Where the PTX of the module `tag` (the collective kernels, "kernels"; the network staging
/// kernel, "netcopy") of source `src` lives in `dir`, for this architecture and driver.
pub fn cache_path_of(dir: &Path, tag: &str, src: &str, arch: &str, driver_version: i32) -> PathBuf {
    let mut h = blake3::Hasher::new();
    h.update(src.as_bytes());
    h.update(arch.as_bytes());
    h.update(&driver_version.to_le_bytes());
    let hex = h.finalize().to_hex();
    dir.join(format!("{tag}-{arch}-{}.ptx", &hex[..16]))
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
    let mut driver_version = 0;
    // SAFETY: valid out-pointer.
    crate::driver::check(
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) },
        "cuDriverGetVersion",
    )?;
    let arch = arch_for(major);
    let path = dir.map(|d| cache_path_of(d, tag, src, arch, driver_version));
    ptx_of(tag, src, arch, path.as_deref(), use_cache)
}

/// PTX of the module `tag` (source `src`) for `arch`, from the cache when `use_cache` and
/// present, else compiled (and stored). Compiled PTX is also kept in memory, so a process
/// driving several GPUs compiles once.
pub fn ptx_of(
    tag: &'static str,
    src: &str,
    arch: &'static str,
    cache: Option<&Path>,
    use_cache: bool,
) -> Result<CString> {
    type Memo = Vec<(&'static str, &'static str, CString)>;
    static MEMO: std::sync::Mutex<Memo> = std::sync::Mutex::new(Vec::new());
    if use_cache {
        if let Some((.., c)) = MEMO
            .lock()
            .ok()
            .and_then(|m| m.iter().find(|(t, a, _)| *t == tag && *a == arch).cloned())
        {
            return Ok(c);
        }
    }
    let c = ptx_uncached(src, arch, cache, use_cache)?;
    if let Ok(mut m) = MEMO.lock() {
        m.retain(|(t, a, _)| !(*t == tag && *a == arch));
        m.push((tag, arch, c.clone()));
    }
    Ok(c)
}

fn ptx_uncached(
    src: &str,
    arch: &'static str,
    cache: Option<&Path>,
    use_cache: bool,
) -> Result<CString> {
    if let (Some(path), true) = (cache, use_cache) {
        if let Ok(bytes) = std::fs::read(path) {
            if let Ok(c) = CString::new(bytes) {
                tracing::debug!("kernels from the PTX cache {}", path.display());
                return Ok(c);
            }
        }
    }
    let t0 = std::time::Instant::now();
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| {
        Error::new(ErrorKind::Io, format!("NVRTC compile failed: {e:?}")).transport(crate::NAME)
    })?;
    tracing::info!(
        "NVRTC compiled the kernels for {arch} in {:?}",
        t0.elapsed()
    );
    let src = ptx.to_src();
    if let Some(path) = cache {
        store(path, src.as_bytes());
    }
    CString::new(src).map_err(|_| {
        Error::new(ErrorKind::Io, "NVRTC produced PTX with a NUL byte").transport(crate::NAME)
    })
}

/// Writes atomically (temporary file, then rename) so concurrent ranks never read half a file.
/// A cache that cannot be written is only logged: it is an optimization.
fn store(path: &Path, bytes: &[u8]) {
    let Some(dir) = path.parent() else { return };
    let tmp = dir.join(format!(".{}.tmp", std::process::id()));
    let r = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&tmp, bytes))
        .and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        tracing::warn!("could not write the PTX cache {}: {e}", path.display());
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
    /// Compiles the real kernel source when NVRTC is present (it needs no GPU); prints a skip
    /// line otherwise, as on CI.
    #[test]
    fn kernels_compile_with_nvrtc() {
        if let Err(e) = crate::driver::nvrtc_available() {
            println!("SKIP NVRTC compile: {e}");
            return;
        }
        let ptx = super::ptx_of(
            "kernels",
            &crate::kernels::source(),
            "compute_90",
            None,
            false,
        )
        .expect("kernels compile");
        let text = ptx.to_string_lossy();
        assert!(text.contains(".entry ar_float_sum"));
        assert!(text.contains(".entry ll_bfloat16_avg"));
        assert!(text.contains(".entry push_bfloat16_avg"));
    }
}
