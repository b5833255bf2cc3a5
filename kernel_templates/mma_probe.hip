// Matrix-core probe of {{ p }} (tests only): one wave computes C = A·B through the fragment helpers
// alone, with two accumulating MMAs. A is {{ m }}x{{ 2 * k }} row-major; B is {{ 2 * k }}x{{ n }}, given row-major (b, read
// by load_b_kn for the first {{ k }} rows) and transposed (bt, read by load_b_nk for the last {{ k }}); C is
// {{ m }}x{{ n }} f32 row-major. A and B elements are {{ et }} (16-bit patterns, or f32 for the TF32 atoms).
extern "C" __global__ void __launch_bounds__({{ lanes }}) {{ entry }}(const {{ et }}* __restrict__ a, const {{ et }}* __restrict__ b, const {{ et }}* __restrict__ bt, float* __restrict__ c) {
    RF_GRID_ENTER();
    const int lane = threadIdx.x % {{ p }}_LANES;
    {{ p }}_c acc;
    {{ p }}_zero_c(acc);
    {{ p }}_a fa;
    {{ p }}_b fb;
    {{ p }}_load_a(fa, a, 2 * {{ p }}_K, 0, {{ p }}_M, lane);
    {{ p }}_load_b_kn(fb, b, {{ p }}_N, lane);
    {{ p }}_mma(acc, fa, fb);
    {{ p }}_load_a(fa, a + {{ p }}_K, 2 * {{ p }}_K, 0, {{ p }}_M, lane);
    {{ p }}_load_b_nk(fb, bt + {{ p }}_K, 2 * {{ p }}_K, lane);
    {{ p }}_mma(acc, fa, fb);
    {{ p }}_store_c(c, {{ p }}_N, acc, lane);
}
