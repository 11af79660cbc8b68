// The process's asynchronous signals (SIGTERM, SIGINT, ...) delivered to one thread of their own,
// which runs nothing else. oneDNN's f32 GEMM kernels before v3.11.2 (Debian 12 ships 2.6) point the
// stack pointer at a heap buffer while they run, so a handler run on a thread inside one pushes
// its frame into the heap (oneDNN issue #4845). On a CPU without AVX-512 every fp32 product runs
// those kernels: a SIGTERM asking a server to drain, or a run to save, corrupted the heap of the
// process that got it during a product, which aborted in free() later (docs/serving.md).
#pragma once
#include <csignal>

namespace cleave {

// The signals routed: every asynchronous one a handler may be installed for.
sigset_t routed_signals();

// Blocks routed_signals() in the calling thread, which every thread it makes later inherits, and
// starts the thread "cleave-signals", the one that leaves them unblocked: their handlers run there,
// and a signal's default action still ends the whole process. Called first in main, before any
// other thread exists; once per process (later calls do nothing).
void handle_signals_on_own_thread();

}  // namespace cleave
