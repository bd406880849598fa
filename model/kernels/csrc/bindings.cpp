// The Python entry points of every kernel in this folder: one extension module, built once.
// The only file here that includes a torch header with pybind11 in it (<torch/python.h>, the
// conversions between Python tensors and at::Tensor; kernel_api.h says why the kernels do
// not). The kernels below that compute run without the GIL (no_gil): they touch no Python
// object, and in-process the HTTP server's thread runs meanwhile.
#include <torch/python.h>

#include "decode_stack.h"

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache,
                                     torch::Tensor v_cache, torch::Tensor block_tables,
                                     torch::Tensor context_lens, double scale, int64_t window);
torch::Tensor paged_prefill_attention(torch::Tensor q, torch::Tensor k_cache,
                                      torch::Tensor v_cache, torch::Tensor block_table,
                                      int64_t context_len, double scale, int64_t window);
torch::Tensor paged_prefill_attention_chunks(torch::Tensor q, torch::Tensor k_cache,
                                             torch::Tensor v_cache, torch::Tensor block_tables,
                                             torch::Tensor context_lens, torch::Tensor starts,
                                             torch::Tensor lengths, double scale,
                                             int64_t window);
torch::Tensor add_rms_norm(torch::Tensor residual, torch::Tensor delta, torch::Tensor weight,
                           double eps);
