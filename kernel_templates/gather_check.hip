// After a gather: the index at its first out-of-range position, next to the position, so the
// error names the index as the interpreter's does. One thread.
extern "C" __global__ void __launch_bounds__(1) {{ entry }}(const {{ itype }}* __restrict__ idx, unsigned long long* __restrict__ status) {
    RF_GRID_ENTER();
    if (status[0] != 0) status[1] = (unsigned long long)(long long)idx[~status[0]];
}
