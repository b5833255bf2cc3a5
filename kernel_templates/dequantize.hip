{% import "quant_parts.hip" as quant -%}
// Dequantizes a {{ scheme }} weight of {{ elems }} values ({{ blocks }} {% if groups > 1 %}groups of 32, {{ groups }} to a block of {{ block_bytes }} bytes{% else %}blocks of 32{% endif %}; rows are whole blocks, so value
// i is element i % 32 of block i / 32) to {{ ctype }}: one thread per quarter block (8 values). For the readers
// that cannot read blocks (a GEMM past the small-M bound on the matrix cores, a gather, ...); the
// result is a planned workspace, reused once they are done, never a copy kept with the weights.
namespace {{ entry }}_ns {
constexpr long long RF_PIECES = {{ blocks }}LL * 4;
constexpr long long RF_BLOCK_BYTES = {{ block_bytes }};
{{ quant.piece(scheme, groups) }}
}  // namespace {{ entry }}_ns
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const unsigned char* __restrict__ W, {{ ctype }}* __restrict__ out) {
    RF_GRID_ENTER();
    using namespace {{ entry }}_ns;
    const long long t = (long long)blockIdx.x * {{ threads }} + threadIdx.x;
    if (t >= RF_PIECES) return;
    const long long blk = t >> 2;
    const int q = (int)(t & 3);
    float v[8];
    rf_dequant_piece({% if groups > 1 %}W + (blk / {{ groups }}) * RF_BLOCK_BYTES, (int)(blk % {{ groups }}){% else %}W + blk * RF_BLOCK_BYTES{% endif %}, q, v);
    const long long k0 = blk * 32 + 4 * q;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[k0 + i] = {{ store_pre }}v[i]{{ store_post }};
        out[k0 + 16 + i] = {{ store_pre }}v[4 + i]{{ store_post }};
    }
}
