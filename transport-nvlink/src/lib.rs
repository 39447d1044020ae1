//! CUDA peer-to-peer transport over NVLink/PCIe. Not implemented yet (issue 3): every entry
//! point returns `Unsupported`, so nothing pretends to work.

use railcc_core::{Error, ErrorKind, Result};

/// Always fails until the GPU path lands.
pub fn open() -> Result<()> {
    Err(Error::new(
        ErrorKind::Unsupported,
        "the NVLink/CUDA transport is not implemented yet (issue 3)",
    )
    .transport("nvlink"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn says_unsupported() {
        assert_eq!(
            super::open().unwrap_err().kind,
            railcc_core::ErrorKind::Unsupported
        );
    }
}
