//! A count of node visits, so tests can hold the passes and codegen to linear work without
//! timing anything: a pass that scans the whole graph once per node, sorts it again for every
//! rewrite or walks a chain from each of its nodes shows as visits growing with the square of
//! the graph, whatever the machine.
//!
//! The count is per thread (a `Cell`, no atomics), so it costs an increment on the paths it
//! counts and tests running side by side do not see each other's work. It counts what the
//! graph hands out: ids from [`Graph::node_ids`](super::Graph::node_ids) and
//! [`Graph::topo_order`](super::Graph::topo_order), and each read of one node (its op, type,
//! operands, consumers or uses).

use std::cell::Cell;

thread_local! {
    static VISITS: Cell<u64> = const { Cell::new(0) };
}

/// Records `n` node visits on this thread.
#[inline]
pub(super) fn visit(n: u64) {
    VISITS.with(|v| v.set(v.get().wrapping_add(n)));
}

/// Node visits recorded on this thread so far. Take the difference around the work measured.
pub fn node_visits() -> u64 {
    VISITS.with(Cell::get)
}
