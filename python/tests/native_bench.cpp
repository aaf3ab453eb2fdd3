// The cost of a cache-hit pair (allocate 4 KiB, free it) through the C++
// allocator for torch against the C functions it calls, on the simulated
// device (CACHEALLOC_BACKEND=mock). Not a test: see BENCHMARKS.md.
#include "../cachealloc/native/allocator.cpp"
#include <chrono>
#include <cstdio>
int main() {
    auto& self = *cachealloc_torch::instance();
    c10::cuda::CUDACachingAllocator::CUDAAllocator& a = self;
    a.init(1);
    auto s = reinterpret_cast<cudaStream_t>(0);
    const int N = 2000000;
    for (int i = 0; i < 1000; i++) a.raw_delete(self.alloc(4096, 0, s));
    for (int round = 0; round < 3; round++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < N; i++) a.raw_delete(self.alloc(4096, 0, s));
        auto t1 = std::chrono::steady_clock::now();
        for (int i = 0; i < N; i++) cachealloc_free(cachealloc_alloc(4096, 0, s), 0, 0, s);
        auto t2 = std::chrono::steady_clock::now();
        double cpp = std::chrono::duration<double, std::nano>(t1 - t0).count() / N;
        double c = std::chrono::duration<double, std::nano>(t2 - t1).count() / N;
        std::printf("pair: C++ allocator object %.1f ns, C functions %.1f ns\n", cpp, c);
    }
}
