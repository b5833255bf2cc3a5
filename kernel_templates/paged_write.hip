// Paged cache write, in place: values [{{ b }}, {{ hkv }}, {{ s }}, {{ d }}] into the pool [., {{ hkv }}, {{ block_size }}, {{ d }}] at the slots
// `slots` [{{ b }}, {{ s }}] names (slot = block * {{ block_size }} + row). One thread per value element ({{ n }}). A negative slot is
// padding and a slot at or past {{ capacity }} (outside the pool) is skipped: nothing is written outside the pool (the
// interpreter reports such a slot; the block pool never hands one out). Of two rows naming one slot the later in
// (sequence, row) order is written, as the interpreter does: a thread writes only when no later row names its slot.
extern "C" __global__ void __launch_bounds__(256) {{ entry }}(const {{ ctype }}* __restrict__ values, const int* __restrict__ slots, {{ ctype }}* __restrict__ pool) {
    RF_GRID_ENTER();
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i >= {{ n }}LL) return;
    // i splits into (sequence, head, row, column) of the values.
    const int c = (int)(i % {{ d }}), si = (int)((i / {{ d }}) % {{ s }}), h = (int)((i / {{ d * s }}) % {{ hkv }});
    const int bi = (int)(i / {{ d * s * hkv }}LL);
    const int r = bi * {{ s }} + si;
    const int slot = slots[r];
    if (slot < 0 || (long long)slot >= {{ capacity }}LL) return;
    for (int later = r + 1; later < {{ b * s }}; ++later)
        if (slots[later] == slot) return;
    const long long block = slot / {{ block_size }}, row = slot % {{ block_size }};
    pool[((block * {{ hkv }} + h) * {{ block_size }} + row) * {{ d }} + c] = values[i];
}
