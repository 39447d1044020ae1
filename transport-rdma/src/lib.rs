//! ibverbs RC transport. Not implemented yet (issue 4): every entry point returns
//! `Unsupported`, so nothing pretends to work.

use railcc_core::{Error, ErrorKind, Result};

/// Always fails until the RDMA transport lands.
pub fn open() -> Result<()> {
    Err(Error::new(
        ErrorKind::Unsupported,
        "the RDMA transport is not implemented yet (issue 4)",
    )
    .transport("rdma"))
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
