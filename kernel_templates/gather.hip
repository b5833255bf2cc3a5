// Gather: {{ count }} rows of {{ row }} elements from a table of {{ rows }} rows, one thread per
// element ({{ threads }} threads; one per index when rows are empty). An index outside the table
// is reported as the interpreter reports it: the thread of the row's first element records the
// smallest failing position in `status` (its complement, by atomicMax, so 0 means none), and the
// row is written with NaN (or 0 for integers) instead of memory the table does not own.
extern "C" __global__ void __launch_bounds__(256) {{ entry }}(const {{ ctype }}* __restrict__ table, const {{ itype }}* __restrict__ idx, unsigned long long* __restrict__ status, {{ ctype }}* __restrict__ out) {
    RF_GRID_ENTER();
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i >= {{ threads }}LL) return;
    const long long p = i / {{ per_index }}LL, e = i % {{ per_index }}LL;
    const long long at = (long long)idx[p];
    const bool ok = at >= 0 && at < {{ rows }}LL;
    if (!ok && e == 0) atomicMax(&status[0], ~(unsigned long long)p);
{% if row > 0 %}    out[i] = ok ? table[at * {{ row }}LL + e] : {{ bad }};
{% endif %}}
