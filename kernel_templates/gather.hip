// Gather: {{ count }} rows of {{ row }} elements from a table of {{ rows }} rows. An index outside
// the table writes NaN (or 0 for integers), so the result fails verification instead of reading
// memory it does not own.
extern "C" __global__ void __launch_bounds__(256) {{ entry }}(const {{ ctype }}* __restrict__ table, const {{ itype }}* __restrict__ idx, {{ ctype }}* __restrict__ out) {
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i >= {{ n }}LL) return;
    const long long at = (long long)idx[i / {{ row }}LL];
    out[i] = (at >= 0 && at < {{ rows }}LL) ? table[at * {{ row }}LL + i % {{ row }}LL] : {{ bad }};
}
