//! Tables of staging-kernel entries in mapped host memory (`RAILCC_GPU_NET_TABLE=1`): a large
//! call's launch writes its pieces and segments into a table and passes the kernel a header
//! alone, instead of kilobytes of parameter (`netcopy::TABLE`).
//!
//! A table is leased to one call (`Lease`, kept in the call) and free again when the call is
//! dropped: the progress thread drops a call once every piece of it has started, and a block
//! of the kernel starts a piece only after it copied its launch's entries into shared memory
//! (a block with no piece never reads them). No table free: the call passes its entries in
//! the parameter, as without tables; nothing waits. Once the engine breaks, the progress
//! thread drops calls whose pieces have not all started (their launches may still be ahead
//! on a stream): it closes the tables first, so no table is handed out again.

use parking_lot::Mutex;
use railcc_core::Result;
use railcc_cuda::hostsync::{Ctx, Flags};
use std::sync::Arc;

/// Tables per engine: calls whose pieces have not all started yet hold one each (or more
/// for calls of more entries than a table holds).
pub const TABLES: usize = 8;

pub struct Tables {
    mem: Flags,
    /// Entries (16 bytes, 4 words) a table holds.
    entries: usize,
    free: Mutex<Free>,
}

#[derive(Default)]
struct Free {
    list: Vec<usize>,
    /// No table is handed out or given back any more (`Tables::close`).
    closed: bool,
}

/// One table, the call's until dropped.
pub struct Lease {
    tables: Arc<Tables>,
    index: usize,
}

impl Tables {
    pub fn new(ctx: &Ctx, count: usize, entries: usize) -> Result<Arc<Tables>> {
        Ok(Arc::new(Tables {
            mem: Flags::new(ctx, count * entries * 4)?,
            entries,
            free: Mutex::new(Free {
                list: (0..count).rev().collect(),
                closed: false,
            }),
        }))
    }

    pub fn entries(&self) -> usize {
        self.entries
    }

    /// No table is handed out again, and none given back: calls dropped from now on may have
    /// launches still ahead on a stream, which read their tables when they start.
    pub fn close(&self) {
        self.free.lock().closed = true;
    }

    /// `n` tables, all or none (a call's launches use them in order); none once closed.
    pub fn take(self: &Arc<Self>, n: usize) -> Vec<Lease> {
        let taken = self.free.lock().take(n);
        (taken.into_iter())
            .map(|index| Lease {
                tables: self.clone(),
                index,
            })
            .collect()
    }
}

impl Lease {
    /// The table's device address.
    pub fn dev_ptr(&self) -> Result<u64> {
        self.tables
            .mem
            .dev_ptr(self.index * self.tables.entries * 4)
    }

    /// Writes a launch's entries (at most a table's) into the table.
    pub fn write(&self, words: &[u32]) -> Result<()> {
        let t = &self.tables;
        if words.len() > t.entries * 4 {
            return Err(railcc_core::Error::invalid(format!(
                "gpu net: {} entries for a table of {}",
                words.len() / 4,
                t.entries
            )));
        }
        // SAFETY: this lease's table is its call's alone; the call's launch is enqueued after
        // this write, and no launch of an earlier holder reads it any more (module docs).
        unsafe { t.mem.write(self.index * t.entries * 4, words) }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.tables.free.lock().give_back(self.index);
    }
}

impl Free {
    fn take(&mut self, n: usize) -> Vec<usize> {
        if n == 0 || self.closed || self.list.len() < n {
            return Vec::new();
        }
        let at = self.list.len() - n;
        self.list.drain(at..).rev().collect()
    }

    fn give_back(&mut self, i: usize) {
        if !self.closed {
            self.list.push(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Free;

    #[test]
    fn tables_go_all_or_none_and_never_again_once_closed() {
        let mut f = Free {
            list: (0..4).rev().collect(),
            closed: false,
        };
        assert_eq!(f.take(3), [0, 1, 2]);
        // One left: a call of two gets none and takes nothing.
        assert!(f.take(2).is_empty());
        assert!(f.take(0).is_empty());
        f.give_back(1);
        assert_eq!(f.take(2), [1, 3]);
        // Closed: given back tables stay out (a launch may still read them), none handed out.
        f.give_back(0);
        f.closed = true;
        f.give_back(2);
        assert!(f.take(1).is_empty());
        assert_eq!(f.list, [0]);
    }
}
