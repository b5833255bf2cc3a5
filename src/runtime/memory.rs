//! Memory accounting per device: bytes in use, the peak, and an optional budget that makes an
//! over-budget allocation a typed error instead of an out-of-memory crash.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::error::RuntimeError;

#[derive(Debug, Default)]
pub struct MemoryCounter {
    in_use: AtomicUsize,
    peak: AtomicUsize,
    /// 0 means no budget.
    budget: AtomicUsize,
    /// Allocations ever reserved (refused ones included): a warm session's run adds none.
    allocations: AtomicUsize,
}

impl MemoryCounter {
    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::SeqCst)
    }

    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// How many allocations were ever asked of this device (refused ones included).
    pub fn allocations(&self) -> usize {
        self.allocations.load(Ordering::SeqCst)
    }

    pub fn set_budget(&self, bytes: Option<usize>) {
        self.budget.store(bytes.unwrap_or(0), Ordering::SeqCst);
    }

    /// Accounts `bytes` before they are allocated; refused when the budget would be exceeded.
    pub fn reserve(&self, bytes: usize) -> Result<(), RuntimeError> {
        self.allocations.fetch_add(1, Ordering::SeqCst);
        let budget = self.budget.load(Ordering::SeqCst);
        let mut cur = self.in_use.load(Ordering::SeqCst);
        loop {
            let next = cur.saturating_add(bytes);
            if budget != 0 && next > budget {
                return Err(RuntimeError::OverBudget {
                    requested: bytes,
                    in_use: cur,
                    budget,
                });
            }
            match self
                .in_use
                .compare_exchange(cur, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::SeqCst);
                    return Ok(());
                }
                Err(actual) => cur = actual,
            }
        }
    }

    pub fn release(&self, bytes: usize) {
        self.in_use.fetch_sub(bytes, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_refuses_and_recovers() {
        let m = MemoryCounter::default();
        m.set_budget(Some(100));
        m.reserve(60).unwrap();
        assert!(matches!(
            m.reserve(50),
            Err(RuntimeError::OverBudget {
                requested: 50,
                in_use: 60,
                budget: 100
            })
        ));
        m.release(60);
        m.reserve(100).unwrap();
        assert_eq!((m.in_use(), m.peak()), (100, 100));
        assert_eq!(m.allocations(), 3);
    }
}
