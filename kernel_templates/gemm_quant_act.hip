{% import "gemm_parts.hip" as parts -%}
{% import "quant_parts.hip" as quant -%}
// The activations of a decode GEMV with 8-bit activations ({{ scheme }} weight, the node's second kernel: gemm_quant),
// quantized once for its whole grid: {{ p.batch }} × [{{ p.m }}, {{ p.k }}] of A read in place through its view{% if p.prologue %}, each row
// {{ "LayerNorm" if p.prologue.layer else "RMSNorm" }}-normalised first (the folded norm: its statistics per row, then every value mapped){% endif %}, written to
// WS as an int8 per value (batch bz's rows from byte bz·M·K) and, after every batch's values, per 32 values
// the scale d = max|x| / 127 and the sum d·Σq of the rounded values (two floats, batch bz's from pair
// bz·M·K / 32). Block x of batch bz takes runs of 8 values x·{{ threads }}·{{ runs_in_flight }}.. (a thread up to {{ runs_in_flight }} of them),
// the 4 threads of a group meet by shuffles{% if p.prologue %}; every block computes its batch's row statistics{% endif %}. A non-finite
// value makes its group's scale NaN. The rounding is the per-block stage's of the single-kernel GEMV (the
// same macro), so both forms compute the same values.
namespace {{ entry }}_ns {
constexpr int RF_M = {{ p.m }};
constexpr int RF_K = {{ p.k }};
constexpr int RF_THREADS = {{ threads }};
constexpr int RF_RUNS = RF_M * RF_K / 8;
constexpr int RF_RUNS_IN_FLIGHT = {{ runs_in_flight }};
constexpr long long RF_DS_AT = {{ ds_at }}LL;
{{ parts.views(p) }}
{{ parts.norm_helpers(p) }}{{ quant.act_types() }}
{{ quant.act_quantize(p) }}
}  // namespace {{ entry }}_ns
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ entry }}(const {{ p.a_t }}* __restrict__ A, {{ parts.norm_params(p) }}float* __restrict__ WS) {
    RF_GRID_ENTER();
    using namespace {{ entry }}_ns;
    const long long bz = blockIdx.y;
{{ parts.norm_stats(p, "    ") }}    const int first = (int)blockIdx.x * RF_THREADS * RF_RUNS_IN_FLIGHT;
    const int last = first + RF_THREADS * RF_RUNS_IN_FLIGHT < RF_RUNS ? first + RF_THREADS * RF_RUNS_IN_FLIGHT : RF_RUNS;
    rf_quantize_a(A, bz, first, last, (rf_i2*)WS + bz * RF_RUNS, (rf_f2*)(WS + RF_DS_AT) + bz * (RF_M * RF_K / 32){% if p.prologue %}, rf_norm, NW{% if p.prologue.layer %}, NB{% endif %}{% endif %});
}
