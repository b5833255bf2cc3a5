// Gather: {{ count }} rows of {{ row }} elements from a table of {{ rows }} rows, one thread per
// element ({{ threads }} threads; one per index when rows are empty), and the index check in the
// same launch (a second one-thread kernel cost a launch, ~3–6 µs, for a few loads). An index
// outside the table is reported as the interpreter reports it: thread 0 of block 0 scans the
// indices in order and, at the first out-of-range position p, writes `status` = (~p, idx[p])
// (status is zeroed before every run, so 0 means none; no other thread writes it, so no atomics
// and no ordering between blocks are needed). Every thread checks its own index and writes its
// element as NaN (or 0 for integers) instead of memory the table does not own.
extern "C" __global__ void __launch_bounds__(256) {{ entry }}(const {{ ctype }}* __restrict__ table, const {{ itype }}* __restrict__ idx, unsigned long long* __restrict__ status, {{ ctype }}* __restrict__ out) {
    RF_GRID_ENTER();
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i == 0) {
        for (long long q = 0; q < {{ count }}LL; ++q) {
            const long long v = (long long)idx[q];
            if (v < 0 || v >= {{ rows }}LL) {
                status[0] = ~(unsigned long long)q;
                status[1] = (unsigned long long)v;
                break;
            }
        }
    }
    if (i >= {{ threads }}LL) return;
{% if row > 0 %}    const long long p = i / {{ per_index }}LL, e = i % {{ per_index }}LL;
    const long long at = (long long)idx[p];
    const bool ok = at >= 0 && at < {{ rows }}LL;
    out[i] = ok ? table[at * {{ row }}LL + e] : {{ bad }};
{% endif %}}