void rope_inplace(torch::Tensor qk, int64_t heads, torch::Tensor cos, torch::Tensor sin);
torch::Tensor silu_mul(torch::Tensor gate_up);
torch::Tensor dense_linear(torch::Tensor x, torch::Tensor packed, int64_t n, int64_t threads);
void set_prefetch_bytes(int64_t bytes);
void set_prefetch_one_block(int64_t bytes);
void set_chunk_steps(int64_t steps);
void set_dense_avx2(bool on);
void set_dense_amx(int64_t rows, int64_t chunk_steps);
bool dense_amx_usable();
int64_t dense_amx_calls();
int64_t dense_bf16_fma_blocks();
void set_dense_bf16_fma(int64_t blocks);
double bf16_dot_rate();
bool dense_bf16_dot_is_two_fmas();
double dense_fma_peak(int64_t threads);
void set_dense_row_streams(bool on);
void set_dense_group_bytes(int64_t bytes);
torch::Tensor q4_1_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features);
torch::Tensor q8_0_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features);
torch::Tensor q5_0_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features);
torch::Tensor q4_k_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features);
torch::Tensor q6_k_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features);
torch::Tensor q5_k_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features);
torch::Tensor f16_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features);
torch::Tensor bf16_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features);
void set_quantized_avx2(bool on);
torch::Tensor q4_1_int8act_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features);
torch::Tensor q8_0_int8act_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features);
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> quantize_rows_int8(torch::Tensor x);
torch::Tensor argmax_rows(torch::Tensor logits);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const pybind11::call_guard<pybind11::gil_scoped_release> no_gil;
  m.def("paged_decode_attention", &paged_decode_attention, no_gil,
        "decode attention over the paged KV cache, the last `window` tokens if window > 0 "
        "(model/kernels/csrc/paged_attention_cpu.cpp)",
        pybind11::arg("q"), pybind11::arg("k_cache"), pybind11::arg("v_cache"),
        pybind11::arg("block_tables"), pybind11::arg("context_lens"), pybind11::arg("scale"),
        pybind11::arg("window") = 0);
  m.def("paged_prefill_attention", &paged_prefill_attention, no_gil,
        "causal attention of one prefill chunk over the paged KV cache, read in place "
        "(model/kernels/csrc/paged_prefill_attention_cpu.cpp)",
        pybind11::arg("q"), pybind11::arg("k_cache"), pybind11::arg("v_cache"),
        pybind11::arg("block_table"), pybind11::arg("context_len"), pybind11::arg("scale"),
        pybind11::arg("window") = 0);
  m.def("paged_prefill_attention_chunks", &paged_prefill_attention_chunks, no_gil,
        "paged_prefill_attention for several chunks in one call: chunk c is rows "
        "starts[c]:starts[c]+lengths[c] of q (model/kernels/csrc/paged_prefill_attention_cpu.cpp)",
        pybind11::arg("q"), pybind11::arg("k_cache"), pybind11::arg("v_cache"),
        pybind11::arg("block_tables"), pybind11::arg("context_lens"), pybind11::arg("starts"),
        pybind11::arg("lengths"), pybind11::arg("scale"), pybind11::arg("window") = 0);
  m.def("add_rms_norm", &add_rms_norm, no_gil, "residual += delta; RMSNorm (fused_ops_cpu.cpp)");
  m.def("rope_inplace", &rope_inplace, no_gil, "rotate-half RoPE in place (fused_ops_cpu.cpp)");
  m.def("silu_mul", &silu_mul, no_gil, "silu(gate) * up (fused_ops_cpu.cpp)");
  m.def("dense_linear", &dense_linear, no_gil, "x @ W, W packed in panels (dense_linear.cpp)");
  m.def("q4_1_linear", &q4_1_linear, no_gil, "x @ W^T from Q4_1 codes (quantized_linear_cpu.cpp)");
  m.def("q8_0_linear", &q8_0_linear, no_gil, "x @ W^T from Q8_0 codes (quantized_linear_cpu.cpp)");
  m.def("q5_0_linear", &q5_0_linear, no_gil, "x @ W^T from Q5_0 codes (quantized_linear_cpu.cpp)");
  m.def("q4_k_linear", &q4_k_linear, no_gil,
        "x @ W^T from Q4_K codes, per 32: fp32 scale and min (quantized_linear_cpu.cpp)");
  m.def("q6_k_linear", &q6_k_linear, no_gil,
        "x @ W^T from Q6_K codes, per 16: fp32 scale (quantized_linear_cpu.cpp)");
  m.def("q5_k_linear", &q5_k_linear, no_gil,
        "x @ W^T from Q5_K (or Q5_1) codes, per 32: fp32 scale and min "
        "(quantized_linear_cpu.cpp)");
  m.def("f16_linear", &f16_linear, no_gil, "x @ W^T from fp16 weights (quantized_linear_cpu.cpp)");
  m.def("bf16_linear", &bf16_linear, no_gil,
        "x @ W^T from bfloat16 weights (quantized_linear_cpu.cpp)");
  m.def("q4_1_int8act_linear", &q4_1_int8act_linear, no_gil,
        "x @ W^T from Q4_1 codes, x rounded to int8 per block (q4_1_int8act_cpu.cpp)");
  m.def("q8_0_int8act_linear", &q8_0_int8act_linear, no_gil,
        "x @ W^T from Q8_0 codes, x rounded to int8 per block (q4_1_int8act_cpu.cpp)");
  m.def("quantize_rows_int8", &quantize_rows_int8,
        "x's int8 codes, scales and scaled sums as q4_1_int8act_linear makes them");
  m.def("argmax_rows", &argmax_rows,
        "each row's argmax, first of equals, NaN the largest (argmax_cpu.cpp)");
  // The knobs and what the kernels measured of this CPU, apart from the ops: set once as the
  // module loads (model/kernels/tuning.py), by the start-up autotuner, and by tests/studies.
  auto knobs = m.def_submodule("tuning", "the kernels' knobs and their measurements of this CPU");
  knobs.def("set_prefetch_bytes", &set_prefetch_bytes, "dense_linear tuning knob");
  knobs.def("set_prefetch_one_block", &set_prefetch_one_block,
            "dense_linear tuning knob: the prefetch distance for rows in one row block");
  knobs.def("set_chunk_steps", &set_chunk_steps, "dense_linear tuning knob");
  knobs.def("set_dense_group_bytes", &set_dense_group_bytes,
            "dense_linear: x bytes per row group for many rows (0: one group)");
  knobs.def("set_dense_avx2", &set_dense_avx2,
            "dense_linear: use the AVX2 path even where AVX-512 would run (tests, studies)");
  knobs.def("set_dense_amx", &set_dense_amx,
            "dense_linear: bf16 rows from which AMX runs where the CPU has it (0: never), and its "
            "steps per chunk");
  knobs.def("dense_amx_usable", &dense_amx_usable,
            "dense_linear: does this CPU have AMX (tile, bf16) and may this process use it?");
  knobs.def("dense_amx_calls", &dense_amx_calls,
            "dense_linear: how many products have run on AMX in this process (tests)");
  knobs.def("dense_bf16_fma_blocks", &dense_bf16_fma_blocks,
            "dense_linear: from how many row blocks the AVX-512 path computes bf16 by FMAs on "
            "widened weights (0: never; else by vdpbf16ps)");
  knobs.def("set_dense_bf16_fma", &set_dense_bf16_fma,
            "dense_linear: bf16 by FMAs from this many row blocks (1: always, 0: never, -1: as "
            "chosen for this CPU)");
  knobs.def("bf16_dot_rate", &bf16_dot_rate,
            "vdpbf16ps's multiply-adds per second over FMAs' on this CPU (0: no AVX512_BF16)");
  knobs.def("set_dense_row_streams", &set_dense_row_streams,
            "dense_linear: one row reads several panels side by side (True, the default: 4 with "
            "AVX-512, as many as fit the registers with AVX2) or one after another (the same sums "
            "either way)");
  knobs.def("dense_fma_peak", &dense_fma_peak,
            "GFLOP/s of `threads` threads running independent fp32 FMA chains on registers only "
            "(AVX-512, else AVX2): the fp32 GEMM's instruction peak");
  knobs.def("dense_bf16_dot_is_two_fmas", &dense_bf16_dot_is_two_fmas,
            "does this CPU's vdpbf16ps sum a pair as two fp32 FMAs, k+1 first (Intel's definition)?");
  knobs.def("set_quantized_avx2", &set_quantized_avx2,
            "the quantized matmuls: use the AVX2 copy even where AVX-512 would run (tests, studies)");
  pybind11::class_<DecodeStack>(m, "DecodeStack",
                                "every decoder layer of a decode step in one call "
                                "(decode_stack_cpu.cpp)")
      .def(pybind11::init<int64_t, int64_t, int64_t, double>(), pybind11::arg("heads"),
           pybind11::arg("kv_heads"), pybind11::arg("head_dim"), pybind11::arg("eps"))
      .def("add_layer", &DecodeStack::add_layer)
      .def("num_layers", &DecodeStack::num_layers)
      .def("forward", &DecodeStack::forward, no_gil, pybind11::arg("x"), pybind11::arg("cos"),
           pybind11::arg("sin"), pybind11::arg("slot_mapping"), pybind11::arg("block_tables"),
           pybind11::arg("context_lens"));
}
