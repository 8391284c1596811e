// Python bindings: the ops, and what the extension was built against and runs on.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "amx.h"
#include "huge_pages.h"
#include "kernels.h"
#include "matmul.h"
#include "mlx/version.h"
#include "primitives.h"
#include "threads.h"

namespace nb = nanobind;
using namespace nb::literals;

#define EXO_STR2(x) #x
#define EXO_STR(x) EXO_STR2(x)

NB_MODULE(_kernels, m) {
  m.doc() = "exo-tui's CPU matmul kernels as MLX primitives";
  // The MLX release whose headers this was compiled against: MLX's C++ ABI is not stable, so
  // the Python side refuses the extension under any other release.
  m.attr("built_for_mlx") = EXO_STR(MLX_VERSION_MAJOR) "." EXO_STR(MLX_VERSION_MINOR) "." EXO_STR(
      MLX_VERSION_PATCH);
  m.def("quantized_matmul", &exo_kernels::quantized_matmul, "x"_a, "w"_a, "scales"_a,
        "biases"_a.none(), "group_size"_a, "bits"_a, "mode"_a = "affine", nb::kw_only(),
        "stream"_a = nb::none(),
        "x @ dequantize(w, scales, biases).T for MLX's affine 4- and 8-bit weights and MXFP4");
  m.def("gather_quantized_matmul", &exo_kernels::gather_quantized_matmul, "x"_a, "w"_a,
        "scales"_a, "biases"_a.none(), "indices"_a, "group_size"_a, "bits"_a, "mode"_a = "affine",
        nb::kw_only(), "stream"_a = nb::none(),
        "mx.gather_qmm(x, w, scales, biases, rhs_indices=indices, transpose=True): the experts' "
        "products of a mixture of experts");
  m.def("gather_joint_max_rows", [] { return exo_kernels::gather_joint_max_rows; });
  m.def("set_gather_joint_max_rows", [](int rows) { exo_kernels::gather_joint_max_rows = rows; },
        "rows"_a);
  m.def("dense_matmul", &exo_kernels::dense_matmul, "x"_a, "w"_a, nb::kw_only(),
        "stream"_a = nb::none(), "x @ w.T for bfloat16, float16 or float32 weights");
  m.def("rms_norm", &exo_kernels::rms_norm, "x"_a, "w"_a, "eps"_a, nb::kw_only(),
        "stream"_a = nb::none(), "mx.fast.rms_norm(x, w, eps) for x and w of one float type");
  m.def("rope", &exo_kernels::rope, "x"_a, "inv_freqs"_a, "offset"_a, "dims"_a, "traditional"_a,
        "scale"_a, nb::kw_only(), "stream"_a = nb::none(),
        "mx.fast.rope with its inverse frequencies given, rounded as MLX's CPU fallback rounds");
  m.def("logsumexp_last", &exo_kernels::logsumexp_last, "x"_a, nb::kw_only(),
        "stream"_a = nb::none(), "mx.logsumexp(x, axis=-1, keepdims=True)");
  m.def("argmax_last", &exo_kernels::argmax_last, "x"_a, nb::kw_only(), "stream"_a = nb::none(),
        "mx.argmax(x, axis=-1), as uint32");
  m.def("silu_mul", &exo_kernels::silu_mul, "gate"_a, "x"_a, nb::kw_only(), "stream"_a = nb::none(),
        "silu(gate) * x (mlx-lm's swiglu), rounded as MLX's ops round each step");
  m.def("decode_attention", &exo_kernels::decode_attention, "q"_a, "k"_a, "v"_a, "scale"_a,
        "mask"_a = nb::none(), "sinks"_a = nb::none(), nb::kw_only(), "stream"_a = nb::none(),
        "softmax(scale * q @ k.T + mask) @ v, for decoding's few query rows a head (with a "
        "sink logit a head where `sinks` is given)");
  m.def("back_with_huge_pages", &exo_kernels::back_with_huge_pages, "arrays"_a,
        nb::call_guard<nb::gil_scoped_release>(),
        "Put the evaluated arrays' memory on transparent huge pages (Linux); the bytes moved");
  m.def("isa", [] { return std::string(exo_kernels::best_isa().name); },
        "The instruction set the kernels run with on this CPU");
  m.def("isa_supported", [](const std::string& name) {
    return exo_kernels::isa_supported(name.c_str());
  });
  m.def("use_isa", [](const std::string& name) { return exo_kernels::use_isa(name.c_str()); },
        "name"_a, "Run the named instruction set's kernels from now on (False: not on this CPU)");
  m.def("amx", [] { return exo_kernels::amx_enabled && exo_kernels::amx_available(); },
        "Whether bf16 products of many rows run on AMX tiles");
  m.def("set_amx", [](bool on) { exo_kernels::amx_enabled = on; }, "on"_a);
  m.def("set_amx_min_rows", [](int rows) { exo_kernels::amx_min_rows = rows; }, "rows"_a);
  m.def("amx_small_min_rows", [] { return exo_kernels::amx_small_min_rows; });
  m.def("set_amx_small_min_rows", [](int rows) { exo_kernels::amx_small_min_rows = rows; },
        "rows"_a);
  m.def("amx_int8", [] { return exo_kernels::amx_enabled && exo_kernels::amx_int8_available(); },
        "Whether a few rows of bf16 x by 4-bit weights run on AMX's 8-bit tiles");
  m.def("amx_int8_min_rows", [] { return exo_kernels::amx_int8_min_rows; });
  m.def("set_amx_int8_min_rows", [](int rows) { exo_kernels::amx_int8_min_rows = rows; },
        "rows"_a);
  m.def("int8_min_rows", [] { return exo_kernels::int8_min_rows; });
  m.def("set_int8_min_rows", [](int rows) { exo_kernels::int8_min_rows = rows; }, "rows"_a);
  m.def("threads", &exo_kernels::thread_count);
  m.def("set_threads", &exo_kernels::set_thread_count, "threads"_a);
  m.def("gemv_max_rows", [] { return exo_kernels::gemv_max_rows; });
  m.def("set_gemv_max_rows", [](int rows) { exo_kernels::gemv_max_rows = rows; }, "rows"_a);
}
