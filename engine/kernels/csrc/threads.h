// A small pool that splits a kernel's output rows among the cores this process may use.
#pragma once

#include <cstddef>
#include <functional>

namespace exo_kernels {

// Runs body(part) for part in [0, parts), in parallel, and returns when all are done. The calling
// thread takes a share. A call made while another call runs (a second MLX stream) runs inline.
void parallel_for(int parts, const std::function<void(int)>& body);
int thread_count();
// How many parts (up to `most`) a job that reads `bytes` splits into: one below a size where
// waking another thread costs more than it saves (a small model's products, one row's attention).
int work_parts(std::size_t bytes, long most);
void set_thread_count(int threads);

}  // namespace exo_kernels
